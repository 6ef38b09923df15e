"""AsyncClient's operations are awaitable to a type checker, not only at run time.

``novelforge_client/_async_ops.py`` is generated from ``_Operations`` in client.py by
``scripts/gen_async_client.py``: the committed file must equal a fresh generation, a changed
signature in client.py must change it, and every generated operation must keep the shared
operation's signature and behaviour. mypy (configured in pyproject.toml) must pass over the client
package and examples/, and must fail on code that forgets an ``await`` or iterates an async
iterator synchronously: the types are real.
"""
from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from novelforge_client import AsyncClient, Client, models as m
from novelforge_client.client import _Operations

ROOT = Path(__file__).resolve().parent.parent.parent
GENERATED = ROOT / "novelforge_client" / "_async_ops.py"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_async_client", ROOT / "scripts" / "gen_async_client.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _operation_names() -> list[str]:
    gen = _generator()
    import ast

    return [fn.name for fn in gen.operations(ast.parse((ROOT / "novelforge_client" / "client.py").read_text()))]


# ---- the generated file ------------------------------------------------------------------------------
def test_the_committed_async_operations_are_a_fresh_generation():
    assert GENERATED.read_text(encoding="utf-8") == _generator().render(), (
        "novelforge_client/_async_ops.py is out of date: run scripts/gen_async_client.py")


def test_the_check_mode_fails_on_a_stale_file(tmp_path, monkeypatch):
    gen = _generator()
    stale = tmp_path / "_async_ops.py"
    stale.write_text(GENERATED.read_text(encoding="utf-8").replace("async def project", "async def projekt"))
    monkeypatch.setattr(gen, "TARGET", stale)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 1
    stale.write_text(gen.render())
    assert gen.main(["--check"]) == 0


def test_a_changed_signature_in_client_py_reaches_the_generated_operation():
    """What another change to client.py does (a new parameter, a new operation): regenerating follows it."""
    source = (ROOT / "novelforge_client" / "client.py").read_text(encoding="utf-8")
    old = "    def project(self) -> m.ProjectOut:\n"
    assert source.count(old) == 1
    changed = source.replace(old, '''    def ping(self, note: str = "hi") -> m.ProjectOut:
        """A new operation."""
        return self._call(Call("GET", "/project", m.ProjectOut))

    def project(self, *, zz_extra: Sequence[int] = ()) -> m.ProjectOut:
''')
    changed = changed.replace("\nimport httpx\n", "\nimport httpx\nfrom collections.abc import Sequence\n", 1)
    text = _generator().render(changed)
    assert ("    async def project(self, *, zz_extra: Sequence[int] = ()) -> m.ProjectOut:  # type: ignore[override]\n"
            "        return await _awaited(super().project, zz_extra=zz_extra)\n") in text
    assert "Sequence" in text.split("if TYPE_CHECKING:")[0]  # the import the new annotation needs
    assert ('    async def ping(self, note: str = "hi") -> m.ProjectOut:  # type: ignore[override]\n'
            '        """A new operation."""\n        return await _awaited(super().ping, note)\n') in text
    assert text != _generator().render()


def test_a_helper_that_sends_no_request_stays_sync():
    names = _operation_names()
    assert "runtime_for" not in names and not inspect.iscoroutinefunction(AsyncClient.runtime_for)
    assert {"project", "start_run", "checkpoint", "claim", "forget", "invalidated_bindings"} <= set(names)


def test_every_operation_is_a_coroutine_with_the_shared_signature_and_client_is_unchanged():
    names = _operation_names()
    assert len(names) >= 60
    for name in names:
        async_op, shared = getattr(AsyncClient, name), getattr(_Operations, name)
        assert inspect.iscoroutinefunction(async_op), name
        assert inspect.signature(async_op) == inspect.signature(shared), name
        assert getattr(Client, name) is shared, f"Client.{name} must stay the shared sync operation"
    assert AsyncClient.__mro__.index(_Operations) == 2  # AsyncClient, _AsyncOperations, _Operations


# ---- the generated operations behave like the shared ones -----------------------------------------------
def _handler(seen: list[httpx.Request]):
    run = {"id": 7, "session_id": 3, "seq": 1, "generation": 1, "task_mode": "drafting", "target": "",
           "cursor": {"step": "a"}, "frozen_inputs": [], "state": "open", "end_reason": "",
           "started_at": "2026-01-01T00:00:00Z", "ended_at": None,
           "abort_requested_at": None, "resumed_from_id": None, "checkpoint_count": 0}

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/sessions/3/runs"):
            return httpx.Response(201, json=run)
        if request.url.path.endswith("/handoffs/claim"):
            return httpx.Response(200, json={"handoff": None})
        if request.method == "DELETE":
            return httpx.Response(204)
        return httpx.Response(404, json={"code": "not_found", "message": "no", "details": {}})

    return handle


def test_the_awaited_operations_send_the_shared_request_and_keep_its_post_processing():
    seen: list[httpx.Request] = []

    async def scenario() -> None:
        async with AsyncClient("http://nf.test", "nfs_x", transport=httpx.MockTransport(_handler(seen))) as nf:
            nf._runtimes[3] = 11  # the runtime this client attached to session 3: named in its writes
            pending = nf.start_run(3, cursor={"step": "a"})
            assert inspect.iscoroutine(pending)
            run = await pending
            assert isinstance(run, m.RunOut) and run.id == 7
            assert nf._run_sessions[7] == 3  # the shared `then` ran
            assert await nf.claim("w", ["lint"]) is None  # `then` maps the answer to its handoff
            assert await nf.forget(3) is None and nf.runtime_for(3) is None

    asyncio.run(scenario())
    body = json.loads(seen[0].content)
    assert (seen[0].method, seen[0].url.path) == ("POST", "/api/v1/sessions/3/runs")
    key = body.pop("idempotency_key")  # a fresh key per call (start_run is a keyed write)
    assert re.fullmatch(r"[0-9a-f]{32}", key)
    assert body == {"cursor": {"step": "a"}, "runtime_id": 11}
    assert [r.method for r in seen] == ["POST", "POST", "DELETE"]


# ---- mypy ------------------------------------------------------------------------------------------
def _mypy(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    # MYPYPATH: this checkout's novelforge_client, whatever an editable install elsewhere points to.
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(cache), "--no-color-output", "--show-error-codes", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def mypy_cache() -> Path:
    return ROOT / ".mypy_cache"  # mypy's own default (git-ignored): later runs reuse it


def test_mypy_passes_over_the_client_and_the_examples(mypy_cache):
    proc = _mypy(cache=mypy_cache)  # the `files` of [tool.mypy]: novelforge_client/ and examples/
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"Success: no issues found in \d+ source files", proc.stdout), proc.stdout
    checked = int(re.search(r"in (\d+) source files", proc.stdout).group(1))
    expected = len(list((ROOT / "novelforge_client").glob("*.py"))) + len(list((ROOT / "examples").glob("*.py")))
    assert checked == expected, proc.stdout


SNIPPETS = {
    # name: (code in `async def main(nf: AsyncClient, sync: Client) -> None:`, the error mypy must report)
    "no_await": ("run: RunOut = nf.start_run(1)",
                 'Incompatible types in assignment (expression has type "Coroutine[Any, Any, RunOut]", '
                 'variable has type "RunOut")  [assignment]'),
    "attribute_of_coroutine": ("print(nf.heartbeat(5).abort_requested)",
                               '"Coroutine[Any, Any, HeartbeatOut]" has no attribute "abort_requested"  [attr-defined]'),
    "sync_iteration": ("for s in nf.sessions():\n        print(s.id)",
                       '"AsyncIterator[SessionOut]" has no attribute "__iter__"'),
    "sync_lease": ("with nf.keep_alive(5) as rt:\n        print(rt.beats)",
                   '"AsyncRuntimeLease" has no attribute "__enter__"'),
    "await_sync_client": ("run = await sync.start_run(1)",
                          'Incompatible types in "await" (actual type "RunOut", expected type "Awaitable[Any]")'),
    "wrong_argument": ("await nf.start_run(1, cursor=[1])",
                       'Argument "cursor" to "start_run" of "_AsyncOperations" has incompatible type "list[int]"; '
                       'expected "dict[str, Any] | None"  [arg-type]'),
    "none_result_used": ("x = await nf.forget(1)",
                         'does not return a value (it only ever returns None)  [func-returns-value]'),
}
CORRECT = """\
    run: RunOut = await nf.start_run(1)
    reveal_type(await nf.claim("w", ["lint"]))
    async for s in nf.sessions():
        reveal_type(s)
    async with nf.keep_alive(5) as rt:
        reveal_type(rt)
    reveal_type(nf.runtime(1, "cli"))
    reveal_type(sync.start_run(1))
    with sync.keep_alive(5) as lease:
        reveal_type(lease)
    await nf.forget(1)
    print(run.id, nf.runtime_for(1))
"""
PRELUDE = """\
from novelforge_client import AsyncClient, Client
from novelforge_client.models import RunOut


async def main(nf: AsyncClient, sync: Client) -> None:
"""


def test_mypy_refuses_async_results_used_without_await(mypy_cache, tmp_path):
    files = {}
    for name, (code, _) in SNIPPETS.items():
        files[name] = tmp_path / f"snippet_{name}.py"
        files[name].write_text(PRELUDE + textwrap.indent(code, "    ") + "\n")
    correct = tmp_path / "snippet_correct.py"
    correct.write_text(PRELUDE + CORRECT)
    proc = _mypy(*map(str, files.values()), str(correct), cache=mypy_cache)
    out = proc.stdout

    def of(path: Path) -> list[str]:  # by file name: mypy may replay a cached result under an earlier tmp path
        return [line for line in out.splitlines() if line.split(":", 1)[0].endswith("/" + path.name)]

    assert proc.returncode == 1, out + proc.stderr
    for name, (_, error) in SNIPPETS.items():
        lines = of(files[name])
        assert any(error in line and ": error: " in line for line in lines), (name, lines, out)
    correct_lines = of(correct)
    assert not [line for line in correct_lines if ": error: " in line], correct_lines
    revealed = [line.split("Revealed type is ", 1)[1] for line in correct_lines if "Revealed type is" in line]
    assert revealed == [
        '"novelforge_client.models.HandoffOut | None"',
        '"novelforge_client.models.SessionOut"',
        '"novelforge_client.runtime.AsyncRuntimeLease"',
        '"novelforge_client.runtime.AsyncRuntimeLease"',
        '"novelforge_client.models.RunOut"',
        '"novelforge_client.runtime.RuntimeLease"',
    ], correct_lines
    assert not list(ROOT.glob("snippet_*.py"))  # nothing written into the checkout


# ---- the typed async example runs --------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_the_typed_async_example_runs_a_session_against_the_server(server, token):
    from novelforge_sessions.models import Checkpoint, RuntimeAttachment, Session

    proc = subprocess.run([sys.executable, "examples/async_agent.py", "--url", server.url, "--token", token,
                           "--lease", "5"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "NOVELFORGE_TOKEN": ""},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = Session.objects.get(runtime_family="async-example")
    assert f"session {s.id} is {s.status}" in proc.stdout
    assert s.run_count == 1 and s.status not in ("running", "created")
    (attachment,) = RuntimeAttachment.objects.filter(session=s)
    assert attachment.ended_at is not None  # the async lease detached on exit
    (cp,) = Checkpoint.objects.filter(run__session=s)
    assert cp.boundary == "context_freeze" and f"checkpoints [{cp.seq}]" in proc.stdout
