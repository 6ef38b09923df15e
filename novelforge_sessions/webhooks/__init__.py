"""Signed webhooks, per project, delivered from the event log (docs/webhooks.md).

``models``: endpoints, deliveries, the sender's cursor. ``signing``: Standard Webhooks
signatures. ``addresses``: which destinations may be called (no private addresses unless
``WEBHOOK_ALLOW_PRIVATE``). ``endpoints``: the writes the API makes (register, rotate, delete,
redeliver). ``sender``: ``manage.py send_webhooks`` — scan the log, deliver due attempts.
"""
