"""The server patches (``novelforge_sessions/server/patches.py``): one ``install()``, version-checked.

Each patch's upstream code is pinned by a hash of its source, so an upgrade that changes what a
patch replaces or relies on fails here (and ``install()`` refuses to start on it); ``install()``
refuses a daphne, Twisted or autobahn version the patches were not tested with, and applies
each patch once however often it is called. Behaviour against a real daphne: the body limits
(tests/live/test_body_limits.py), the access-log redaction (tests/live/test_log_redaction.py),
the SIGTERM drain (tests/live/test_graceful_shutdown.py); the rest here.
"""
from __future__ import annotations

import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from novelforge_sessions.server import patches

UPSTREAM = [(p.name, dotted, recorded) for p in patches.PATCHES for dotted, recorded in p.upstream.items()]


@pytest.mark.parametrize(("patch", "dotted", "recorded"), UPSTREAM, ids=[f"{p}:{d}" for p, d, _ in UPSTREAM])
def test_the_patched_upstream_source_is_the_one_the_patch_was_written_against(patch: str, dotted: str,
                                                                                 recorded: str) -> None:
    assert patches.source_hash(dotted) == recorded, (
        f"{dotted} changed upstream: review the {patch} patch against it, then record its new hash")


def test_the_installed_versions_are_the_tested_ones() -> None:
    patches.check_versions()  # raises on any other version
    for name, tested in patches.TESTED_VERSIONS.items():
        assert patches.installed_version(name) == tested


@pytest.fixture
def daphne_loaded() -> object:
    import daphne.server

    return daphne.server


def _patched_state(server_module: object) -> tuple:
    from daphne.access import AccessLogGenerator

    import autobahn.websocket.protocol as protocol

    return (server_module.HTTPFactory, server_module.Server.kill_all_applications,
            AccessLogGenerator.write_entry, protocol.hltype, protocol.hlval)


@pytest.mark.parametrize("package", sorted(patches.TESTED_VERSIONS))
def test_install_refuses_an_untested_version_and_patches_nothing(package: str, daphne_loaded: object,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    real = patches.installed_version
    monkeypatch.setattr(patches, "installed_version", lambda name: "99.1" if name == package else real(name))
    before = _patched_state(daphne_loaded)
    with pytest.raises(ImproperlyConfigured) as refused:
        patches.install()
    message = str(refused.value)
    assert f"{package} 99.1 is installed" in message and f"tested with {package} {patches.TESTED_VERSIONS[package]}" in message
    assert _patched_state(daphne_loaded) == before  # nothing was changed


def test_install_refuses_a_changed_upstream_source_and_patches_nothing(daphne_loaded: object,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    drain = next(p for p in patches.PATCHES if p.name == "shutdown_drain")
    monkeypatch.setitem(drain.upstream, "daphne.server:Server.kill_all_applications", "0" * 16)
    before = _patched_state(daphne_loaded)
    with pytest.raises(ImproperlyConfigured, match=r"shutdown_drain: daphne.server:Server.kill_all_applications"):
        patches.install()
    assert _patched_state(daphne_loaded) == before


def test_install_does_nothing_without_daphne(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "daphne.server", raising=False)
    monkeypatch.setattr(patches, "installed_version", lambda name: "0.0")  # would refuse if checked
    assert patches.install() is False


def test_install_applies_every_patch_once_and_the_upstream_hashes_still_hold(daphne_loaded: object) -> None:
    from autobahn import util
    from daphne.access import AccessLogGenerator

    import autobahn.websocket.protocol as protocol
    from novelforge_sessions.server.http import LimitedHTTPFactory

    assert patches.install() is True
    first = _patched_state(daphne_loaded)
    assert patches.install() is True  # idempotent: nothing wrapped twice
    assert _patched_state(daphne_loaded) == first
    assert daphne_loaded.HTTPFactory is LimitedHTTPFactory
    assert not getattr(AccessLogGenerator.write_entry.__wrapped__, "nf_redacts", False)
    assert not getattr(daphne_loaded.Server.kill_all_applications.__wrapped__, "nf_drains", False)
    assert protocol.hltype.__wrapped__ is util.hltype and protocol.hlval.__wrapped__ is util.hlval
    assert patches.changed_upstream() == []  # each replacement names what it replaced


def test_the_access_log_line_is_redacted(daphne_loaded: object) -> None:
    import io

    from daphne.access import AccessLogGenerator

    patches.install()
    stream = io.StringIO()
    AccessLogGenerator(stream)("http", "complete", {
        "path": "/api/v1/sessions?token=nfs_abcdefSECRET&x=1", "status": 401, "method": "GET",
        "client": "127.0.0.1:5000", "time_taken": 0.001, "size": 10})
    line = stream.getvalue()
    assert "SECRET" not in line and "token=[redacted]&x=1" in line and '" 401 10' in line


class _FinishedRequest:
    """What Twisted's request log reads of a finished request."""

    method, uri, clientproto, code, sentLength = b"POST", b"/api/v1/runs/1/checkpoints", b"HTTP/1.1", 201, 441

    def getClientAddress(self) -> object:
        from twisted.internet.address import IPv4Address

        return IPv4Address("TCP", "127.0.0.1", 40000)

    def getHeader(self, name: bytes) -> None:
        return None


def test_twisteds_own_request_log_line_is_not_built() -> None:
    """daphne's own access log is the access log; Twisted's line (dropped below the ``daphne``
    logger's level) is not formatted at all by the factory daphne builds."""
    import daphne.http_protocol as daphne_http

    from novelforge_sessions.server.http import LimitedHTTPFactory

    lines: list[str] = []

    class Sink:
        def write(self, line: str) -> None:
            lines.append(line)

    unpatched = daphne_http.HTTPFactory(server=None)
    unpatched._logFile = Sink()  # Twisted's log file, as its HTTPFactory.log reads it
    unpatched.log(_FinishedRequest())
    assert len(lines) == 1 and '"POST /api/v1/runs/1/checkpoints HTTP/1.1" 201 441' in lines[0]

    factory = LimitedHTTPFactory(server=None)
    factory._logFile = Sink()
    factory.log(_FinishedRequest())
    assert len(lines) == 1  # nothing more written


def test_daphnes_requests_skip_twisteds_form_parse() -> None:
    """``parsePOSTFormSubmission=False``: a form POST's body is not parsed into ``request.args``
    (daphne hands the raw body to Django, which parses it); the body itself is intact."""
    import io

    from twisted.web.test.requesthelper import DummyChannel

    from novelforge_sessions.server.http import LimitedWebRequest

    channel = DummyChannel()
    server = type("Server", (), {"protocol_connected": lambda self, protocol: None})()
    channel.factory = type("Factory", (), {"server": server})()
    request = LimitedWebRequest(channel)
    request.process = lambda: None  # daphne's process() would start the application
    request.requestHeaders.setRawHeaders(b"content-type", [b"application/x-www-form-urlencoded"])
    request.content = io.BytesIO(b"a=1&b=2")
    request.requestReceived(b"POST", b"/login/?q=1", b"HTTP/1.1")
    assert request.args == {b"q": [b"1"]}  # the query string only, not the body's fields
    assert request.content.read() == b"a=1&b=2"


def test_the_memoised_autobahn_log_text_is_autobahns(daphne_loaded: object) -> None:
    import autobahn.websocket.protocol as protocol
    from autobahn.util import hltype as real
    from autobahn.util import hlval as real_val

    class Sub(protocol.WebSocketServerProtocol):
        pass

    patches.install()
    memo, val = protocol.hltype, protocol.hlval
    assert memo is not real and val is not real_val
    a, b = Sub(), Sub()
    for obj in (a.sendData, b.sendData, Sub.sendData, Sub, protocol.WebSocketServerProtocol, real, 42, "text", None):
        assert memo(obj) == real(obj)
        assert memo(obj) == real(obj)  # and again, remembered
    for obj in ("tcp4:127.0.0.1:5555", 0, 1, 300, True, 1.5, None, b"x", ("a", 1)):
        for kw in ({}, {"color": "green"}, {"color": "yellow", "bold": False}):
            assert val(obj, **kw) == real_val(obj, **kw)
            assert val(obj, **kw) == real_val(obj, **kw)
