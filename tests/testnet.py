"""Names and subnets of the test hosts' networks, shifted by GPUPROV_TEST_NET (0-9, default 0).

Two test runs on one machine (two checkouts, say) each need their own namespaces, bridges and
subnets: give the second run GPUPROV_TEST_NET=1. With 0 the names are the historical ones.
"""

from __future__ import annotations

import os

NET = int(os.environ.get("GPUPROV_TEST_NET", "0") or 0)
if not 0 <= NET <= 9:
    raise ValueError(f"GPUPROV_TEST_NET={NET}: use 0-9")


def prefix(base: str) -> str:
    """Namespace prefix: 'gpt' stays 'gpt' for run 0, becomes 'gp1t' for run 1."""
    return base if NET == 0 else f"{base[:2]}{NET}{base[2:]}"


def bridge(base: str) -> str:
    """Bridge name: 'gptbr0' -> 'gptbr1' for run 1."""
    return base[:-1] + str(NET)


def subnet(base: str) -> str:
    """First three octets: '10.210.0' -> '10.210.1' for run 1."""
    return base.rsplit(".", 1)[0] + f".{NET}"
