"""``POST /api/v1/floor`` with ``{"cursor": {...}}``: one INSERT, committed on its own, answered 201.

What a bare django-ninja project pays for one durable write: no auth, no validation beyond the
schema, no event, no wake-up. The table is created by the bench before the server starts. It is
mounted under ``/api/v1/`` so that ``floorapp/asgi.py`` serves it through the same lean path as
the checkpoint route.
"""
import json
from typing import Any

from django.db import connection
from django.urls import path
from ninja import NinjaAPI, Schema

api = NinjaAPI(urls_namespace="floor")
TABLE = "bench_floor_api"


class In(Schema):
    cursor: dict[str, Any]


class Out(Schema):
    id: int


@api.post("/floor", response={201: Out})
def floor(request: Any, body: In) -> tuple[int, dict[str, int]]:
    with connection.cursor() as cur:
        cur.execute(f"INSERT INTO {TABLE} (cursor) VALUES (%s::jsonb) RETURNING id", [json.dumps(body.cursor)])
        return 201, {"id": cur.fetchone()[0]}


def healthz(request: Any) -> Any:
    from django.http import HttpResponse

    return HttpResponse("ok")


urlpatterns = [path("healthz", healthz), path("api/v1/", api.urls)]
