"""autobahn's per-frame debug text, memoised under daphne (``live/wsframes.py``): the same text
as autobahn's own ``hltype`` for every kind of object it is given."""
from __future__ import annotations

import autobahn.websocket.protocol as protocol
from autobahn.util import hltype as real
from autobahn.util import hlval as real_val

from novelforge_sessions.live.wsframes import memoise_autobahn_hltype


class Sub(protocol.WebSocketServerProtocol):
    pass


def test_the_memoised_hltype_answers_as_autobahn_does():
    assert memoise_autobahn_hltype()
    assert memoise_autobahn_hltype()  # idempotent: not wrapped twice
    memo = protocol.hltype
    assert memo is not real and memo.__wrapped__ is real
    a, b = Sub(), Sub()
    for obj in (a.sendData, b.sendData, Sub.sendData, Sub, protocol.WebSocketServerProtocol, real, 42, "text", None):
        assert memo(obj) == real(obj)
        assert memo(obj) == real(obj)  # and again, remembered
    val = protocol.hlval
    assert val is not real_val and val.__wrapped__ is real_val
    for obj in ("tcp4:127.0.0.1:5555", 0, 1, 300, True, 1.5, None, b"x", ("a", 1)):
        for kw in ({}, {"color": "green"}, {"color": "yellow", "bold": False}):
            assert val(obj, **kw) == real_val(obj, **kw)
            assert val(obj, **kw) == real_val(obj, **kw)
