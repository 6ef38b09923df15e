"""deploy/nginx.conf in front of two real production server processes (``python -m
novelforge_sessions.serve``, uvicorn, as ``make serve-cluster`` starts them) sharing Redis: one address serves pages,
the API and websockets, and a process's SIGTERM costs no request made through nginx (a refused
connection is passed to the other process). Skipped where nginx is not installed."""
from __future__ import annotations

import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
from novelforge_sessions.models import TranscriptEntry
from tests.support.factories import SESSION, make_project
from tests.support.servers import ROOT, DaphneServer, free_port
from tests.support.waits import wait_until
from tests.live.conftest import REDIS_URL, TIMEOUT, api_post
from tests.live.test_graceful_shutdown import post_transcript

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
CONF = ROOT / "deploy" / "nginx.conf"

pytestmark = [
    pytest.mark.skipif(NGINX is None, reason="nginx is not installed"),
    pytest.mark.django_db(transaction=True),
]


def test_the_config_is_valid_as_shipped(tmp_path):
    result = subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-c", str(CONF)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    text = CONF.read_text()
    for needle in ("server 127.0.0.1:8001", "server 127.0.0.1:8002", "proxy_set_header Upgrade $http_upgrade",
                   "proxy_set_header X-Forwarded-Proto $scheme", "proxy_set_header Host $http_host"):
        assert needle in text


@pytest.fixture
def cluster(tmp_path):
    a = DaphneServer(redis_url=REDIS_URL, extra_env={"LIVE_SWEEP_SECONDS": "3600"}, server="uvicorn")
    try:
        b = DaphneServer(redis_url=REDIS_URL, extra_env={"LIVE_SWEEP_SECONDS": "3600"}, server="uvicorn")
    except BaseException:
        a.stop()
        raise
    port = free_port()
    conf = (
        CONF.read_text()
        .replace("127.0.0.1:8001", f"127.0.0.1:{a.port}")
        .replace("127.0.0.1:8002", f"127.0.0.1:{b.port}")
        .replace("listen 8080;", f"listen 127.0.0.1:{port};")
    )
    (tmp_path / "nginx.conf").write_text(conf)
    nginx = subprocess.Popen(
        [NGINX, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "nginx.log", "wb"),
    )
    front = SimpleNamespace(url=f"http://127.0.0.1:{port}", ws_url=f"ws://127.0.0.1:{port}", port=port)
    wait_until(lambda: urllib.request.urlopen(front.url + "/healthz", timeout=1).close() or True,
               f"nginx on {front.url}", timeout=TIMEOUT, ignore=(OSError,), error=RuntimeError,
               fail=lambda: None if nginx.poll() is None else (tmp_path / "nginx.log").read_text())
    yield front, a, b
    nginx.send_signal(signal.SIGTERM)
    nginx.wait(timeout=10)
    a.stop()
    b.stop()


def test_one_address_serves_both_processes_and_survives_one_shutting_down(cluster, open_socket):
    front, a, b = cluster
    project = make_project("behind-nginx")
    _, token = create_token(project, name="agent", permissions=ALL_PERMISSIONS)
    with urllib.request.urlopen(front.url + "/static/js/dashboard.js", timeout=TIMEOUT) as resp:
        assert resp.status == 200

    # The websocket upgrade passes nginx (Origin = nginx's address: Host keeps the port).
    sock = open_socket(front, token=token)
    assert sock.subscribe(project_id=project.id) == []
    session_id = api_post(front, token, "/sessions", SESSION)["id"]
    assert sock.next_event()["session_id"] == session_id
    # Requests alternate between the processes; events reach the socket whichever served them.
    for i in range(4):
        assert post_transcript(front, token, session_id, f"before-{i}") == 201
    assert [e["type"] for e in sock.events_until(sock_last_id(session_id))][-1] == "transcript.appended"

    # SIGTERM on A while writing through nginx: every write is acknowledged (refused → B) and stored.
    a.proc.send_signal(signal.SIGTERM)
    statuses = []
    while a.proc.poll() is None:
        statuses.append(post_transcript(front, token, session_id, f"during-{len(statuses)}"))
    statuses += [post_transcript(front, token, session_id, f"during-{len(statuses) + i}") for i in range(5)]
    assert a.proc.wait(timeout=TIMEOUT) == 0
    assert set(statuses) == {201}, statuses
    stored = set(TranscriptEntry.objects.filter(session_id=session_id).values_list("content", flat=True))
    assert {f"during-{i}" for i in range(len(statuses))} <= stored


def sock_last_id(session_id: int) -> int:
    from novelforge_sessions.models import Event

    return Event.objects.filter(session_id=session_id).order_by("-id").values_list("id", flat=True)[0]
