"""Descriptor numbers past ``select()``'s FD_SETSIZE (1,024), for the tests of the code that must
take them (a process holding that many sockets gets such numbers for the next ones it opens)."""
from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

#: The largest descriptor ``select()`` takes, plus one.
FD_SETSIZE = 1024


@contextmanager
def descriptors_up_to(highest: int, *, taken: int = 0) -> Iterator[None]:
    """This process may number descriptors up to ``highest`` while inside (its soft limit raised
    when lower, put back after); with ``taken``, that many more descriptors are held open inside,
    so the next ones opened are numbered past them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= highest:
        if hard != resource.RLIM_INFINITY and hard <= highest:
            pytest.fail(f"this machine allows {hard} descriptors: the test needs more than {highest}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
    held: list[int] = []
    try:
        held.extend(os.open(os.devnull, os.O_RDONLY) for _ in range(taken))
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
