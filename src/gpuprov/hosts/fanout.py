"""Run one function per host in a bounded thread pool, results in input order.

Each call must turn its own failures into its result (as bootstrap and check do), so one bad
host never stops or hides the others; the pool bound keeps hundreds of hosts from opening
hundreds of connections at once (Fabric's ThreadingGroup has no bound). An interrupt leaves at once.
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
    pool = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(items))))
    try:
        results = list(pool.map(fn, items))
    except BaseException:
        # Ctrl-C or a termination signal (raised in this, the main, thread): the caller's take-back must run
        # now, not once every host's step has ended; the workers are abandoned (cli.run does not wait for them)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return results
