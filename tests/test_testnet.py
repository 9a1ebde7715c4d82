"""The test hosts' networks: one per run and per xdist worker, so parallel workers and parallel runs never meet."""

from __future__ import annotations

import itertools
import re

import pytest

from tests import testnet


def test_a_run_without_xdist_keeps_its_base_and_the_historical_names_at_zero() -> None:
    assert testnet.net_number(None, None) == 0
    assert testnet.net_number("", None) == 0
    assert testnet.net_number("5", None) == 5


def test_each_worker_of_each_base_gets_a_net_of_its_own() -> None:
    nets = {(base, w): testnet.net_number(str(base), f"gw{w}") for base in range(10) for w in range(10)}
    assert len(set(nets.values())) == len(nets)  # no two (run, worker) pairs share a net
    assert nets[(5, 0)] == 5 and nets[(5, 1)] == 15 and nets[(5, 2)] == 25
    assert all(0 <= n < 100 for n in nets.values())


@pytest.mark.parametrize(("base", "worker", "words"), [
    ("10", None, "use 0-9"), ("-1", None, "use 0-9"), ("3", "gw10", "at most 10 workers"), ("0", "main", "gw<N>"),
])
def test_a_net_out_of_range_is_refused(base: str, worker: str | None, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        testnet.net_number(base, worker)


def test_names_and_subnets_differ_between_nets(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, set[str]] = {"prefix": set(), "bridge": set(), "subnet": set()}
    hosts: dict[str, list[str]] = {}  # prefix -> its namespaces
    for net in (0, 1, 5, 10, 15, 51, 99):
        monkeypatch.setattr(testnet, "NET", net)
        for kind, value in (("prefix", testnet.prefix("gpt")), ("bridge", testnet.bridge("gptbr0")),
                            ("subnet", testnet.subnet("10.210.0"))):
            assert value not in seen[kind], (net, kind, value)
            seen[kind].add(value)
        hosts[testnet.prefix("gpt")] = [f"{testnet.prefix('gpt')}{i}" for i in range(1, 9)]
        assert len(testnet.bridge("gpabr0")) <= 15 and len("v" + testnet.prefix("ght") + "8") <= 15  # IFNAMSIZ - 1
    # testhosts.sh finds (and tears down) a run's namespaces as ^<prefix>[0-9]+$: never another net's
    for a, b in itertools.permutations(hosts, 2):
        assert not [ns for ns in hosts[b] if re.fullmatch(rf"{re.escape(a)}[0-9]+", ns)], (a, b)
