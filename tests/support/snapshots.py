"""``snapshot()``: every row of the project's own tables, to show that a request wrote nothing.

Taken before a request and compared after it (``snap.assert_unchanged()``, or ``refused(…,
unchanged=snap)``): any row added, removed or changed in any column fails, with the tables that
differ named. Rows are read in primary-key order with all their columns.

Parameters narrow it only where a write is the documented behaviour of the request under test:
``exclude`` leaves whole tables out (a refused result delivery is recorded in the delivery log);
``ignore`` leaves columns out. By default it leaves out ``ApiToken.last_used_at`` only: the
bookkeeping of authenticating, which every request with a token may do. ``include`` adds tables of
other apps (``"auth.User"`` for the commands that make users).
"""
from __future__ import annotations

from typing import Any, Iterable

from django.apps import apps

#: The apps whose tables a request of this project can write.
PROJECT_APPS = ("novelforge_sessions", "control", "reviews", "webhooks")
#: Columns written by authentication itself, not by the request's work.
BOOKKEEPING = {"novelforge_sessions.ApiToken": frozenset({"last_used_at"})}


class Snapshot(dict):
    """Table label → its rows (tuples of every column, in primary-key order)."""

    def __init__(self, rows: dict[str, list[tuple]], params: dict[str, Any]) -> None:
        super().__init__(rows)
        self.params = params

    def retake(self) -> "Snapshot":
        return snapshot(**self.params)

    def assert_unchanged(self, message: str = "a refused request wrote nothing") -> None:
        after = self.retake()
        changed = sorted(label for label in set(self) | set(after) if self.get(label) != after.get(label))
        assert not changed, f"{message}; changed: " + "; ".join(
            f"{label}: {self.get(label)!r} → {after.get(label)!r}" for label in changed)


def _models(only: Iterable[str] | None, exclude: Iterable[str], include: Iterable[str]):
    excluded = set(exclude)
    models = [m for app in PROJECT_APPS for m in apps.get_app_config(app).get_models()]
    models += [apps.get_model(label) for label in include]
    for model in models:
        label = model._meta.label
        if label in excluded or model.__name__ in excluded:
            continue
        if only is not None and label not in only and model.__name__ not in only:
            continue
        yield label, model


def snapshot(*, only: Iterable[str] | None = None, exclude: Iterable[str] = (), include: Iterable[str] = (),
             ignore: dict[str, Iterable[str]] | None = None) -> Snapshot:
    """Every row of every model of ``PROJECT_APPS`` and of the ``include`` models of other apps (by
    label: ``"auth.User"``), or of the ``only`` models (by label or class name), less the
    ``exclude`` models and the ``ignore`` columns ({label or name: columns}; default ``BOOKKEEPING``)."""
    only = tuple(only) if only is not None else None
    exclude, include = tuple(exclude), tuple(include)
    ignore = {k: frozenset(v) for k, v in (BOOKKEEPING if ignore is None else ignore).items()}
    rows: dict[str, list[tuple]] = {}
    for label, model in _models(only, exclude, include):
        skip = ignore.get(label, frozenset()) | ignore.get(model.__name__, frozenset())
        columns = [f.attname for f in model._meta.concrete_fields if f.attname not in skip]
        rows[label] = list(model._base_manager.order_by("pk").values_list(*columns))
    return Snapshot(rows, {"only": only, "exclude": exclude, "include": include, "ignore": ignore})
