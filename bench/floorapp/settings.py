"""The project's settings (same database, pool, middleware), with the floor's URLconf only."""
from novelforge_sessions.settings import *  # noqa: F401,F403

ROOT_URLCONF = "floorapp.urls"
