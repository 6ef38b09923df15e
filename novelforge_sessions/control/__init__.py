"""The control plane (contract §08, §11): handoffs under leases, result deliveries, validations,
consume-once receipts, write intents and approvals, and the history of authority changes.

Models only; the writes live in ``novelforge_sessions/actions`` (handoffs, results, intents,
bindings, routing) like every other action family.
"""
