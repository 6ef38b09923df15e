"""A real SMTP server on loopback (aiosmtpd) that keeps every mail it receives, and the mailer pointed at it."""
from __future__ import annotations

import email
import email.policy
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from aiosmtpd.controller import Controller

from tests.support.servers import free_port

BASE_URL = "https://novelforge.example.org"


@dataclass
class Mailbox:
    """What the SMTP server received: one parsed message per mail, with its envelope recipients."""

    messages: list[tuple[list[str], email.message.EmailMessage]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_DATA(self, server, session, envelope):  # aiosmtpd's handler hook
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        with self.lock:
            self.messages.append((list(envelope.rcpt_tos), message))
        return "250 OK"

    def to(self, address: str) -> list[email.message.EmailMessage]:
        with self.lock:
            return [m for rcpt, m in self.messages if address in rcpt]

    def recipients(self) -> set[str]:
        with self.lock:
            return {r for rcpt, _ in self.messages for r in rcpt}


@pytest.fixture
def smtp(settings) -> Iterator[Mailbox]:
    box = Mailbox()
    port = free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.NOTIFY_BASE_URL = BASE_URL
    settings.NOTIFY_BATCH_MINUTES = 10
    yield box
    controller.stop()


def body_of(message) -> str:
    return message.get_body(preferencelist=("plain",)).get_content()
