"""Run one function per host in a bounded thread pool, results in input order.

Each call must turn its own failures into its result (as bootstrap and check do), so one bad
host never stops or hides the others; the pool bound keeps hundreds of hosts from opening
hundreds of connections at once (Fabric's ThreadingGroup has no bound).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def run_parallel(items: Sequence[T], fn: Callable[[T], R], parallel: int) -> list[R]:
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(items)))) as pool:
        return list(pool.map(fn, items))
