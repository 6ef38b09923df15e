"""The worker loop: claim handoffs matching your capabilities, keep the lease, run your function,
deliver its result.

    from novelforge_client import Client
    from novelforge_client.worker import Worker

    def check_continuity(job):                 # job.handoff: the frozen job (inputs, params, …)
        return {"ok": True, "notes": []}       # must match the job's result_schema

    Worker(Client(url, token), capabilities=["continuity"], handler=check_continuity).run()

or from the shell: ``novelforge worker --capability continuity --handler mypkg.jobs:check_continuity``.

Many copies are safe (processes, machines): a claim is atomic in the service, so each handoff is
leased to one worker at a time, and each lease carries a fencing token; a delivery is consumed once
(a repeat answers ``already_consumed``), so a retried delivery never acts twice.

While the function runs, a background thread renews the lease every ``timeout_seconds × 1/3`` (the
handoff's own lease length). If renewal is refused (``StaleLease``/``HandoffClosed``: the lease ran
out and another worker took the job, or the job was cancelled), ``job.lease_lost`` is set and the
result is not delivered.

Stopping. SIGTERM (and SIGINT) stop the loop *after the current job*: the worker claims nothing
more, lets the running function finish, delivers its result, and returns. A second signal abandons
the current job: renewal stops and nothing is delivered; the service has no "release" route, so
the job becomes claimable again when its lease runs out (``timeout_seconds``), by another worker
with attempt + 1 and a new fencing token (a late delivery from the abandoned lease is refused
``StaleLease``). A function that raises is treated the same way (logged, not delivered, retried by
the next claim after the lease runs out).
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from novelforge_client.client import Client
from novelforge_client.errors import HandoffClosed, HandoffNotClaimable, NovelForgeError, StaleLease, TransportError
from novelforge_client.models import DeliveryOut, HandoffOut

log = logging.getLogger("novelforge_client.worker")

LEASE_GONE = (StaleLease, HandoffClosed, HandoffNotClaimable)


@dataclass
class Job:
    """What the handler gets: the claimed handoff, the client, and a flag set when the lease is lost."""

    handoff: HandoffOut
    client: Client
    worker: str
    lease_lost: threading.Event = field(default_factory=threading.Event)

    @property
    def params(self) -> dict[str, Any]:
        return self.handoff.params

    @property
    def inputs(self) -> list[dict[str, Any]]:
        return self.handoff.inputs


Handler = Callable[[Job], dict[str, Any]]


class Worker:
    def __init__(self, client: Client, *, capabilities: list[str], handler: Handler, name: str | None = None,
                 poll_interval: float = 1.0, renew_fraction: float = 1 / 3) -> None:
        self.client = client
        self.capabilities = list(capabilities)
        self.handler = handler
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.poll_interval = poll_interval
        self.renew_fraction = renew_fraction
        self.stopping = threading.Event()  # finish the current job, claim no more
        self.abandoning = threading.Event()  # give the current job up now
        self.done = 0
        self.current: Job | None = None

    # ---- stopping ----------------------------------------------------------------------
    def stop(self) -> None:
        """First call: stop after the current job. Second call: abandon the current job."""
        if self.stopping.is_set():
            self.abandoning.set()
        self.stopping.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT call :meth:`stop` (main thread only)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    # ---- the loop ----------------------------------------------------------------------
    def run(self, *, max_jobs: int | None = None, until_idle: bool = False) -> int:
        """Claim and process jobs until stopped (or ``max_jobs`` done, or — ``until_idle`` — the
        first time nothing is waiting). Returns how many results were delivered and consumed."""
        while not self.stopping.is_set():
            if max_jobs is not None and self.done >= max_jobs:
                break
            try:
                worked = self.run_once()
            except TransportError as exc:  # the service is unreachable: wait and try again
                log.warning("worker %s: %s", self.name, exc)
                worked = False
            if not worked:
                if until_idle:
                    break
                self.stopping.wait(self.poll_interval)
        return self.done

    def run_once(self) -> bool:
        """Claim one job and process it; False when nothing was waiting."""
        handoff = self.client.claim(self.name, self.capabilities)
        if handoff is None:
            return False
        job = Job(handoff=handoff, client=self.client, worker=self.name)
        self.current = job
        try:
            self._process(job)
        finally:
            self.current = None
        return True

    def _process(self, job: Job) -> DeliveryOut | None:
        h = job.handoff
        log.info("worker %s claimed handoff %s (%s, attempt %s)", self.name, h.id, h.logical_id, h.attempt)
        renewing = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(job, renewing), daemon=True,
                                   name=f"novelforge-lease-{h.id}")
        renewer.start()
        result: dict[str, Any] | None = None
        outcome: list[Any] = []
        runner = threading.Thread(target=self._call_handler, args=(job, outcome), daemon=True,
                                  name=f"novelforge-job-{h.id}")
        runner.start()
        while runner.is_alive():
            runner.join(0.1)
            if self.abandoning.is_set() or job.lease_lost.is_set():
                break
        renewing.set()
        renewer.join()
        if self.abandoning.is_set():
            log.warning("worker %s abandoned handoff %s: claimable again when its lease runs out", self.name, h.id)
            return None
        if job.lease_lost.is_set():
            log.warning("worker %s lost the lease of handoff %s: result not delivered", self.name, h.id)
            return None
        if not outcome or isinstance(outcome[0], BaseException):
            log.error("worker %s: handler failed on handoff %s: %r", self.name, h.id, outcome[0] if outcome else None)
            return None
        result = outcome[0]
        try:
            delivered = self.client.deliver(h.id, fencing_token=h.fencing_token, job_fingerprint=h.job_fingerprint,
                                            result=result)
        except LEASE_GONE as exc:
            log.warning("worker %s: delivery of handoff %s refused: %s", self.name, h.id, exc.code)
            return None
        self.done += 1
        log.info("worker %s delivered handoff %s: %s", self.name, h.id, delivered.outcome)
        return delivered

    def _call_handler(self, job: Job, outcome: list[Any]) -> None:
        try:
            outcome.append(self.handler(job))
        except BaseException as exc:  # noqa: BLE001 - reported by the loop, never delivered
            outcome.append(exc)

    def _renew(self, job: Job, stop: threading.Event) -> None:
        h = job.handoff
        interval = max(0.2, h.timeout_seconds * self.renew_fraction)
        while not stop.wait(interval):
            try:
                self.client.renew_lease(h.id, h.fencing_token)
            except LEASE_GONE:
                job.lease_lost.set()
                return
            except (TransportError, NovelForgeError) as exc:
                log.warning("worker %s: renewing handoff %s failed (will retry): %s", self.name, h.id, exc)


def load_handler(spec: str) -> Handler:
    """``"package.module:function"`` → the function."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"a handler is 'module:function', not {spec!r}")
    handler = getattr(importlib.import_module(module_name), attr)
    if not callable(handler):
        raise ValueError(f"{spec} is not callable")
    return handler
