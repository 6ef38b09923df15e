"""Under daphne: a cheaper websocket frame send (autobahn), with the same bytes on the wire.

``autobahn.websocket.protocol.WebSocketProtocol.sendData`` (every frame daphne writes) logs
``self.log.debug("{func} sent …", func=hltype(self.sendData), …)``: the arguments are built
whether or not debug logging is on, and ``hltype`` formats the method's qualified name with
``click.style`` each time. Under py-spy (``--gil``, daphne, 8 writers and 10 subscribers) that
was ~3 % of the server's time, half of autobahn's whole send path. ``memoise_autobahn_hltype``
replaces the module's ``hltype`` with one that remembers its text per function or class (the
text depends only on the object's module and qualified name; bound methods are keyed by their
function), and its ``hlval`` (the peer and the frame's length, styled the same way each time)
with a bounded memo for strings and integers. Only when autobahn is already loaded (daphne);
otherwise nothing changes.
"""
from __future__ import annotations

import functools
import inspect
import sys
from typing import Any


def memoise_autobahn_hltype() -> bool:
    protocol = sys.modules.get("autobahn.websocket.protocol")
    real = getattr(protocol, "hltype", None)
    if protocol is None or real is None:
        return False
    if getattr(real, "_novelforge_memo", False):
        return True
    texts: dict[Any, str] = {}

    def hltype(obj: Any) -> str:
        key = obj.__func__ if inspect.ismethod(obj) else obj
        if not (inspect.isclass(key) or inspect.isfunction(key)):
            return real(obj)
        text = texts.get(key)
        if text is None:
            text = texts[key] = real(obj)
        return text

    real_val = protocol.hlval
    styled = functools.lru_cache(maxsize=4096)(lambda val, kind, color, bold: real_val(val, color=color, bold=bold))

    def hlval(val: Any, color: str = "white", bold: bool = True) -> str:
        if type(val) in (str, int):  # exact types: True and 1 are equal keys but print differently
            return styled(val, type(val), color, bold)
        return real_val(val, color=color, bold=bold)

    hltype._novelforge_memo = True  # type: ignore[attr-defined]
    hltype.__wrapped__ = real  # type: ignore[attr-defined]
    hlval.__wrapped__ = real_val  # type: ignore[attr-defined]
    protocol.hltype = hltype
    protocol.hlval = hlval
    return True
