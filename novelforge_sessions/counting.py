"""Counts a page shows beside a list, bounded.

A page that says how many rows a list holds must not read them all to say it: a session with
half a million finished handoffs, or a reviewer with thousands of assignments, would make
every load of the page read them. So a page counts up to ``COUNT_CAP`` and says "more than"
beyond (``dashboard_words.at_most``); the list itself pages by keyset.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import QuerySet

#: The largest count a page spells out; above it, it says "1000+".
COUNT_CAP = 1000


def count_up_to(qs: QuerySet, *, order: Sequence[Any] = ()) -> int:
    """How many rows ``qs`` has, up to ``COUNT_CAP + 1`` (one statement: a count over a limited
    subquery).

    Any ``COUNT_CAP + 1`` rows will do, so the model's default order (which would sort every
    row first) is dropped. Where the planner might then pick a scan that stops only after
    reading much of the table (the rows counted are most of it, but scattered), ``order``
    names an index's own order, and the count walks that index and stops at the cap."""
    return qs.order_by(*order)[: COUNT_CAP + 1].count()


def shown(count: int) -> str:
    """A count as a page shows it: "1000+" once it passes ``COUNT_CAP``."""
    return f"{COUNT_CAP}+" if count > COUNT_CAP else str(count)
