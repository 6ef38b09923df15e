"""Every change this project makes to daphne, Twisted and autobahn, in one table, version-checked.

Under daphne (``make run``), ``novelforge_sessions.asgi`` calls :func:`install` once. It:

1. checks the installed versions of daphne, Twisted and autobahn (``importlib.metadata``)
   against :data:`TESTED_VERSIONS`, the versions these patches were written and tested
   against, and refuses to start (``ImproperlyConfigured``, naming the package, the installed
   and the tested version) on any other;
2. checks the source of every upstream function or method a patch replaces, wraps, overrides or
   relies on against the hash recorded in :data:`PATCHES` (a same-version reinstall that
   differs, an edited site-packages) and refuses to start on a difference;
3. applies each patch, idempotently (a second call changes nothing).

Not under daphne (uvicorn through ``novelforge_sessions.serve``, tests, management commands)
nothing is checked or changed: daphne's server module is not loaded, so no patch applies.

The patches (each tested in ``tests/test_server_patches.py``, and against a real daphne in
``tests/live/``):

- ``daphne_http``: daphne builds :class:`~novelforge_sessions.server.http.LimitedHTTPFactory`:
  bodies over their route's limit refused while they arrive, no form parse by Twisted, no
  second access line (``server/http.py``);
- ``access_log_redaction``: daphne's access log (``AccessLogGenerator.write_entry``, which
  writes to a stream, not through ``logging``) gets its request line through
  ``logredact.redact``: a token in a query string never reaches it in clear (with
  ``LOG_FORMAT=json`` the entry goes through ``logging`` instead, as one JSON object);
- ``shutdown_drain``: SIGTERM drains (stop listening, websockets closed with 1012, requests in
  flight finish) before what is left is cancelled (``server/drain.py``);
- ``autobahn_log_text``: autobahn's ``sendData`` builds a debug-log text for every frame it
  writes, whether or not debug logging is on (``hltype`` styles the method's qualified name
  with ``click.style``, ``hlval`` the peer and the length, text that is then dropped);
  the module's two names are rebound to memoised
  equivalents that return the same text.

Upgrading one of the three packages: read the changed upstream sources named in
:data:`PATCHES`, adapt the patch, then record the new version and hashes
(``python -m novelforge_sessions.server.patches`` prints what is installed).
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

#: The versions every patch below was written against and tested with.
TESTED_VERSIONS: dict[str, str] = {"daphne": "4.2.3", "Twisted": "26.10.0", "autobahn": "26.11.1"}


def installed_version(distribution: str) -> str:
    """The installed version of ``distribution`` (``importlib.metadata``)."""
    return importlib.metadata.version(distribution)


def source_hash(dotted: str) -> str:
    """A short sha256 of the source of ``module:qualname`` (``inspect.getsource``)."""
    module_name, _, qualname = dotted.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    # Every replacement below carries ``__wrapped__`` (what it replaced), which getsource follows:
    # the hash is the upstream code's, before and after install().
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Patch:
    """One change to upstream code: what it relies on (source hashes) and how it is applied."""

    name: str
    #: ``module:qualname`` → :func:`source_hash` of the upstream code the patch replaces, wraps,
    #: overrides or whose behaviour it relies on.
    upstream: dict[str, str]
    apply: Callable[[], None]


# --- the patches ---------------------------------------------------------------------------------

def _apply_daphne_http() -> None:
    import daphne.server

    from novelforge_sessions.server.http import LimitedHTTPFactory

    daphne.server.HTTPFactory = LimitedHTTPFactory  # Server.run builds HTTPFactory(self) by this name


#: Daphne's access entries under ``LOG_FORMAT=json`` (``_apply_access_log_redaction``).
_ACCESS_LOG = logging.getLogger("novelforge.access")


def _apply_access_log_redaction() -> None:
    from daphne.access import AccessLogGenerator

    from novelforge_sessions.logredact import redact

    original = AccessLogGenerator.write_entry
    if getattr(original, "nf_redacts", False):
        return

    from django.conf import settings

    @functools.wraps(original)
    def write_entry(self: Any, host: Any, date: Any, request: str, *args: Any, **kwargs: Any) -> Any:
        if settings.LOG_FORMAT == "json":
            # LOG_FORMAT=json: the same entry as a record of ``novelforge.access``, so it is one
            # JSON object like every other line (settings.LOGGING), not daphne's text line.
            status, length = (list(args) + [None, None])[:2]
            status, length = kwargs.get("status", status), kwargs.get("length", length)
            _ACCESS_LOG.info('%s - - "%s" %s %s', host, redact(request), status or "-", length or "-")
            return None
        return original(self, host, date, redact(request), *args, **kwargs)

    write_entry.nf_redacts = True  # type: ignore[attr-defined]
    AccessLogGenerator.write_entry = write_entry  # type: ignore[method-assign]


def _apply_shutdown_drain() -> None:
    import daphne.server

    from novelforge_sessions.server.drain import GRACE, drain_then_kill, grace_seconds

    GRACE["seconds"] = grace_seconds()  # validated at start-up: a bad value stops it
    original = daphne.server.Server.kill_all_applications
    if getattr(original, "nf_drains", False):
        return

    def kill_all_applications(self: Any) -> Any:  # the "before shutdown" trigger Server.run registers
        return drain_then_kill(self)

    kill_all_applications.nf_drains = True  # type: ignore[attr-defined]
    kill_all_applications.__wrapped__ = original  # type: ignore[attr-defined]
    daphne.server.Server.kill_all_applications = kill_all_applications


def _apply_autobahn_log_text() -> None:
    protocol = importlib.import_module("autobahn.websocket.protocol")
    if getattr(protocol.hltype, "nf_memo", False):
        return
    real, real_val = protocol.hltype, protocol.hlval
    texts: dict[Any, str] = {}

    @functools.wraps(real)
    def hltype(obj: Any) -> str:
        # The text depends only on the object's module and qualified name: bound methods are
        # keyed by their function; anything else is formatted every time, as before.
        key = obj.__func__ if inspect.ismethod(obj) else obj
        if not (inspect.isclass(key) or inspect.isfunction(key)):
            return real(obj)
        text = texts.get(key)
        if text is None:
            text = texts[key] = real(obj)
        return text

    styled = functools.lru_cache(maxsize=4096)(lambda val, kind, color, bold: real_val(val, color=color, bold=bold))

    @functools.wraps(real_val)
    def hlval(val: Any, color: str = "white", bold: bool = True) -> str:
        if type(val) in (str, int):  # exact types: True and 1 are equal keys but print differently
            return styled(val, type(val), color, bold)
        return real_val(val, color=color, bold=bold)

    hltype.nf_memo = True  # type: ignore[attr-defined]
    protocol.hltype = hltype
    protocol.hlval = hlval


#: Every patch, in the order :func:`install` applies them.
PATCHES: tuple[Patch, ...] = (
    Patch("daphne_http", {
        "daphne.server:Server.run": "447c6bd42c62e98c",
        "daphne.server:Server.log_action": "24dce8ac1282941e",
        "daphne.http_protocol:HTTPFactory.buildProtocol": "35e878a6e0e41af2",
        "daphne.http_protocol:WebRequest.__init__": "ec85d9f2a762a39f",
        "twisted.web.http:Request.__init__": "2d3f7dbd28d0ce02",
        "twisted.web.http:Request.requestReceived": "99ca6c5e24305de4",
        "twisted.web.http:Request.gotLength": "1c389b99da50b0ae",
        "twisted.web.http:Request.handleContentChunk": "6e942756afb787b4",
        "twisted.web.http:HTTPChannel.lineReceived": "b77ec6f21116e827",
        "twisted.web.http:HTTPChannel.allHeadersReceived": "979a9a8410f41ad9",
        "twisted.web.http:HTTPFactory.log": "e9acff05b9a51cb7",
    }, _apply_daphne_http),
    Patch("access_log_redaction", {
        "daphne.access:AccessLogGenerator.__call__": "6336ae23d2ba83f5",
        "daphne.access:AccessLogGenerator.write_entry": "f07842081a359b1a",
    }, _apply_access_log_redaction),
    Patch("shutdown_drain", {
        "daphne.server:Server.run": "447c6bd42c62e98c",
        "daphne.server:Server.kill_all_applications": "4e1618c6f7871758",
        "autobahn.websocket.protocol:WebSocketProtocol.sendCloseFrame": "a511406d6b0d711e",
    }, _apply_shutdown_drain),
    Patch("autobahn_log_text", {
        "autobahn.websocket.protocol:WebSocketProtocol.sendData": "5dcca425b048b07e",
        "autobahn.util:hltype": "7db6418e1bc5e63a",
        "autobahn.util:hlval": "c6a73ec8e6664a13",
    }, _apply_autobahn_log_text),
)


def check_versions() -> None:
    """Refuse (``ImproperlyConfigured``) any version of daphne, Twisted or autobahn not tested."""
    for distribution, tested in TESTED_VERSIONS.items():
        installed = installed_version(distribution)
        if installed != tested:
            raise ImproperlyConfigured(
                f"{distribution} {installed} is installed, but the server patches "
                f"(novelforge_sessions/server/patches.py) were tested with {distribution} {tested}: "
                f"install {distribution}=={tested}, or review the patches against {installed} and update TESTED_VERSIONS"
            )


def changed_upstream() -> list[str]:
    """The upstream functions whose source is not the one a patch was written against."""
    return [
        f"{patch.name}: {dotted}"
        for patch in PATCHES for dotted, recorded in patch.upstream.items()
        if source_hash(dotted) != recorded
    ]


def install() -> bool:
    """Under daphne: check the versions and sources, then apply every patch; idempotent.

    Returns whether the patches apply (False when daphne does not run this process)."""
    if "daphne.server" not in sys.modules:  # not under daphne (uvicorn, tests, management commands)
        return False
    check_versions()
    changed = changed_upstream()
    if changed:
        raise ImproperlyConfigured(
            "the server patches (novelforge_sessions/server/patches.py) were written against other "
            "sources of: " + ", ".join(changed)
        )
    for patch in PATCHES:
        patch.apply()
    return True


if __name__ == "__main__":  # what is installed: to record after reviewing an upgrade
    for name in TESTED_VERSIONS:
        print(name, installed_version(name))
    for patch in PATCHES:
        for dotted in patch.upstream:
            print(patch.name, dotted, source_hash(dotted))
