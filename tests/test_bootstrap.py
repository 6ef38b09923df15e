"""The fresh-machine path of ``scripts/bootstrap.sh``.

With no usable PostgreSQL the bootstrap starts a project-local cluster (and, in test mode, a local
Redis). The daemons outlive the script, so they must not inherit the pipe of the caller's
``$(scripts/bootstrap.sh run)``: if they do, the capture never sees end of input and ``make run``
hangs forever. These tests run that path for real, on other ports and in throwaway directories
(never the checkout's ``.pgdata``/``.redis`` nor its ``.env.bootstrap``), through a ``$(…)``
capture with a timeout, check that the services answer, and stop them.
"""
from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from tests.support.servers import ROOT, free_port

SCRIPT = ROOT / "scripts" / "bootstrap.sh"
CAPTURE_TIMEOUT = 60  # normally ~3 s (initdb + start); a hang is what this catches

pytestmark = pytest.mark.skipif(
    not glob.glob("/usr/lib/postgresql/*/bin/initdb"), reason="PostgreSQL server binaries not installed"
)


def _capture(mode: str, env: dict[str, str], workdir: Path) -> dict[str, str]:
    """``exports="$(scripts/bootstrap.sh MODE)" && eval "$exports"``, as the Makefile does; returns
    the exported variables. Fails (instead of hanging) when the capture does not return."""
    shell = (
        f'exports="$({SCRIPT} {mode})" && eval "$exports" && '
        'printf "DATABASE_URL=%s\\nTEST_REDIS_URL=%s\\n" "${DATABASE_URL:-}" "${TEST_REDIS_URL:-}"'
    )
    log = workdir / "bootstrap.stderr"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            ["bash", "-c", shell], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, start_new_session=True
        )
        try:
            out, _ = proc.communicate(timeout=CAPTURE_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(
                f"$(scripts/bootstrap.sh {mode}) did not return within {CAPTURE_TIMEOUT} s "
                f"(a daemon holds the capture's pipe?)\n{log.read_text(errors='replace')}"
            )
    assert proc.returncode == 0, log.read_text(errors="replace")
    values = dict(line.split("=", 1) for line in out.decode().splitlines() if "=" in line)
    return values


@pytest.fixture
def sandbox():
    """Throwaway service directories under /tmp (the postgres user must be able to reach them) and
    an environment pointing the bootstrap at them; everything is stopped and removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix="nf-bootstrap-", dir="/tmp"))
    os.chmod(work, 0o755)
    pg_dir, redis_dir = work / "pg", work / "redis"
    env = {
        k: v for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "TEST_REDIS_URL", "FORCE_LOCAL_PG", "FORCE_LOCAL_REDIS"}
    }
    env.update(
        LOCAL_PG_DIR=str(pg_dir),
        LOCAL_PG_PORT=str(free_port()),
        LOCAL_REDIS_DIR=str(redis_dir),
        LOCAL_REDIS_PORT=str(free_port()),
        LOCAL_DB_NAME="nf_bootstrap_check",
        BOOTSTRAP_ENV_FILE=str(work / "env.bootstrap"),
        BOOTSTRAP_PYTHON=sys.executable,  # never create or install into a .venv
    )
    try:
        yield work, env
    finally:
        subprocess.run([str(SCRIPT), "stop"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)
        pid_file = redis_dir / "redis.pid"
        if pid_file.exists():  # the stop above failed: make sure nothing outlives the test
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
            except (ValueError, ProcessLookupError):
                pass
        if (pg_dir / "data" / "postmaster.pid").exists():
            pg_ctl = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))[-1]
            cmd = [pg_ctl, "-D", str(pg_dir / "data"), "-m", "immediate", "-w", "stop"]
            if os.geteuid() == 0:
                cmd = ["runuser", "-u", "postgres", "--", *cmd]
            subprocess.run(cmd, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60, check=False)
        shutil.rmtree(work, ignore_errors=True)


def _answers(url: str) -> None:
    with psycopg.connect(url, connect_timeout=5) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("nf_bootstrap_check",)


def test_the_local_cluster_path_returns_through_a_capture_and_the_cluster_answers(sandbox):
    work, env = sandbox
    env["FORCE_LOCAL_PG"] = "1"
    values = _capture("run", env, work)
    url = values["DATABASE_URL"]
    assert url == f"postgres://postgres@127.0.0.1:{env['LOCAL_PG_PORT']}/nf_bootstrap_check"
    _answers(url)
    assert (work / "pg" / "data" / "PG_VERSION").exists(), "the cluster lives in LOCAL_PG_DIR"
    assert (work / "env.bootstrap").read_text().endswith(f"export DATABASE_URL={url}\n")
    # A second run reuses the running cluster, and returns too.
    assert _capture("run", env, work)["DATABASE_URL"] == url


@pytest.mark.skipif(not (shutil.which("redis-server") and os.access("/usr/bin/chromium", os.X_OK)),
                    reason="test mode needs redis-server and Debian's chromium installed")
def test_the_local_redis_path_returns_through_a_capture_and_redis_answers(sandbox):
    import redis

    work, env = sandbox
    env.update(FORCE_LOCAL_PG="1", FORCE_LOCAL_REDIS="1")
    values = _capture("test", env, work)
    _answers(values["DATABASE_URL"])
    assert values["TEST_REDIS_URL"] == f"redis://127.0.0.1:{env['LOCAL_REDIS_PORT']}/0"
    assert redis.Redis.from_url(values["TEST_REDIS_URL"], socket_timeout=5).ping() is True
    assert (work / "redis" / "redis.pid").exists(), "Redis keeps its files in LOCAL_REDIS_DIR"
