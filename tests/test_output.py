"""Output that reads anywhere: piped, at 80 and 200 columns, with NO_COLOR, with -q, and as JSON.
Through the real CLI, as a user runs it (pipes, not a terminal, unless a pty is asked for)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuprov.plan import catalog
from tests import forkcli


def run(*args: str, home: Path, columns: int | None = None, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "AWS_ENDPOINT_URL")}
    env.update({"GPUPROV_HOME": str(home), "NO_COLOR": "1", **env_extra})
    if columns:
        env["COLUMNS"] = str(columns)
    return forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=60)


def in_pty(*args: str, home: Path, answer: bytes = b"", **env_extra: str) -> tuple[int, bytes]:
    """`gpuprov ARGS` on a terminal; `answer`: what is typed there (read by a question, if one is asked)."""
    import pty

    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    env.update({"GPUPROV_HOME": str(home), "TERM": "xterm-256color", **env_extra})
    leader, follower = pty.openpty()
    os.write(leader, answer)
    proc = forkcli.run([sys.executable, "-m", "gpuprov", *args], stdin=follower, stdout=follower, stderr=follower,
                       env=env, timeout=60)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.returncode, out


@pytest.fixture
def nodes(tmp_path: Path) -> Path:
    """A state dir with two nodes, one with a long name, an IPv6 address and a long reason."""
    home = tmp_path / "home"
    os.environ["GPUPROV_HOME"] = str(home)
    try:
        from gpuprov.state import open_store

        store = open_store()
        store.create_node("train-llama-70b", "aws", "us-east-1", zone="us-east-1b", gpu="A100-80GB", gpu_count=8,
                          instance_type="p4de.24xlarge", market="spot", state="ready", address="203.0.113.254",
                          ssh_user="ubuntu", price_usd_hour=40.97, autostop_seconds=1800, ttl_seconds=36000,
                          ttl_deadline=time.time() + 30000)
        store.create_node("exp1", "aws", "eu-west-1", zone="eu-west-1a", gpu="L40S", gpu_count=1,
                          instance_type="g6e.xlarge", market="spot", state="interrupted",
                          state_reason="Server.SpotInstanceTermination: Spot instance termination",
                          address="2001:db8::1234:5678", ssh_user="ubuntu", price_usd_hour=1.86)
    finally:
        del os.environ["GPUPROV_HOME"]
    return home


def test_gpus_piped_keeps_every_instance_type_whole_on_its_row(tmp_path: Path) -> None:
    out = run("gpus", home=tmp_path).stdout  # piped, no COLUMNS: rich's 80
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    for it in catalog.load().instance_types:
        if it.cpu_only:  # `gpus` lists the GPU types; `plan --cpu N` the CPU-only ones
            assert it.name not in out
            continue
        (row,) = [line for line in lines if re.search(rf"\b{re.escape(it.name)}\b", line)]
        price = f"${it.price_usd_hour:,.2f}" if it.price_usd_hour is not None else "n/a"
        assert ("retired" if it.retired else price) in row  # a type EC2 no longer describes says so, not a price
    assert "left out at this width" in out  # says which columns did not fit


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_gpus_at_a_width_never_splits_a_name_and_shows_more_when_wider(tmp_path: Path, columns: int) -> None:
    out = run("gpus", home=tmp_path, columns=columns).stdout
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= columns
    for gpu in catalog.load().gpus:
        assert any(re.search(rf"│ {re.escape(gpu.name)} +│", line) for line in lines), gpu.name
    assert any("┃ good for" in line for line in lines) == (columns >= 120)
    assert any("p4d.24xlarge" in line and "$21.96" in line for line in lines)


def test_status_at_80_columns_keeps_names_addresses_and_money(nodes: Path) -> None:
    out = run("status", home=nodes, columns=80).stdout
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    (row,) = [line for line in lines if "train-llama-70b" in line]
    assert "203.0.113.254" in row and "8× A100-80GB" in row and "ready" in row
    (row,) = [line for line in lines if line.lstrip().startswith("exp1 ")]
    assert "2001:db8::1234:5678" in row and "interrupted" in row  # no ':1234:' emoji either
    assert "left out at this width" in out


def test_status_at_80_columns_keeps_the_guardrails(nodes: Path) -> None:
    """What is about to stop a node (or let it run up a bill) stays: zone, market, type and age go first."""
    out = run("status", home=nodes, columns=80).stdout
    assert max(len(line) for line in out.splitlines()) <= 80
    block = " ".join(out[out.index("train-llama-70b"):out.index("exp1")].split())  # its row, and a line beneath
    assert "30m idle, TTL 8h" in block and "→ terminate" in block
    assert "left out at this width: type, market, zone" in out and "autostop" not in out.split("left out")[1]


def test_a_stopped_node_has_no_hourly_price_and_a_cluster_counts_its_gpus(tmp_path: Path) -> None:
    home = tmp_path / "home"
    os.environ["GPUPROV_HOME"] = str(home)
    try:
        from gpuprov.state import open_store

        store = open_store()
        store.create_node("parked", "aws", "us-east-1", zone="us-east-1a", gpu="L40S", gpu_count=1,
                          instance_type="g6e.xlarge", market="on-demand", state="stopped", address="10.0.0.5",
                          ssh_user="ubuntu", price_usd_hour=1.86, disk_gb=100, stopped_at=time.time())
        store.create_node("pair", "aws", "us-east-1", zone="us-east-1a", gpu="T4", gpu_count=1, cluster_size=2,
                          instance_type="g4dn.xlarge", market="on-demand", state="ready", address="10.0.0.6",
                          ssh_user="ubuntu", price_usd_hour=0.526,
                          members_json=json.dumps([{"rank": r, "instance_id": f"i-{r}", "private_ip": f"10.0.0.{6 + r}",
                                                    "public_ip": None, "address": f"10.0.0.{6 + r}", "state": "running",
                                                    "allocation_id": None} for r in range(2)]))
    finally:
        del os.environ["GPUPROV_HOME"]
    out = run("status", home=home, columns=200).stdout
    (parked,) = [line for line in out.splitlines() if line.lstrip().startswith("parked ")]
    assert "$1.86" not in parked and "(disk $8.00/month)" in parked  # compute is not billed while stopped
    (pair,) = [line for line in out.splitlines() if line.lstrip().startswith("pair ")]
    assert "2× T4 (2 nodes)" in pair and "2×1×" not in pair and "$1.05" in pair
    assert "(1 GPU, 4 vCPU" in run("plan", "--gpu", "t4", home=home).stdout  # not "1 GPUs"


def test_columns_0_falls_back_to_80(tmp_path: Path) -> None:
    """COLUMNS=0 (some CI runners, `docker exec` without -t) made rich print nothing at all."""
    for columns in ("0", "abc", ""):
        result = run("gpus", home=tmp_path, COLUMNS=columns)
        lines = result.stdout.splitlines()
        assert result.returncode == 0 and any("g4dn.xlarge" in line for line in lines), columns
        assert max(len(line) for line in lines) <= 80


def test_a_reader_that_leaves_early_is_no_error(tmp_path: Path) -> None:
    """`gpuprov plan … | head -1`: exit 0, nothing on stderr but the region line."""
    for args in (["plan", "--gpu", "h100:8", "--show-scripts"], ["gpus"], ["plan", "--gpu", "t4", "--json"]):
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "AWS_ENDPOINT_URL")}
        env.update({"GPUPROV_HOME": str(tmp_path), "NO_COLOR": "1"})
        proc = forkcli.Popen([sys.executable, "-m", "gpuprov", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        proc.stdout.close()  # the reader leaves after one line, as head -1 does
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0, err
        assert [line for line in err.splitlines() if not line.startswith("region ")] == [], err


def test_status_at_200_columns_shows_every_column_on_one_line(nodes: Path) -> None:
    out = run("status", home=nodes, columns=200).stdout
    (row,) = [line for line in out.splitlines() if "train-llama-70b" in line]
    for cell in ("p4de.24xlarge", "spot", "us-east-1b", "$40.97", "30m idle"):
        assert cell in row
    assert "left out" not in out


COLOR = re.compile(rb"\x1b\[(?:[0-9;]*;)?(?:3[0-8]|4[0-8]|9[0-7]|10[0-7])[;m]")  # SGR colours, not bold/italic


def test_no_color_on_a_terminal_prints_no_colour(nodes: Path) -> None:
    code, out = in_pty("status", home=nodes, NO_COLOR="1", COLUMNS="120")
    assert code == 0 and b"train-llama-70b" in out and not COLOR.search(out)
    assert COLOR.search(in_pty("status", home=nodes, COLUMNS="120")[1])  # the states are coloured otherwise
    code, out = in_pty("plan", "--gpu", "rtx9999", home=nodes, NO_COLOR="1")
    assert code == 2 and b"\x1b[" not in out
    code, out = in_pty("plan", "--gpu", "rtx9999", home=nodes)  # without NO_COLOR the error is red
    assert code == 2 and b"\x1b[31m" in out


def test_quiet_leaves_out_progress_but_not_results(tmp_path: Path) -> None:
    loud = run("plan", "--gpu", "t4", "--json", home=tmp_path)
    assert "region us-east-1 (from default)" in loud.stderr
    for flag in ("-q", "--quiet"):
        quiet = run("plan", "--gpu", "t4", "--json", flag, home=tmp_path)
        assert quiet.returncode == 0 and quiet.stderr == ""
        assert json.loads(quiet.stdout)["instance_type"] == "g4dn.xlarge"
    assert "-q, --quiet" in run("down", "--help", home=tmp_path).stdout


def test_down_all_with_nothing_is_nothing_to_do(tmp_path: Path) -> None:
    result = run("down", "--all", home=tmp_path)
    assert result.returncode == 0 and "nothing to do" in result.stdout
    as_json = run("down", "--all", "--json", home=tmp_path)
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == {}


@pytest.mark.parametrize("args", [["down", "exp1"], ["down", "--all"]])
def test_up_and_down_without_a_terminal_say_pass_yes(nodes: Path, args: list[str]) -> None:
    result = run(*args, home=nodes)
    assert result.returncode == 2
    assert "error: --yes: no terminal to confirm on" in result.stderr and "pass --yes (or -y)" in result.stderr
    assert "Aborted" not in result.stderr


def test_up_without_credentials_says_so_before_it_asks(nodes: Path) -> None:
    """With no AWS credentials the plan's instance types cannot be read: that is the error, before the question
    (tests/test_cloud_fast.py: with credentials and no terminal, `--yes: no terminal to confirm on`)."""
    result = run("up", "x", "--gpu", "t4", home=nodes)
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    assert result.returncode == 2 and line == "error: AWS credentials: none found", result.stderr


def test_up_on_a_terminal_says_the_name_is_taken_before_it_asks(nodes: Path) -> None:
    code, out = in_pty("up", "train-llama-70b", "--gpu", "t4", home=nodes, answer=b"n\n", NO_COLOR="1")
    assert code == 2 and b"error: NAME: a node called 'train-llama-70b' already exists" in out
    assert b"Launch" not in out and b"[y/N]" not in out


@pytest.mark.parametrize("command", ["gpus", "plan", "up", "start", "status", "down", "gc", "bootstrap", "check", "doctor",
                                     "monitor", "bench"])
def test_every_command_that_prints_a_table_has_json(tmp_path: Path, command: str) -> None:
    assert "--json" in run(command, "--help", home=tmp_path).stdout


@pytest.mark.parametrize("command", ["up", "down", "gc"])
def test_yes_has_a_short_form(tmp_path: Path, command: str) -> None:
    assert "-y, --yes" in run(command, "--help", home=tmp_path).stdout


def test_down_and_gc_speak_json(aws, env):
    from tests.aws.cli import gp, nothing_left, up_args

    assert gp(env, *up_args("js", "--gpu", "T4", "--no-bootstrap", "--no-wait")).returncode == 0
    found = gp(env, "gc", "--json")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["found"] == []  # a live node's resources are not orphans
    down = gp(env, "down", "js", "-y", "--json")
    assert down.returncode == 0, down.stderr
    result = json.loads(down.stdout)  # progress lines went to stderr
    assert result["js"]["complete"] is True and result["js"]["left"] == []
    assert any(r.startswith("instance i-") for r in result["js"]["removed"]), result
    nothing_left(aws)


def test_gpus_filters_by_name(tmp_path: Path) -> None:
    out = run("gpus", "H100", "a100-80gb", home=tmp_path, columns=200).stdout
    assert "p5.48xlarge" in out and "p4de.24xlarge" in out
    assert "g4dn.xlarge" not in out and "p4d.24xlarge" not in out and "B200" not in out
    data = json.loads(run("gpus", "h100:8", "--json", home=tmp_path).stdout)
    assert [g["name"] for g in data["gpus"]] == ["H100"]


def test_plan_hours_prints_the_estimate(tmp_path: Path) -> None:
    price = catalog.load().instance_type("p4d.24xlarge").price_usd_hour
    assert price is not None
    out = run("plan", "--gpu", "a100:8", "--hours", "10", home=tmp_path, columns=120).stdout
    assert f"estimate for 10h: ${price * 10:,.2f} at the on-demand list price ${price:,.2f}/h" in out
    data = json.loads(run("plan", "--gpu", "a100:8", "--hours", "2.5", "--json", home=tmp_path).stdout)
    assert data["estimate"] == {"hours": 2.5, "instance_type": "p4d.24xlarge", "usd_hour_on_demand": price,
                                "usd_on_demand": round(price * 2.5, 2)}


def test_prose_cells_keep_their_words_whole_and_a_left_out_column_can_go_beneath() -> None:
    from rich.console import Console

    from gpuprov.cli.fittable import Column, FitTable

    table = FitTable([Column("name"), Column("address"), Column("state", prose=True),
                      Column("guards", prose=True, drop=1, beneath=True)])
    table.add_row("train-llama-70b", "2001:db8::1234:5678", "stopped (disk $8.00/month, see the log)", "30m idle → stop")
    console = Console(width=60, record=True, emoji=False)
    console.print(table)
    out = console.export_text()
    assert max(len(line) for line in out.splitlines()) <= 60
    words = [w for line in out.splitlines() for w in line.replace("│", " ").split()]
    assert "$8.00/month," in words and "2001:db8::1234:5678" in words  # never split mid-word
    assert "guards:" in words and "idle" in words  # left out at 60 columns, shown beneath its row


@pytest.fixture
def four_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Four nodes in four states: ready with guardrails, stopped with its disk's cost, interrupted with a long
    reason, bootstrapping."""
    home = tmp_path / "home"
    monkeypatch.setenv("GPUPROV_HOME", str(home))
    from gpuprov.state import open_store

    store = open_store()
    store.create_node("train-llama-70b", "aws", "us-east-1", zone="us-east-1b", gpu="A100-80GB", gpu_count=8,
                      instance_type="p4de.24xlarge", market="spot", state="ready", address="203.0.113.254",
                      ssh_user="ubuntu", price_usd_hour=40.97, autostop_seconds=1800, ttl_seconds=36000,
                      ttl_deadline=time.time() + 30000)
    store.create_node("exp1", "aws", "eu-west-1", zone="eu-west-1a", gpu="L40S", gpu_count=1,
                      instance_type="g6e.xlarge", market="on-demand", state="stopped", address="2001:db8::1234:5678",
                      ssh_user="ubuntu", price_usd_hour=1.86, disk_gb=100, stopped_at=time.time(),
                      autostop_seconds=3600, shutdown_action="stop")
    store.create_node("exp2", "aws", "eu-west-1", zone="eu-west-1a", gpu="L40S", gpu_count=1,
                      instance_type="g6e.xlarge", market="spot", state="interrupted",
                      state_reason="Server.SpotInstanceTermination: Spot instance termination",
                      address="10.1.2.3", ssh_user="ubuntu", price_usd_hour=1.86)
    store.create_node("dev", "aws", "us-west-2", zone="us-west-2a", gpu="T4", gpu_count=1,
                      instance_type="g4dn.xlarge", market="on-demand", state="bootstrapping",
                      address="198.51.100.7", ssh_user="ubuntu", price_usd_hour=0.526, autostop_seconds=1800)
    return home


STATUS_HEADERS = ["name", "GPU", "type", "market", "zone", "state", "address", "$/h", "$ so far", "age",
                  "autostop, TTL"]
STATES = {"train-llama-70b": "ready", "exp1": "stopped", "exp2": "interrupted", "dev": "bootstrapping"}


def _shown_or_named(out: str) -> None:
    """Every node's state is on its row (or in its block), and every column is shown, beneath its row, or named
    in the caption: none is left out unsaid."""
    words = out.split()
    for name, state in STATES.items():
        after = out[out.index(name):]
        assert state in after.split("\n\n")[0] or state in after.splitlines()[0], (name, out)
    header = next((line for line in out.splitlines() if line.lstrip().startswith("name ")), None)
    caption = " ".join(out.split("left out at this width:")[1].split()) if "left out" in out else ""
    for column in STATUS_HEADERS[1:]:
        named = f"{column}:" in " ".join(words) or column in caption.split(" (")[0].split(", ")
        assert named or (header is not None and f" {column} " in f" {header} "), (column, out)


@pytest.mark.parametrize("columns", [40, 60, 66, 80, 106, 120, 124])
def test_status_never_leaves_a_column_out_unsaid(four_nodes: Path, columns: int) -> None:
    """The state column stays at every width (rich's last resort narrowed it to nothing at 66 and 124 columns,
    with the guardrails beside it and no caption); too narrow for a row, each node is a block of its own."""
    import io

    from rich.console import Console

    from gpuprov.cli.report import status_table
    from gpuprov.state import open_store

    console = Console(file=io.StringIO(), width=columns, record=True, emoji=False, highlight=False)
    console.print(status_table(open_store().nodes()))
    out = console.export_text()
    assert max(len(line.rstrip()) for line in out.splitlines()) <= columns
    _shown_or_named(out)
    assert ("train-llama-70b\n" in out) == (columns < 80)  # a block per node below the narrowest table
    assert "203.0.113.254" in out and "2001:db8::1234:5678" in out  # kept whole, either way


def test_status_piped_shows_every_state(four_nodes: Path) -> None:
    out = run("status", home=four_nodes).stdout  # piped, no COLUMNS: rich's 80
    assert max(len(line) for line in out.splitlines()) <= 80
    _shown_or_named(out)


def test_a_mistyped_home_is_no_fresh_state_and_status_names_where_it_looked(tmp_path: Path) -> None:
    """A read-only command makes no state where it looks: a typo in GPUPROV_HOME, or a HOME that does not exist,
    answered `no nodes` while the nodes billed, and left a fresh state tree there."""
    typo = tmp_path / "gpuporv"
    for args in (["status"], ["status", "--json"], ["cluster", "list"], ["state"]):
        assert run(*args, home=typo).returncode == 0, args
        assert not typo.exists(), args
    out = run("status", home=typo).stdout
    assert f"no nodes: there is no state file at {typo / 'state.sqlite'}" in out and "GPUPROV_HOME" in out
    assert run("status", "exp1", home=typo).stderr.startswith(
        f"error: NAME: no node called 'exp1': there is no state file at {typo / 'state.sqlite'}")
    env = {k: v for k, v in os.environ.items() if k not in ("GPUPROV_HOME", "XDG_STATE_HOME", "COLUMNS")}
    nohome = tmp_path / "nohome"
    env.update({"HOME": str(nohome), "NO_COLOR": "1"})
    result = forkcli.run([sys.executable, "-m", "gpuprov", "status"], capture_output=True, text=True, env=env,
                         stdin=subprocess.DEVNULL, timeout=60)
    assert f"there is no state file at {nohome}/" in result.stdout and "HOME" in result.stdout
    assert not nohome.exists()


def test_status_of_a_file_whose_nodes_were_pushed_says_where_they_went(nodes: Path) -> None:
    os.environ["GPUPROV_HOME"] = str(nodes)
    try:
        from gpuprov.state import open_store

        store = open_store()
        for name in ("train-llama-70b", "exp1"):
            store.update_node(name, moved_to="s3://team-bucket/gp/")
    finally:
        del os.environ["GPUPROV_HOME"]
    out = " ".join(run("status", home=nodes, columns=200).stdout.split())
    assert f"no nodes in {nodes / 'state.sqlite'}; 2 nodes of this file moved to s3://team-bucket/gp/" in out
    assert 'set state = "s3://team-bucket/gp/" in config.toml' in out
