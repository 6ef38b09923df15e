"""The shared HTTP kit of the agent API, below every app's routes.

* :mod:`~novelforge_sessions.apikit.base` — the one ``NinjaAPI`` (no routes of its own), its
  parser and its one error shape;
* :mod:`~novelforge_sessions.apikit.auth` — bearer tokens (``TokenAuth``, ``caller_for_token``);
* :mod:`~novelforge_sessions.apikit.common` — declared errors, pagination, lookups;
* :mod:`~novelforge_sessions.apikit.schemas` — body parsing and the generic schemas.

Apps mount their routers in :mod:`novelforge_sessions.routers`.
"""
