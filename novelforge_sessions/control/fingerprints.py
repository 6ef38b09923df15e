"""Server-computed fingerprints: sha256 over canonical JSON. Pure, no I/O."""
from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    """One byte string per JSON value: sorted keys, no whitespace, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def fingerprint(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def job_fingerprint(*, inputs: list[dict[str, Any]], params: dict[str, Any], result_schema: dict[str, Any]) -> str:
    """The frozen job: its input refs + fingerprints (sorted), its instructions and result schema."""
    return fingerprint({"inputs": inputs, "params": params, "result_schema": result_schema})
