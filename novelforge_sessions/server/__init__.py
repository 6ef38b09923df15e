"""The ASGI server's own code: every live patch of daphne, Twisted and autobahn (``patches.py``,
one ``install()``), the daphne request with body limits (``http.py``), the SIGTERM drain
(``drain.py``) and the refusal of a Host outside ``ALLOWED_HOSTS`` (``hosts.py``)."""
from novelforge_sessions.server.patches import install

__all__ = ["install"]
