"""The client stands alone: importing it (and its CLI and worker) loads neither Django nor the
server's packages (import-linter checks the static graph: tests/test_layers.py; this checks a
real interpreter)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_importing_the_client_loads_no_server_code():
    code = (
        "import sys, json, importlib\n"
        "for name in ('novelforge_client', 'novelforge_client.client', 'novelforge_client.runtime'):\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('django', 'channels', 'ninja', 'psycopg', 'novelforge_sessions', 'reviews'))))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
