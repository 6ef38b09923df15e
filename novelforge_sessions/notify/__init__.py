"""Email to the people a wait names, from the event log (docs/notifications.md).

``models``: each person's preference and batching state, the notices waiting to be mailed, the
mailer's cursor. ``mailer``: ``manage.py send_notifications`` — scan the log into notices, then
mail each person at most once per ``NOTIFY_BATCH_MINUTES``. The preference page is ``dashboard/notifications.py``.
"""
