"""Tries with a bounded exponential backoff: the one loop behind every "look again a little later" of the providers
and cloud/ (a resource a cloud does not know yet, what a lost answer made, a block whose payment is pending)."""

from __future__ import annotations

import time
from collections.abc import Iterator


def tries(within: float, first: float, most: float) -> Iterator[int]:
    """Yields the number of each try: the first at once, each next one after a pause (`first`, doubling up to
    `most`), as long as that pause would end within `within` seconds of the first try. The caller returns from the
    loop on success; running off its end means the time is up."""
    deadline, wait, number = time.monotonic() + within, first, 1
    yield number
    while time.monotonic() + wait <= deadline:
        time.sleep(wait)
        number += 1
        yield number
        wait = min(wait * 2, most)
