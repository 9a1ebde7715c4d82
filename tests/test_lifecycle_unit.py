"""Pure parts of the lifecycle: launch order, names, SSH CIDR, state store semantics."""

from __future__ import annotations

import threading

import pytest

from gpuprov.cloud.failover import candidates
from gpuprov.cloud.launch import check_name, ssh_cidr
from gpuprov.errors import UserInputError
from gpuprov.plan.plan import NodeRequest, make_plan
from gpuprov.state.sqlite import SqliteStore


def test_candidates_spot_first_cheapest_type_first_then_on_demand_with_fallback():
    plan = make_plan(NodeRequest(gpu="A10G", spot=True))
    offerings = {"g5.xlarge": ["us-east-1a", "us-east-1b"], "g5.2xlarge": ["us-east-1a"]}
    order = [(c.instance_type, c.zone, c.market) for c in candidates(plan, offerings, True, True).candidates]
    assert order == [
        ("g5.xlarge", "us-east-1a", "spot"), ("g5.xlarge", "us-east-1b", "spot"), ("g5.2xlarge", "us-east-1a", "spot"),
        ("g5.xlarge", "us-east-1a", "on-demand"), ("g5.xlarge", "us-east-1b", "on-demand"),
        ("g5.2xlarge", "us-east-1a", "on-demand"),
    ]
    assert all(c.market == "spot" for c in candidates(plan, offerings, True, False).candidates)
    assert {c.zone for c in candidates(plan, offerings, True, False, zone="us-east-1b").candidates} == {"us-east-1b"}
    assert candidates(plan, {}, True, True).candidates == ()


def test_on_demand_request_never_tries_spot():
    plan = make_plan(NodeRequest(gpu="L4"))
    assert {c.market for c in candidates(plan, {"g6.xlarge": ["us-east-1a"]}, False, True).candidates} == {"on-demand"}


@pytest.mark.parametrize("bad", ["Bad", "-x", "a_b", "x" * 40, "a;b"])
def test_node_names(bad):
    assert check_name("train-1") == "train-1"
    with pytest.raises(UserInputError):
        check_name(bad)


def test_ssh_cidr_is_the_callers_address_unless_given():
    assert ssh_cidr(None, lookup=lambda: "203.0.113.7") == "203.0.113.7/32"
    assert ssh_cidr("10.0.0.0/8") == "10.0.0.0/8"
    with pytest.raises(UserInputError) as exc:
        ssh_cidr(None, lookup=lambda: (_ for _ in ()).throw(OSError("offline")))
    assert exc.value.field == "--ssh-cidr"
    with pytest.raises(UserInputError):
        ssh_cidr("not-a-cidr")


def test_store_records_intent_before_creation_and_survives_concurrent_writers(tmp_path):
    store = SqliteStore(tmp_path / "state.sqlite")
    store.create_node("n1", "aws", "us-east-1")
    rid = store.intend("n1", "instance", "us-east-1", "tok-1")
    (row,) = store.resources("n1")
    assert (row.status, row.client_token, row.cloud_id) == ("intent", "tok-1", None)
    store.created(rid, "i-123")
    assert store.resources("n1")[0].cloud_id == "i-123"
    with pytest.raises(UserInputError):
        store.create_node("n1", "aws", "us-east-1")  # a live name is not reused

    def writer(k: int) -> None:
        other = SqliteStore(tmp_path / "state.sqlite")
        for j in range(25):
            other.event("n1", "test", f"{k}-{j}")

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store.events("n1")) == 200
    assert oct((tmp_path / "state.sqlite").stat().st_mode & 0o777) == "0o600"


def test_price_cap_skips_types_over_it_and_says_why():
    plan = make_plan(NodeRequest(gpu="A10G"))
    offerings = {it.name: ["us-east-1a"] for it in plan.candidates}
    order = candidates(plan, offerings, False, False, max_hourly=1.5)
    kept = {c.instance_type for c in order.candidates}
    assert kept and all(c.price_usd_hour is not None and c.price_usd_hour <= 1.5 for c in order.candidates)
    skipped = {s.instance_type: s.reason for s in order.skipped}
    assert "g5.48xlarge" in skipped and "over --max-hourly $1.50" in skipped["g5.48xlarge"]
    assert kept.isdisjoint(skipped)


def test_ssh_cidr_refuses_empty_and_takes_ipv6():
    with pytest.raises(UserInputError):
        ssh_cidr("")
    assert ssh_cidr("2001:db8::7/128") == "2001:db8::7/128"
    assert ssh_cidr(None, lookup=lambda: "2001:db8::7") == "2001:db8::7/128"


def test_teardown_cancels_spot_requests_before_it_terminates_instances(tmp_path, monkeypatch):
    """A persistent spot request relaunches a terminated instance: its request is cancelled first."""
    from gpuprov.cloud.teardown import teardown

    calls: list[str] = []

    class Fake:
        name = "fake"

        def find_launched(self, region, token):
            return []

        def instances(self, region, *, ids=(), node=None):
            return []

        def terminate(self, region, ids, settle):
            calls.append(f"terminate {','.join(ids)}")

        def wait_terminated(self, region, ids, timeout=900):
            pass

        def delete(self, resource, settle=0):
            calls.append(f"delete {resource.kind} {resource.id}")

        def tagged(self, region):
            return []

        def find_security_group(self, region, name):
            return None

    store = SqliteStore(tmp_path / "state.sqlite")
    store.create_node("p", "fake", "us-east-1", market="spot", spot_type="persistent")
    store.created(store.intend("p", "instance", "us-east-1", "tok"), "i-1")
    store.add_resource("p", "spot-request", "us-east-1", "sir-1")
    store.add_resource("p", "volume", "us-east-1", "vol-1")
    from gpuprov.cloud import destroy
    from gpuprov.state import locks

    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path))
    with locks.hold(locks.node("p"), "test"), destroy.take_back("p", "test"):  # teardown runs inside the gate
        result = teardown("p", "us-east-1", Fake(), store, lambda _line: None)  # type: ignore[arg-type]
    assert result.complete
    assert calls == ["delete spot-request sir-1", "terminate i-1", "delete volume vol-1"]


def test_a_node_on_a_new_address_keeps_its_pinned_host_key(tmp_path, monkeypatch):
    from gpuprov.hosts import sshconfig

    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path))
    known = sshconfig.node_known_hosts("n")
    known.write_text("203.0.113.5 ssh-ed25519 AAAAkey\n")
    sshconfig.move_node_key("n", "198.51.100.9")
    assert known.read_text() == "198.51.100.9 ssh-ed25519 AAAAkey\n"
    monkeypatch.setenv("HOME", str(tmp_path))
    sshconfig.add_node("n", "198.51.100.9", "ubuntu", "/k")
    assert "HostName 198.51.100.9" in sshconfig.config_path().read_text()
