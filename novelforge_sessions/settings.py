"""Settings, read from the environment (12-factor) and strict about bad values.

Every variable has a default that serves local development; a value that is present but
malformed (``DEBUG=maybe``, a ``DATABASE_URL`` that is not PostgreSQL) stops start-up with
``ImproperlyConfigured`` instead of running with a surprise.
"""
from __future__ import annotations

import re
from pathlib import Path

import environ
from csp.constants import NONCE, NONE, SELF
from django.core.checks.security.base import (
    SECRET_KEY_INSECURE_PREFIX, SECRET_KEY_MIN_LENGTH, SECRET_KEY_MIN_UNIQUE_CHARACTERS,
)
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

# Templates and static files: one rule. They live in the checkout's top-level templates/ and static/;
# an installed (non-editable) package carries copies of both as package data in
# novelforge_sessions/_site/ (pyproject.toml maps them there). So: the package's _site/ when it exists
# (an installed package), else the checkout beside the package (a checkout, or an editable install).
_PACKAGED_SITE = Path(__file__).resolve().parent / "_site"
SITE_DIR = _PACKAGED_SITE if _PACKAGED_SITE.is_dir() else BASE_DIR


class _LiteralEnv(environ.Env):
    """``environ.Env`` with every value taken as written. django-environ reads a value that starts
    with ``$`` as the name of another variable (and, that one unset, the default): a generated
    ``SECRET_KEY`` starts with ``$`` once in 50, and a password or token may too, so such a value
    is parsed here as it stands (``Env.parse_value``), never looked up."""

    def get_value(self, var, cast=None, default=environ.Env.NOTSET, parse_default=False):
        raw = self.ENVIRON.get(f"{self.prefix}{var}")
        if isinstance(raw, str) and raw.startswith("$"):
            return raw if cast is None else self.parse_value(raw, cast)
        return super().get_value(var, cast=cast, default=default, parse_default=parse_default)


env = _LiteralEnv()


def _strict_bool(name: str, default: bool) -> bool:
    raw = env.str(name, default="")
    if raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false/1/0), got {raw!r}")


def _strict_int(name: str, default: int, minimum: int = 0) -> int:
    raw = env.str(name, default="")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from exc
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    return value


DEBUG = _strict_bool("DEBUG", default=False)
# The development default is long enough for Django's own check; `check --deploy` warns about it
# by name (novelforge_sessions.W001, checks.py).
_DEV_SECRET = "insecure-development-key-change-me-0123456789abcdefghijklmnopqrstuvwxyz"
SECRET_KEY = env.str("SECRET_KEY", default=_DEV_SECRET)
if SECRET_KEY == _DEV_SECRET and not DEBUG and _strict_bool("REQUIRE_SECRET_KEY", default=False):
    raise ImproperlyConfigured("SECRET_KEY must be set when REQUIRE_SECRET_KEY is true")
# One rule, Django's own (`check --deploy`, security.W009): at least 50 characters, at least 5
# different ones, no "django-insecure-" prefix. `python -m django generate_secret_key` prints one.
if (len(SECRET_KEY) < SECRET_KEY_MIN_LENGTH or len(set(SECRET_KEY)) < SECRET_KEY_MIN_UNIQUE_CHARACTERS
        or SECRET_KEY.startswith(SECRET_KEY_INSECURE_PREFIX)):
    raise ImproperlyConfigured(
        f"SECRET_KEY must be at least {SECRET_KEY_MIN_LENGTH} characters long, with at least "
        f"{SECRET_KEY_MIN_UNIQUE_CHARACTERS} different characters and no {SECRET_KEY_INSECURE_PREFIX!r} prefix "
        "(`python -m django generate_secret_key` prints one)"
    )
SECRET_KEY_IS_DEVELOPMENT_DEFAULT = SECRET_KEY == _DEV_SECRET  # `check --deploy` warns (checks.py)

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "daphne",  # first: of the apps that define runserver the first listed wins, and daphne's is the ASGI one
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "csp",  # django-csp: the Content-Security-Policy header, per-response nonces
    "ninja",  # its templates and static files: /api/docs serves Swagger UI locally, not from a CDN
    "novelforge_sessions",
    "novelforge_sessions.control",
    "novelforge_sessions.webhooks",
    "novelforge_sessions.notify",
    "reviews",
]

MIDDLEWARE = [
    "novelforge_sessions.unavailable.DatabaseUnavailableMiddleware",  # pages: a 503 page when PostgreSQL is gone
    "django.middleware.security.SecurityMiddleware",
    "novelforge_sessions.health.probes",  # /healthz, /readyz: answered whatever the Host (health.py)
    "novelforge_sessions.middleware.CSPMiddleware",  # django-csp's, plus the websocket origin
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # the pages' language: the switcher's cookie, else the browser's Accept-Language, else English
    # (docs/pages.md#language). Not in API_MIDDLEWARE: the API answers in English, codes unchanged.
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# The agent API (/api/v1/) is served by its own lean ASGI path (novelforge_sessions/api/asgi.py):
# one hop into a fixed pool of API_THREADS threads with persistent connections, and only the
# middleware an API response needs (no sessions, CSRF, auth, messages or WhiteNoise: the API is
# token-authenticated and csrf-exempt; request bodies are bounded before either path, by
# bodylimit.BodyLimitMiddleware in asgi.py). API_LEAN=false serves it through MIDDLEWARE instead.
API_MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "novelforge_sessions.middleware.ApiCSPMiddleware",  # the same header, built once per host
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
API_LEAN = _strict_bool("API_LEAN", default=True)
API_THREADS = _strict_int("API_THREADS", default=4, minimum=1)

# The harness's test-only fault hook (novelforge_sessions/faults.py): read from the environment
# once, here, and never from a request. Refused outright with a deployment's own SECRET_KEY or
# REQUIRE_SECRET_KEY=true, so it can only run with the public development key.
FAULT_POINTS = []
_FAULT_SPEC = env.str("NOVELFORGE_FAULT_POINTS", default="").strip()
if _FAULT_SPEC:
    from novelforge_sessions import faults as _faults

    if not SECRET_KEY_IS_DEVELOPMENT_DEFAULT or _strict_bool("REQUIRE_SECRET_KEY", default=False):
        raise ImproperlyConfigured(
            "NOVELFORGE_FAULT_POINTS is a test-only hook: refused with a deployment's SECRET_KEY or REQUIRE_SECRET_KEY=true"
        )
    try:
        FAULT_POINTS = _faults.parse(_FAULT_SPEC)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None
    MIDDLEWARE.insert(0, "novelforge_sessions.faults.FaultMiddleware")
    API_MIDDLEWARE.insert(0, "novelforge_sessions.faults.FaultMiddleware")

ROOT_URLCONF = "novelforge_sessions.urls"
ASGI_APPLICATION = "novelforge_sessions.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [SITE_DIR / "templates"],  # first: overrides the apps' templates (registration/)
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "csp.context_processors.nonce",  # {{ CSP_NONCE }}
            ],
        },
    },
]

_DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/novelforge"
try:
    _db = env.db_url("DATABASE_URL", default=_DEFAULT_DB)
except Exception as exc:  # environ raises several types for a malformed URL
    raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from exc
if _db.get("ENGINE") != "django.db.backends.postgresql":
    raise ImproperlyConfigured(
        f"DATABASE_URL must point at PostgreSQL (postgres://...), got engine {_db.get('ENGINE')!r}"
    )
# Under ASGI every sync view runs in a worker thread; persistent per-thread connections
# pile up (a thread outlives its request and nothing else closes its connection), so
# connections are closed at the end of each request by default —
# or, with DB_POOL_MAX_SIZE > 0, returned to psycopg's pool (Django ≥ 5.1), which saves a
# connection start-up (a transaction of its own on the server) on every request. The lean API
# path's API_THREADS fixed threads are the exception: each keeps its connection for its life
# (novelforge_sessions/api/asgi.py), so with the pool they hold API_THREADS of its connections.
_db["CONN_MAX_AGE"] = _strict_int("DB_CONN_MAX_AGE", default=0)
_db.setdefault("OPTIONS", {})
_db["OPTIONS"].setdefault("connect_timeout", 5)
# Every connection starts with these server settings (libpq's `options`, no round trip), each
# unless DATABASE_URL's own `options` sets it:
# - TimeZone=UTC, so Django need not send `SET TIME ZONE` on each new one;
# - plan_cache_mode=force_generic_plan: a prepared statement (only the one-statement writes of
#   novelforge_sessions/commit.py are prepared; the ORM's queries never are) is planned once per
#   connection. Left to choose, PostgreSQL planned the graph routes' resolve and write
#   statements again on every execution (their parameters are arrays it cannot cost generically),
#   which was most of their database CPU. Their generic plans are index probes whatever the
#   values (tests/control/test_graph_write_plans.py checks the generic plans themselves).
SERVER_SETTINGS = {"TimeZone": "UTC", "plan_cache_mode": "force_generic_plan"}
_options = _db["OPTIONS"].get("options", "")
_db["OPTIONS"]["options"] = " ".join(
    [_options] * bool(_options)
    + [f"-c {name}={value}" for name, value in SERVER_SETTINGS.items() if f"{name}=" not in _options])
# The one-statement writes (novelforge_sessions/commit.py) are prepared on a connection after
# DB_PREPARE_THRESHOLD executions (psycopg's prepare_threshold; 0: on the first): they cost
# PostgreSQL more to plan than to run. "none" turns preparing off, for a pooler in transaction
# mode that cannot keep a connection's prepared statements. The ORM's queries are never prepared.
_PREPARE = env.str("DB_PREPARE_THRESHOLD", default="0").strip().lower()
if _PREPARE != "none" and not (_PREPARE.isdigit() and int(_PREPARE) <= 1000):
    raise ImproperlyConfigured(f"DB_PREPARE_THRESHOLD must be a whole number from 0 to 1000, or none; got {_PREPARE!r}")
_db["OPTIONS"].setdefault("prepare_threshold", None if _PREPARE == "none" else int(_PREPARE))
DB_POOL_MAX_SIZE = _strict_int("DB_POOL_MAX_SIZE", default=0)
if DB_POOL_MAX_SIZE:
    if _db["CONN_MAX_AGE"]:
        raise ImproperlyConfigured("DB_POOL_MAX_SIZE and DB_CONN_MAX_AGE cannot be combined")
    # CONN_HEALTH_CHECKS: with the pool, Django passes psycopg's `check` — a connection is tested
    # (one empty query) as it leaves the pool, so one that PostgreSQL dropped while it sat idle
    # (a restart, pg_terminate_backend) is replaced rather than handed to a request that would
    # fail on it (measured by the harness, harness/ and docs/guarantees.md).
    _db["CONN_HEALTH_CHECKS"] = True
    _db["OPTIONS"]["pool"] = {"min_size": 1, "max_size": DB_POOL_MAX_SIZE, "timeout": 10}
    if API_LEAN and DB_POOL_MAX_SIZE <= API_THREADS:
        raise ImproperlyConfigured(
            f"DB_POOL_MAX_SIZE ({DB_POOL_MAX_SIZE}) must exceed API_THREADS ({API_THREADS}): each API thread "
            "holds one pooled connection for its life, and pages and websockets need the rest"
        )
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", default="")
if REDIS_URL:
    if not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(f"REDIS_URL must be a redis:// URL, got {REDIS_URL!r}")
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    # One process: the in-memory layer is enough. The layer is only a wake-up; the Event
    # table is the record and sockets replay from it.
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

# The pages in English (the default) and Simplified Chinese (docs/pages.md#language): Django's own
# machinery. The catalog is locale/zh_Hans/LC_MESSAGES/django.po (shipped in the package beside the
# templates); its compiled .mo is built by scripts/bootstrap.sh (`compilemessages`), never committed.
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [SITE_DIR / "locale"]
USE_I18N = True
TIME_ZONE = "UTC"
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [SITE_DIR / "static"]
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(BASE_DIR / "staticfiles")))  # collectstatic's target
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True  # serve from static/ without collectstatic in dev and tests

# Bodies: refused with 413 while they stream in, before anything buffers them
# (novelforge_sessions.bodylimit): the API's typed payload_too_large over API_MAX_BODY_BYTES,
# a plain 413 on every other route over PAGE_MAX_BODY_BYTES (default: Django's form limit).
API_MAX_BODY_BYTES = _strict_int("API_MAX_BODY_BYTES", default=256 * 1024, minimum=1024)
PAGE_MAX_BODY_BYTES = _strict_int("PAGE_MAX_BODY_BYTES", default=2_621_440, minimum=1024)
# Django's own limit stays above both, so the 413 above is what an oversized body gets.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(API_MAX_BODY_BYTES * 4, PAGE_MAX_BODY_BYTES)

# Runtime policy knobs (docs/deployment.md#configuration).
CHECKPOINT_MAX_BYTES = _strict_int("CHECKPOINT_MAX_BYTES", default=64 * 1024, minimum=1024)
TRANSCRIPT_MAX_ENTRIES = _strict_int("TRANSCRIPT_MAX_ENTRIES", default=10_000, minimum=1)
TRANSCRIPT_ENTRY_MAX_BYTES = _strict_int("TRANSCRIPT_ENTRY_MAX_BYTES", default=32 * 1024, minimum=64)
RUNTIME_LEASE_SECONDS = _strict_int("RUNTIME_LEASE_SECONDS", default=60, minimum=1)
TOKEN_LAST_USED_RESOLUTION_SECONDS = _strict_int("TOKEN_LAST_USED_RESOLUTION_SECONDS", default=300)
# The checkpoint, batch and graph writes recall a token looked up this recently and check it again
# in their own locking statement instead of a lookup of its own (apikit/auth.py); 0: look it up on
# every request. Not a grace period: a revoked token is refused by the next request either way.
TOKEN_RECALL_SECONDS = _strict_int("TOKEN_RECALL_SECONDS", default=60, minimum=0)
# Websockets: how often a socket re-checks the event table and the caller's access (a lost
# wake-up only delays an event; a revoked token or membership closes the socket), and how
# long a token-authenticated socket may take to send its auth frame.
LIVE_SWEEP_SECONDS = _strict_int("LIVE_SWEEP_SECONDS", default=15, minimum=1)
LIVE_AUTH_TIMEOUT_SECONDS = _strict_int("LIVE_AUTH_TIMEOUT_SECONDS", default=10, minimum=1)
# Per project and process: the last events the live feed keeps (serialised once) for its
# sockets (live/fanout.py); a socket further behind reads the log after its own cursor.
LIVE_BUFFER_EVENTS = _strict_int("LIVE_BUFFER_EVENTS", default=1000, minimum=1)
# Per project and process: how many times a second the live feed reads the log while writers
# keep it busy (a wake-up after a quiet moment is read at once; faster commits share reads, and
# their sockets get several events to a frame). 0: a read for every wake-up (live/fanout.py).
LIVE_FEED_READS_PER_SECOND = _strict_int("LIVE_FEED_READS_PER_SECOND", default=25, minimum=0)
# Cross-process wake-ups without Redis: with the in-memory layer, each transaction that
# appended events sends one pg_notify after its commit and every server process LISTENs
# (live/pgnotify.py), so events written by another process (the reconciler, a management
# command) reach open sockets within about a second rather than at the next sweep. With
# REDIS_URL the Redis layer crosses processes itself and this is off.
LIVE_PG_NOTIFY = _strict_bool("LIVE_PG_NOTIFY", default=True) and not REDIS_URL

# Garbage collection of graph state (docs/deployment.md#graph-state-garbage-collection), a step
# of every reconciler pass (control/graph_gc.py): at most GRAPH_GC_MAX_PER_PASS unreferenced
# blobs removed per pass, examined GRAPH_GC_BATCH at a time (each batch its own short
# transaction), never one younger than GRAPH_GC_GRACE_SECONDS (an upload waiting for the put that
# will cite it). GRAPH_RETENTION_DAYS > 0: a graph session at rest (idle, completed, failed,
# terminated, stale) for that many days keeps only its latest checkpoint per namespace, at most
# GRAPH_RETENTION_SESSIONS_PER_PASS sessions a pass; 0 keeps every checkpoint.
GRAPH_GC_MAX_PER_PASS = _strict_int("GRAPH_GC_MAX_PER_PASS", default=2000, minimum=0)
GRAPH_GC_BATCH = _strict_int("GRAPH_GC_BATCH", default=500, minimum=1)
GRAPH_GC_GRACE_SECONDS = _strict_int("GRAPH_GC_GRACE_SECONDS", default=3600, minimum=0)
GRAPH_RETENTION_DAYS = _strict_int("GRAPH_RETENTION_DAYS", default=0, minimum=0)
GRAPH_RETENTION_SESSIONS_PER_PASS = _strict_int("GRAPH_RETENTION_SESSIONS_PER_PASS", default=50, minimum=1)

# Signed webhooks (docs/webhooks.md): the sender (manage.py send_webhooks) refuses endpoints on
# private, loopback and link-local addresses unless this is on (a receiver on one's own network).
WEBHOOK_ALLOW_PRIVATE = _strict_bool("WEBHOOK_ALLOW_PRIVATE", default=False)
#: One attempt's whole budget (connect, send, read the capped response), in seconds.
WEBHOOK_TIMEOUT_SECONDS = _strict_int("WEBHOOK_TIMEOUT_SECONDS", default=10, minimum=1)
#: After a rotation the previous secret still signs (a second signature) for this long.
WEBHOOK_SECRET_OVERLAP_SECONDS = _strict_int("WEBHOOK_SECRET_OVERLAP_SECONDS", default=24 * 3600, minimum=0)

# Email to the people a wait names (docs/notifications.md): the mailer (manage.py send_notifications).
# Django's email backend: the console (mails printed by the mailer process) unless EMAIL_HOST is set,
# then SMTP; EMAIL_BACKEND overrides either.
EMAIL_HOST = env.str("EMAIL_HOST", default="")
EMAIL_PORT = _strict_int("EMAIL_PORT", default=25, minimum=1)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = _strict_bool("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = _strict_bool("EMAIL_USE_SSL", default=False)
EMAIL_TIMEOUT = _strict_int("EMAIL_TIMEOUT", default=10, minimum=1)
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default=(
    "django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST else "django.core.mail.backends.console.EmailBackend"))
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="NovelForge <novelforge@localhost>")
#: The links in the mails are this address plus the page's path (the address people open the service at).
NOTIFY_BASE_URL = env.str("NOTIFY_BASE_URL", default="http://127.0.0.1:8000")
#: At most one mail per person per this many minutes; it carries everything that waited meanwhile.
NOTIFY_BATCH_MINUTES = _strict_int("NOTIFY_BATCH_MINUTES", default=10, minimum=1)

#: A handoff still waiting this long after its creation gets one ``handoff.waiting_long`` event, written
#: by the webhook sender's pass (a subscribable notice: docs/webhooks.md#event-types); 0 turns it off.
HANDOFF_LONG_WAIT_SECONDS = _strict_int("HANDOFF_LONG_WAIT_SECONDS", default=15 * 60, minimum=0)

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # the dashboard's JS reads it for POSTs
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

# HTTPS. The defaults serve development over plain http (`make run`, the tests); the production
# profile in docs/deployment.md#https-the-production-profile turns all of them on and passes
# `manage.py check --deploy --fail-level WARNING` with no warning.
SECURE_SSL_REDIRECT = _strict_bool("SECURE_SSL_REDIRECT", default=False)
# The probes answer over plain HTTP (a load balancer's health check does not speak TLS); the
# patterns match the path without its leading slash.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
SECURE_HSTS_SECONDS = _strict_int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _strict_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = _strict_bool("SECURE_HSTS_PRELOAD", default=False)
SESSION_COOKIE_SECURE = _strict_bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = _strict_bool("CSRF_COOKIE_SECURE", default=False)
# The language switcher's cookie (a signed-in person's choice is also stored: dashboard/language.py).
LANGUAGE_COOKIE_AGE = 365 * 24 * 3600
LANGUAGE_COOKIE_SAMESITE = "Lax"
LANGUAGE_COOKIE_SECURE = SESSION_COOKIE_SECURE


def _proxy_ssl_header() -> tuple[str, str] | None:
    """``SECURE_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO,https``: the header (as Django's META key)
    and the value a TLS-terminating proxy sets. Set it only behind a proxy that always sets (or
    strips) that header, otherwise a client could claim HTTPS."""
    raw = env.str("SECURE_PROXY_SSL_HEADER", default="").strip()
    if raw == "":
        return None
    parts = [p.strip() for p in raw.split(",")]
    if len(parts) != 2 or not all(parts) or not re.fullmatch(r"HTTP_[A-Z0-9_]+", parts[0]):
        raise ImproperlyConfigured(
            "SECURE_PROXY_SSL_HEADER must be HEADER,VALUE with HEADER a META name such as "
            f"HTTP_X_FORWARDED_PROTO (e.g. HTTP_X_FORWARDED_PROTO,https), got {raw!r}"
        )
    return parts[0], parts[1]


SECURE_PROXY_SSL_HEADER = _proxy_ssl_header()

# Content-Security-Policy (django-csp). Strict: scripts and styles only from this origin or
# carrying the response's nonce (templates put {{ request.csp_nonce }} on every <script> and
# stylesheet), no inline script, no style attributes (the timeline's geometry is applied by
# static/js/dashboard.js through the CSSOM), no plugins, no framing, forms and <base> to this
# origin only. novelforge_sessions.middleware.CSPMiddleware adds this host's ws:/wss: origin to
# connect-src for the live sockets.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, NONCE],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "frame-ancestors": [NONE],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
    },
}

# Log lines: "plain" text (the default) or "json", one JSON object a line (python-json-logger;
# docs/observability.md#json-logs). Either way every record goes through the RedactingFilter.
LOG_FORMAT = env.str("LOG_FORMAT", default="plain").strip().lower() or "plain"
if LOG_FORMAT not in {"plain", "json"}:
    raise ImproperlyConfigured(f"LOG_FORMAT must be plain or json, got {LOG_FORMAT!r}")
if LOG_FORMAT == "json":
    LOGGING_CONFIG = "novelforge_sessions.logredact.configure_json"  # Python's warnings become JSON lines too

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        # The same fields as "plain", as a JSON object; the whole line is redacted once more (logredact.py).
        "json": {"()": "novelforge_sessions.logredact.JsonFormatter"},
    },
    # Tokens a client put in a URL never reach the log in clear (daphne's access log: asgi.py).
    # A lost connection (Redis restarting) is one WARNING line, not a traceback (logconnection.py);
    # it runs first, so the exception's text it moves into the message is redacted too.
    "filters": {
        "connection_loss": {"()": "novelforge_sessions.logconnection.ConnectionLossFilter"},
        "redact": {"()": "novelforge_sessions.logredact.RedactingFilter"},
        "one_line": {"()": "novelforge_sessions.server.hosts.OneLine"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["connection_loss", "redact"]},
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        # A Host outside ALLOWED_HOSTS: one line, without Django's traceback (server/hosts.py).
        "django.security.DisallowedHost": {"filters": ["one_line"]},
    },
}


# /metrics for Prometheus (novelforge_sessions/metrics.py, docs/observability.md). Off unless
# METRICS_TOKEN or METRICS_ALLOW_IPS is set: then a scrape with "Authorization: Bearer
# <METRICS_TOKEN>" or from an address in METRICS_ALLOW_IPS (IPs or networks, comma-separated) is
# answered, anything else refused (401 unauthorized / 403 forbidden), and every request's latency
# is observed once (the first middleware of both paths). Off, /metrics answers 404 not_found and
# nothing is observed.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
if METRICS_TOKEN and len(METRICS_TOKEN) < 16:
    raise ImproperlyConfigured("METRICS_TOKEN must be at least 16 characters long")


def _networks(name: str) -> list:
    import ipaddress

    out = []
    for item in env.list(name, default=[]):
        try:
            out.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name} must list IP addresses or networks (10.0.0.0/8), got {item!r}") from exc
    return out


METRICS_ALLOW_IPS = _networks("METRICS_ALLOW_IPS")
METRICS_ENABLED = bool(METRICS_TOKEN or METRICS_ALLOW_IPS)
if METRICS_ENABLED:
    MIDDLEWARE.insert(0, "novelforge_sessions.metrics.observe_requests")
    API_MIDDLEWARE.insert(0, "novelforge_sessions.metrics.observe_requests")
# Several server processes answering for one set of metrics: prometheus_client's multi-process
# mode, on when PROMETHEUS_MULTIPROC_DIR names a directory shared by the processes (and emptied
# before they start): each /metrics then answers the request histogram of all of them.
PROMETHEUS_MULTIPROC_DIR = env.str("PROMETHEUS_MULTIPROC_DIR", default="")
if PROMETHEUS_MULTIPROC_DIR and not Path(PROMETHEUS_MULTIPROC_DIR).is_dir():
    raise ImproperlyConfigured(f"PROMETHEUS_MULTIPROC_DIR must be an existing directory, got {PROMETHEUS_MULTIPROC_DIR!r}")
