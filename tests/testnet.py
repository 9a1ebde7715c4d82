"""Names and subnets of the test hosts' networks, shifted by the run's net number NET.

Two test runs on one machine (two checkouts, say) each need their own namespaces, bridges and
subnets: give the second run GPUPROV_TEST_NET=1 (the base, 0-9, default 0). With NET 0 the names
are the historical ones.

Under pytest-xdist every worker is a run of its own: worker gw<i> takes NET = base + 10*i, so the
workers of one run never meet, and neither do two runs with different bases (base 5 with three
workers uses 5, 15 and 25; base 6 uses 6, 16 and 26). Names and subnets take two digits; NET stays
below 100, so a run has at most 10 workers.
"""

from __future__ import annotations

import os
import re

STRIDE = 10  # worker i's NET = base + STRIDE * i
LIMIT = 100


def net_number(base: str | None, worker: str | None) -> int:
    """NET for GPUPROV_TEST_NET=`base` and PYTEST_XDIST_WORKER=`worker` (None outside xdist)."""
    b = int(base or 0)
    if not 0 <= b < STRIDE:
        raise ValueError(f"GPUPROV_TEST_NET={b}: use 0-9")
    if not worker:
        return b
    m = re.fullmatch(r"gw(\d+)", worker)
    if m is None:
        raise ValueError(f"PYTEST_XDIST_WORKER={worker!r}: expected gw<N>")
    net = b + STRIDE * int(m.group(1))
    if net >= LIMIT:
        raise ValueError(f"xdist worker {worker} with GPUPROV_TEST_NET={b} needs net {net}: at most "
                         f"{LIMIT // STRIDE} workers (-n {LIMIT // STRIDE})")
    return net


# xdist sets PYTEST_XDIST_WORKER in the worker's environment before it imports any conftest
NET = net_number(os.environ.get("GPUPROV_TEST_NET"), os.environ.get("PYTEST_XDIST_WORKER"))


def prefix(base: str) -> str:
    """Namespace prefix: 'gpt' stays 'gpt' for net 0, becomes 'gp1t' for net 1, 'gp15t' for net 15."""
    return base if NET == 0 else f"{base[:2]}{NET}{base[2:]}"


def bridge(base: str) -> str:
    """Bridge name: 'gptbr0' -> 'gptbr1' for net 1, 'gptbr15' for net 15."""
    return base[:-1] + str(NET)


def subnet(base: str) -> str:
    """First three octets: '10.210.0' -> '10.210.1' for net 1, '10.210.15' for net 15."""
    return base.rsplit(".", 1)[0] + f".{NET}"
