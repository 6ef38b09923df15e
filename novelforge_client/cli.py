"""``novelforge``: the client on the command line.

    export NOVELFORGE_URL=http://127.0.0.1:8000 NOVELFORGE_TOKEN=nfs_…
    novelforge sessions [--status running]          list sessions
    novelforge show 12                              one session: runs, runtimes, checkpoints
    novelforge tail [--session 12] [--after 0]      live events over the websocket (reconnects)
    novelforge open --role writer --task-mode drafting --runtime-family cli [--attach]
    novelforge checkpoint RUN --boundary context_freeze --cursor '{"step": "outline"}'
    novelforge deliver HANDOFF --fencing-token 3 --job-fingerprint sha256:… --result '{"ok": true}'
    novelforge resume 12 --runtime-family cli [--dry-run]
    novelforge worker --capability lint --handler mypkg.jobs:lint

Human output by default; ``--json`` (before the command) prints JSON for scripts (``tail``: one
event per line). A refusal prints ``error: <code>: <message>`` (or the error body with ``--json``)
and exits 1; a resume refused prints its report and exits 1.
"""
from __future__ import annotations

import json
import sys
from typing import Any

import click

from novelforge_client import models as m
from novelforge_client.client import Client
from novelforge_client.errors import NovelForgeError, ResumeRefused
from novelforge_client.models import ResumeReportOut


class Ctx:
    def __init__(self, url: str, token: str, as_json: bool) -> None:
        self.url, self.token, self.json = url, token, as_json
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.url, self.token)
        return self._client

    def out(self, value: Any, human: str | None = None) -> None:
        if self.json:
            click.echo(json.dumps(_plain(value), separators=(",", ":"), default=str))
        else:
            click.echo(human if human is not None else json.dumps(_plain(value), indent=2, default=str))


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"{what} is not JSON: {exc}") from None


class _Group(click.Group):
    """Typed refusals become a one-line message (or the JSON error body) and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except NovelForgeError as exc:
            as_json = bool(ctx.obj and ctx.obj.json)
            if isinstance(exc, ResumeRefused) and isinstance(exc.details.get("report"), dict):
                report = ResumeReportOut.model_validate(exc.details["report"])
                click.echo(json.dumps(_plain(report)) if as_json else render_report(report))
            elif as_json:
                click.echo(json.dumps({"error": {"code": exc.code, "message": exc.message, "details": exc.details}},
                                      default=str))
            else:
                click.echo(f"error: {exc.code}: {exc.message}", err=True)
            ctx.exit(1)


@click.group(cls=_Group)
@click.option("--url", envvar="NOVELFORGE_URL", default="http://127.0.0.1:8000", show_default=True,
              help="the server (env NOVELFORGE_URL)")
@click.option("--token", envvar="NOVELFORGE_TOKEN", required=True, help="an API token (env NOVELFORGE_TOKEN)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable JSON output")
@click.pass_context
def main(ctx: click.Context, url: str, token: str, as_json: bool) -> None:
    """NovelForge Session Runtime from the command line."""
    ctx.obj = Ctx(url, token, as_json)


# ---- sessions ------------------------------------------------------------------------
def _session_row(s: Any) -> str:
    return (f"{s.id:>6}  {s.status:<18} {s.role:<18} {s.task_mode:<16} {s.runtime_family:<12} "
            f"gen {s.generation:<3} {s.updated_at:%Y-%m-%d %H:%M:%S}")


@main.command()
@click.option("--status")
@click.option("--role")
@click.option("--runtime-family")
@click.option("--task-mode")
@click.pass_obj
def sessions(obj: Ctx, status: str | None, role: str | None, runtime_family: str | None, task_mode: str | None) -> None:
    """List sessions (every page)."""
    items = list(obj.client.sessions(status=status, role=role, runtime_family=runtime_family, task_mode=task_mode))
    header = f"{'id':>6}  {'status':<18} {'role':<18} {'task mode':<16} {'runtime':<12} {'gen':<7} updated"
    obj.out(items, "\n".join([header, *(_session_row(s) for s in items)]) if items else "no sessions")


@main.command()
@click.argument("session_id", type=int)
@click.pass_obj
def show(obj: Ctx, session_id: int) -> None:
    """One session: status, allowed moves, runs with their checkpoints, runtimes."""
    nf = obj.client
    s = nf.session(session_id)
    runs = list(nf.runs(session_id))
    runtimes = list(nf.runtimes(session_id))
    checkpoints = {r.id: list(nf.checkpoints(r.id)) for r in runs}
    if obj.json:
        obj.out({"session": s, "runs": runs, "runtimes": runtimes,
                 "checkpoints": {str(k): v for k, v in checkpoints.items()}})
        return
    lines = [
        f"session {s.id}: {s.status}" + (f" ({s.status_reason})" if s.status_reason else ""),
        f"  role {s.role}  memory {s.memory_policy}  task {s.task_mode}  runtime {s.runtime_family}  "
        f"generation {s.generation}  version {s.version}",
        f"  allowed next: {', '.join(s.allowed_transitions) or '—'}",
    ]
    if s.open_conflict:
        lines.append(f"  OPEN CONFLICT: {s.open_conflict}")
    lines.append(f"runs ({len(runs)}):")
    for r in runs:
        lines.append(f"  #{r.seq} run {r.id}  {r.state:<12} gen {r.generation}  cursor {json.dumps(r.cursor)}"
                     + (f"  ended: {r.end_reason}" if r.end_reason else ""))
        for c in checkpoints[r.id]:
            lines.append(f"      checkpoint {c.id} #{c.seq} {c.boundary}  cursor {json.dumps(c.cursor)}")
    lines.append(f"runtimes ({len(runtimes)}):")
    for rt in runtimes:
        lines.append(f"  runtime {rt.id} gen {rt.generation} {rt.runtime_family:<12} {rt.state:<8} "
                     f"{'live' if rt.live else 'not live'}" + (f"  ({rt.end_reason})" if rt.end_reason else ""))
    obj.out(None, "\n".join(lines))


@main.command("open")
@click.option("--role", required=True)
@click.option("--memory-policy", default="bounded", show_default=True)
@click.option("--task-mode", required=True)
@click.option("--runtime-family", required=True)
@click.option("--role-extension")
@click.option("--attach", is_flag=True, help="attach runtime generation 1 too (prints its id: heartbeat it)")
@click.option("--capability", "capabilities", multiple=True)
@click.option("--lease-seconds", type=int)
@click.pass_obj
def open_session(obj: Ctx, role: str, memory_policy: str, task_mode: str, runtime_family: str,
                 role_extension: str | None, attach: bool, capabilities: tuple[str, ...], lease_seconds: int | None) -> None:
    """Open (create) a session."""
    runtime = ({"runtime_family": runtime_family, "capabilities": list(capabilities), "lease_seconds": lease_seconds}
               if attach else None)
    if runtime is not None and lease_seconds is None:
        del runtime["lease_seconds"]
    s = obj.client.create_session(role=role, memory_policy=memory_policy, task_mode=task_mode,
                                  runtime_family=runtime_family, role_extension=role_extension, runtime=runtime)
    obj.out(s, f"session {s.id} created ({s.status})" + (f"; runtime {s.runtime_id} attached" if s.runtime_id else ""))


@main.command()
@click.argument("run_id", type=int)
@click.option("--boundary", required=True)
@click.option("--cursor", required=True, help="JSON object")
@click.option("--artifact", "artifacts", multiple=True, help="ARTIFACT_ID:FINGERPRINT (repeat)")
@click.option("--pending", help='JSON, e.g. {"handoffs": ["logical-id"]}')
@click.option("--authority", help="JSON")
@click.pass_obj
def checkpoint(obj: Ctx, run_id: int, boundary: str, cursor: str, artifacts: tuple[str, ...], pending: str | None,
               authority: str | None) -> None:
    """Write a bounded checkpoint of a run."""
    refs: list[m.ArtifactRefIn | dict[str, Any]] = []
    for ref in artifacts:
        artifact_id, _, fingerprint = ref.partition(":")
        if not artifact_id.isdigit() or not fingerprint:
            raise click.BadParameter(f"--artifact is ARTIFACT_ID:FINGERPRINT, not {ref!r}")
        refs.append({"artifact_id": int(artifact_id), "fingerprint": fingerprint})
    cp = obj.client.checkpoint(run_id, boundary=boundary, cursor=_json_arg(cursor, "--cursor"),
                               artifacts=refs or None, pending=_json_arg(pending, "--pending"),
                               authority=_json_arg(authority, "--authority"))
    obj.out(cp, f"checkpoint {cp.id} (#{cp.seq}, {cp.boundary}) of run {cp.run_id}")


@main.command()
@click.argument("handoff_id", type=int)
@click.option("--fencing-token", type=int, required=True)
@click.option("--job-fingerprint", required=True)
@click.option("--result", required=True, help="JSON object")
@click.pass_obj
def deliver(obj: Ctx, handoff_id: int, fencing_token: int, job_fingerprint: str, result: str) -> None:
    """Deliver a handoff's result (a repeat answers already_consumed)."""
    out = obj.client.deliver(handoff_id, fencing_token=fencing_token, job_fingerprint=job_fingerprint,
                             result=_json_arg(result, "--result"))
    obj.out(out, f"handoff {out.handoff_id} ({out.logical_id}): {out.outcome}; receipt {out.receipt.id}; "
                 f"session now {out.session_status}")


# ---- resume ----------------------------------------------------------------------------
def render_report(r: ResumeReportOut) -> str:
    verdict = "OK" if r.ok else "REFUSED"
    title = f"resume of session {r.session_id}: {verdict}" + (" (dry run: nothing changed)" if r.dry_run else "")
    lines = [title, f"  from checkpoint {r.checkpoint_id}" if r.checkpoint_id else "  no checkpoint"]
    width = max((len(s.step) for s in r.steps), default=4)
    for s in r.steps:
        mark = "ok  " if s.ok else "FAIL"
        lines.append(f"  [{mark}] {s.step:<{width}}  {s.detail}")
        if s.repair:
            lines.append(f"         {'':<{width}}  repair: {s.repair}")
    if r.repairs:
        lines.append("  to repair: " + "; ".join(r.repairs))
    if r.ok and not r.dry_run:
        lines.append(f"  generation {r.generation}: runtime {r.runtime_id}, run {r.run_id}")
    return "\n".join(lines)


@main.command()
@click.argument("session_id", type=int)
@click.option("--runtime-family", required=True)
@click.option("--capability", "capabilities", multiple=True)
@click.option("--lease-seconds", type=int)
@click.option("--checkpoint", "checkpoint_id", type=int, help="default: the latest checkpoint")
@click.option("--dry-run", is_flag=True, help="revalidate and report only")
@click.pass_obj
def resume(obj: Ctx, session_id: int, runtime_family: str, capabilities: tuple[str, ...], lease_seconds: int | None,
           checkpoint_id: int | None, dry_run: bool) -> None:
    """Resume a session after revalidation, printing the step report."""
    runtime: dict[str, Any] = {"runtime_family": runtime_family, "capabilities": list(capabilities)}
    if lease_seconds is not None:
        runtime["lease_seconds"] = lease_seconds
    report = obj.client.resume(session_id, runtime, checkpoint_id=checkpoint_id, dry_run=dry_run)
    obj.out(report, render_report(report))


# ---- the live stream -------------------------------------------------------------------
def render_event(e: dict[str, Any]) -> str:
    where = " ".join(f"{k}={e[k]}" for k in ("session_id", "run_id") if e.get(k) is not None)
    payload = json.dumps(e.get("payload") or {}, separators=(",", ":"))
    if len(payload) > 100:
        payload = payload[:97] + "..."
    return f"#{e['id']:<7} {str(e.get('created_at', ''))[11:19]}  {e['type']:<28} {where}  {payload}"


@main.command()
@click.option("--session", "session_id", type=int, help="one session (default: the token's project)")
@click.option("--after", type=int, help="the last event id already seen (default: from now on; 0: everything)")
@click.option("--count", type=int, help="stop after this many events")
@click.pass_obj
def tail(obj: Ctx, session_id: int | None, after: int | None, count: int | None) -> None:
    """Follow events live over the websocket; reconnects and resumes after the last event seen."""
    from novelforge_client.stream import EventStream

    project_id = None if session_id is not None else obj.client.project().id

    def status(what: str, **info: Any) -> None:
        if obj.json:
            return
        if what == "reconnecting":
            click.echo(f"-- connection lost; reconnecting after event {info.get('cursor')} ...", err=True)
        elif what == "caught_up":
            click.echo(f"-- caught up at event {info.get('cursor')}; live from here", err=True)

    stream = EventStream(obj.url, obj.token, session_id=session_id, project_id=project_id, after=after,
                         on_status=status)
    seen = 0
    try:
        for event in stream:
            click.echo(json.dumps(event, separators=(",", ":")) if obj.json else render_event(event))
            sys.stdout.flush()
            seen += 1
            if count is not None and seen >= count:
                break
    except KeyboardInterrupt:
        pass
    finally:
        stream.close()


# ---- the worker loop -------------------------------------------------------------------
@main.command()
@click.option("--capability", "capabilities", multiple=True, required=True, help="repeat for several")
@click.option("--handler", required=True, help="module:function taking a Job, returning the result dict")
@click.option("--name", help="lease holder name (default: host-pid)")
@click.option("--poll", type=float, default=1.0, show_default=True, help="seconds between claims when idle")
@click.option("--max-jobs", type=int)
@click.pass_obj
def worker(obj: Ctx, capabilities: tuple[str, ...], handler: str, name: str | None, poll: float,
           max_jobs: int | None) -> None:
    """Claim and run handoffs until SIGTERM (the current job is finished and delivered first)."""
    import logging

    from novelforge_client.worker import Worker, load_handler

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    w = Worker(obj.client, capabilities=list(capabilities), handler=load_handler(handler), name=name,
               poll_interval=poll)
    w.install_signal_handlers()
    done = w.run(max_jobs=max_jobs)
    obj.out({"worker": w.name, "delivered": done}, f"worker {w.name} stopped after {done} job(s)")


if __name__ == "__main__":  # python -m novelforge_client.cli
    main()
