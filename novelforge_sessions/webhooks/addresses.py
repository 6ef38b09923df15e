"""Which destinations a webhook may call (docs/webhooks.md#private-addresses).

A webhook URL is chosen by a token holder, and the sender calls it from inside the deployment's
network, so an unchecked URL would let a token reach the database, a cloud metadata service or
an admin port (server-side request forgery). The host is resolved and EVERY address it resolves
to must be public (not private, loopback, link-local, multicast, reserved or unspecified);
``WEBHOOK_ALLOW_PRIVATE=true`` lifts that for a receiver on one's own network. The sender checks
again at each attempt and connects to the address it checked (no second lookup a rebinding DNS
answer could change), and never follows a redirect.
"""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

from novelforge_sessions.phrases import Phrase, gettext_noop


class Refused(Exception):
    """The URL may not be called; the message (a phrase, said again on a page) says why."""


def parse(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL without credentials, or ``Refused``."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Refused(Phrase(gettext_noop("not a valid URL: %(problem)s"), problem=str(exc))) from None
    if parts.scheme not in ("http", "https"):
        raise Refused(Phrase(gettext_noop("a webhook URL is http:// or https://")))
    if not parts.hostname:
        raise Refused(Phrase(gettext_noop("a webhook URL names a host")))
    if parts.username is not None or parts.password is not None:
        raise Refused(Phrase(gettext_noop("a webhook URL carries no credentials (put a token in its path or query instead)")))
    if parts.fragment:
        raise Refused(Phrase(gettext_noop("a webhook URL has no fragment")))
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80)


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_multicast or ip.is_private or ip.is_loopback or ip.is_link_local
                                 or ip.is_reserved or ip.is_unspecified)


def resolve(url: str) -> tuple[str, str, int, list[str]]:
    """(scheme, host, port, addresses) of a URL whose every address may be called, else ``Refused``."""
    scheme, host, port = parse(url)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise Refused(Phrase(gettext_noop("the host %(host)r does not resolve: %(problem)s"), host=host,
                             problem=str(exc))) from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not addresses:
        raise Refused(Phrase(gettext_noop("the host %(host)r does not resolve"), host=host))
    if not settings.WEBHOOK_ALLOW_PRIVATE:
        private = [a for a in addresses if not is_public(a)]
        if private:
            raise Refused(Phrase(
                gettext_noop("the host %(host)r resolves to a private, loopback or link-local address (%(addresses)s); "
                             "set WEBHOOK_ALLOW_PRIVATE=true to allow one"), host=host, addresses=", ".join(private)))
    return scheme, host, port, addresses
