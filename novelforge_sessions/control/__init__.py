"""The control plane (docs/model.md#the-control-plane): everything between a run and the outside world.

Records (``models``): handoffs under leases, result deliveries, validations, consume-once
receipts, write intents and approvals, and the history of authority changes. Behaviour, beside
them: ``handoffs`` (freeze, claim, renew, cancel), ``results`` (deliver → validate → consume
once, conflicts), ``intents`` (compare-and-swap writes with approvals), ``bindings`` (binding
invalidation, mark-stale), ``routing`` (live runtimes by capability), ``checkpoints`` (bounded
checkpoints whose typed refs are resolved here), ``waits`` (what a run waits on, a registry
other apps add kinds to), ``resume`` (the revalidation act, docs/model.md#resume).

``service`` is the ONE public interface for the layers above (``reviews``); the API edge calls
the action modules directly. The control plane imports nothing from ``reviews``
(import-linter contract in ``pyproject.toml``, run by ``tests/test_layers.py``).
"""
