"""Every `$ gpuprov …` line in the README: each parses as written (commands, options, values), the
offline ones (gpus, plan, render, config, completion) run and exit as the README says, and the
examples that depend on each other agree (the node `jupyter exp1` opens gets JupyterLab). The
launched-node ones run for real in `make demo` and tests/test_aws_lifecycle.py."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from gpuprov.cli import main
from tests import forkcli

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
OFFLINE = {"gpus", "plan", "render", "config", "completion", "facts"}


def examples() -> list[tuple[str, str]]:
    """(the command line without `$ `, its trailing comment)."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", README, re.S):
        for line in block.splitlines():
            if line.startswith("$ gpuprov "):
                words = shlex.split(line[2:], comments=True)
                cut = next((i for i, w in enumerate(words) if w in (">", ">>", "|", ";", "&&")), len(words))
                words = words[:cut]  # the gpuprov part of a shell line
                comment = line.split(" # ", 1)[1] if " # " in line else ""
                found.append((shlex.join(words), comment))
    return found


EXAMPLES = examples()


def test_the_readme_has_examples_for_every_group() -> None:
    commands = {shlex.split(line)[1] for line, _ in EXAMPLES}
    assert {"gpus", "plan", "render", "up", "status", "check", "down", "gc", "jupyter", "sync", "exec", "monitor",
            "ssh", "autostop", "bootstrap", "doctor", "completion", "facts"} <= commands


@pytest.mark.parametrize(("line", "comment"), EXAMPLES, ids=[e[0][:60] for e in EXAMPLES])
def test_each_example_parses_as_written(line: str, comment: str) -> None:
    name, *rest = shlex.split(line)[1:]
    ctx = click.Context(main, info_name="gpuprov")
    cmd = main.get_command(ctx, name)
    assert cmd is not None, line
    with cmd.make_context(name, rest, parent=ctx):  # raises on an unknown option, a bad value, a missing argument
        pass


@pytest.mark.parametrize(("line", "comment"), [e for e in EXAMPLES if shlex.split(e[0])[1] in OFFLINE],
                         ids=[e[0][:60] for e in EXAMPLES if shlex.split(e[0])[1] in OFFLINE])
def test_offline_examples_run_and_exit_as_the_readme_says(line: str, comment: str, tmp_path: Path) -> None:
    if "--live" in line:
        pytest.skip("asks AWS (tests/test_aws_lifecycle.py runs it against the fake endpoint)")
    if " refresh" in line:
        pytest.skip("reads the public sources (tests/test_facts_refresh.py runs it against a local stand-in)")
    env = {**os.environ, "GPUPROV_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "HOME": str(tmp_path), "NO_COLOR": "1"}
    env.pop("AWS_REGION", None)
    result = forkcli.run([sys.executable, "-m", "gpuprov", *shlex.split(line)[1:]], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=120)
    expected = 2 if "exit 2" in comment else 0
    assert result.returncode == expected, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    if expected == 2:
        assert result.stderr.startswith("error: ")


def test_readme_refusals_say_what_the_readme_shows(tmp_path: Path) -> None:
    shown = re.search(r"\$ gpuprov plan --gpu V100 --torch-cuda cu130 .*\n(error: .*)\n  (this works instead: .*)\n",
                      README)
    assert shown
    result = forkcli.run([sys.executable, "-m", "gpuprov", "plan", "--gpu", "V100", "--torch-cuda", "cu130"],
                         capture_output=True, text=True, env={**os.environ, "GPUPROV_HOME": str(tmp_path)})
    assert shown.group(1).split(", …")[0] in result.stderr and shown.group(2) in result.stderr


def test_the_node_jupyter_opens_gets_jupyterlab(tmp_path: Path) -> None:
    """`gpuprov up exp1 …` then `gpuprov jupyter exp1`: the plan `up` runs has the jupyter step."""
    (up_line,) = [line for line, _ in EXAMPLES if line.startswith("gpuprov up exp1 ")]
    assert any(line == "gpuprov jupyter exp1" for line, _ in EXAMPLES)
    words = shlex.split(up_line)[3:]
    ctx = click.Context(main, info_name="gpuprov")
    up = main.get_command(ctx, "up")
    assert isinstance(up, click.Command)
    plan_args = []
    plan_cmd = main.get_command(ctx, "plan")
    assert plan_cmd is not None
    plan_opts = {o for p in plan_cmd.params for o in getattr(p, "opts", [])}
    it = iter(words)
    for word in it:  # keep the options `plan` shares with `up`
        opt = next((p for p in up.params if word in getattr(p, "opts", [])), None)
        takes_value = opt is not None and not getattr(opt, "is_flag", False)
        value = next(it) if takes_value else None
        if word in plan_opts:
            plan_args += [word] + ([value] if value is not None else [])
    result = forkcli.run([sys.executable, "-m", "gpuprov", "plan", "--json", *plan_args], capture_output=True,
                         text=True, env={**os.environ, "GPUPROV_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "jupyter" in [s["name"] for s in __import__("json").loads(result.stdout)["steps"]]


def test_the_inventory_and_config_examples_load(tmp_path: Path) -> None:
    from gpuprov.plan import config
    from gpuprov.plan.inventory import load_inventory

    inventory = re.search(r"```yaml\n(defaults:.*?)```", README, re.S)
    assert inventory
    (tmp_path / "hosts.yml").write_text(inventory.group(1))
    assert [h.name for h in load_inventory(str(tmp_path / "hosts.yml")).hosts] == ["trainer-a", None]
    toml = re.search(r"```toml\n(.*?)```", README, re.S)
    assert toml
    (tmp_path / "config.toml").write_text(toml.group(1))
    os.environ["GPUPROV_CONFIG"] = str(tmp_path / "config.toml")
    try:
        assert config.load().parallel == 64  # every key is one gpuprov knows
    finally:
        del os.environ["GPUPROV_CONFIG"]


# --- the examples that need a node, in the sandbox (`make sandbox`, tools/sandbox.py) ----------------------------
#
# Each README line runs as printed, through bash in a folder holding ./code and the README's hosts.yml, against
# the sandbox's environment (a local AWS endpoint, hosts with shimmed GPUs, gpuprov's config file setting the
# subnet, connect mode, login and OS). One substitution, the sandbox's, not gpuprov's: the hosts "you already
# have" stand at 10.1.NET.3-.5 (NET: this run's test net; 10.1.2 in `make sandbox`). Each host's /tmp, /root,
# /var/lib/gpuprov and /work are its own (the rest of the file system is this machine's).
# Lines marked SETUP are not the README's: what a scenario needs first (a node the README's block assumes) or a
# look at what a line did. stdin is a terminal that answers the confirmation (`y`) or, for `ssh`, `exit 0`.

SETUP = "setup: "
SCENARIOS: dict[str, list[str]] = {
    "a node on AWS": [  # the sandbox's first five minutes, then AWS's
        "gpuprov up try --gpu T4",
        "gpuprov ssh try",
        "gpuprov down try",
        "gpuprov gpus --live --region us-east-1",
        "gpuprov plan --gpu A100:8 --spot --hours 10 --live",
        "gpuprov up train --gpu A100:8 --spot --persistent --fallback on-demand",
        "gpuprov status",
        "gpuprov status train --timeline",
        "gpuprov check train",
        "gpuprov stop train",
        "gpuprov down train",
        "gpuprov gc --yes",
    ],
    "baked images": [
        SETUP + "gpuprov up base --gpu A100:8 --yes",
        "gpuprov image bake base --name a100-stack --yes",
        "gpuprov plan --gpu A100:8 --live",
        "gpuprov up base2 --gpu A100:8",
        "gpuprov up dl --gpu L4 --image dlami",
        "gpuprov image list",
        "gpuprov image rm a100-stack --yes",
        SETUP + "gpuprov down base base2 dl --yes",
    ],
    "a day on a node": [
        "gpuprov plan --gpu L40S --spot --persistent --autostop 30m --budget 50 --hours 8",
        "gpuprov up exp1 --gpu L40S --spot --persistent --jupyter --autostop 30m --budget 50 --instance-profile "
        "ckpt-writer --on-interrupt 'aws s3 sync /work/ckpt s3://me/ckpt'",
        "gpuprov jupyter exp1",
        "gpuprov sync ./code exp1:/work/code",
        # the node's /work is its own: the copy is there, and not in this machine's /work (/proc/1/root: its /)
        SETUP + "gpuprov exec exp1 -- 'cat /work/code/train.py && test ! -e /proc/1/root/work/code/train.py && echo "
        "only on the node'",
        "gpuprov exec exp1 -- nvidia-smi -L",
        "gpuprov monitor exp1",
        "gpuprov ssh exp1",
        "gpuprov autostop exp1 2h",
        "gpuprov ttl exp1 4h",
        "gpuprov status",
        "gpuprov bench exp1",
        "gpuprov stop exp1",
        "gpuprov status",
        "gpuprov start exp1",
        SETUP + "gpuprov up big --gpu L40S --yes",
        "gpuprov stop big && gpuprov start big --gpu L4",
        "gpuprov down exp1",
        SETUP + "gpuprov down big --yes",
    ],
    "when there is no capacity": [
        "gpuprov up t4 --gpu T4 --wait 2h --no-bootstrap",
        "gpuprov capacity list",
        "gpuprov gc --stopped-for 14d",
        SETUP + "gpuprov down t4 --yes",
    ],
    "machines you already have": [
        "gpuprov bootstrap ubuntu@10.1.2.3 -p pytorch --accept-new-host-key",
        "gpuprov bootstrap ubuntu@10.1.2.3 --keep-driver -p pytorch",
        "gpuprov bootstrap --inventory hosts.yml -p llm-finetune --parallel 64 --autostop 2h",
        "gpuprov check ubuntu@10.1.2.3",
        "gpuprov doctor ubuntu@10.1.2.3",
        "gpuprov bench ubuntu@10.1.2.3 --seconds 120 --json",
        "gpuprov bench gpu-box --gpu H100",
    ],
    "a cluster of your hosts": [
        "gpuprov bootstrap --cluster rack ubuntu@10.1.2.3 ubuntu@10.1.2.4 ubuntu@10.1.2.5 -p pytorch",
        "gpuprov exec rack -- 'echo $NODE_RANK of $NNODES via $MASTER_ADDR:$MASTER_PORT'",
        "gpuprov ssh rack:2",
        "gpuprov sync ./code rack:code",
        SETUP + "gpuprov exec rack -- cat code/train.py",
        SETUP + "gpuprov sync ./code rack:1:/tmp/only-node-1",  # NAME:K:PATH: node K alone (/tmp: each host's own)
        SETUP + "gpuprov exec rack -- 'test -e /tmp/only-node-1/train.py && echo has it || echo lacks it'",
        "gpuprov torchrun rack -- code/train.py --epochs 3",
        "gpuprov check rack --cluster",
        "gpuprov cluster list",
        "gpuprov cluster rm rack",
    ],
    "watching a node": [
        "gpuprov up mon --gpu H100:8 --metrics --alert-webhook https://hooks.slack.com/services/T0/B0/XXXX",
        "gpuprov metrics serve --file-sd ~/prometheus/gpuprov.json",
        "gpuprov metrics dashboard > gpu.json",
        SETUP + "python3 -c 'import json; assert json.load(open(\"gpu.json\"))[\"panels\"]'",
        SETUP + "gpuprov down mon --yes",
    ],
    "a cluster on AWS": [
        "gpuprov plan --gpu H100:8 --nodes 2",
        "gpuprov up multi --gpu H100:8 --nodes 4 --min-nodes 3",
        "gpuprov status",
        "gpuprov exec multi -- 'echo $NODE_RANK of $NNODES'",
        "gpuprov check multi --cluster",
        "gpuprov down multi",
    ],
    "working as a team": [  # last: it points the sandbox's config at a bucket, and takes that back at its end
        SETUP + "gpuprov up shared --gpu L4 --no-bootstrap --yes",
        "gpuprov state push s3://acme-gpu-state/team",
        SETUP + "echo 'state = \"s3://acme-gpu-state/team\"' >> \"$GPUPROV_CONFIG\"",
        "gpuprov state",
        "gpuprov team join",
        "gpuprov team sync shared",
        "gpuprov state adopt --region us-east-1",
        "gpuprov state unlock shared",
        SETUP + "gpuprov down shared --yes",
        # the local file pushed from keeps shared's row marked moved (for a local gc): put aside, as after a real move
        SETUP + "mv \"$GPUPROV_HOME/state.sqlite\" \"$GPUPROV_HOME/state.sqlite.pushed\" && "
        "sed -i '/^state = /d' \"$GPUPROV_CONFIG\"",
    ],
}
# what a line prints, where the README says or a user would look for it
SAYS = {
    "gpuprov state push s3://acme-gpu-state/team": "shared: moved to s3://acme-gpu-state/team/",
    "gpuprov state": "versioning: Enabled",
    "gpuprov team sync shared": "member(s) authorized",
    "gpuprov state unlock shared": "shared: no lease held",
    "gpuprov up train --gpu A100:8 --spot --persistent --fallback on-demand": "train is ready: p4d.24xlarge",
    "gpuprov stop train": "train: stopped",
    "gpuprov up base2 --gpu A100:8": "a100-stack",
    "gpuprov up dl --gpu L4 --image dlami": "nvidia-driver: unchanged",
    "gpuprov jupyter exp1": "/lab?token=",
    SETUP + "gpuprov exec exp1 -- 'cat /work/code/train.py && test ! -e /proc/1/root/work/code/train.py && echo "
    "only on the node'": "only on the node",
    "gpuprov exec exp1 -- nvidia-smi -L": "NVIDIA L40S",
    "gpuprov monitor exp1": "L40S",
    "gpuprov stop exp1": "exp1: stopped; its 100 GB disk costs $8.00/month while stopped",
    "gpuprov stop big && gpuprov start big --gpu L4": "g6.xlarge (was g6e.xlarge)",
    "gpuprov bootstrap --inventory hosts.yml -p llm-finetune --parallel 64 --autostop 2h": "trainer-a",
    SETUP + "gpuprov exec rack -- cat code/train.py": "3/3 hosts ok",
    SETUP + "gpuprov exec rack -- 'test -e /tmp/only-node-1/train.py && echo has it || echo lacks it'":
        "rack:0 | lacks it",
    "gpuprov torchrun rack -- code/train.py --epochs 3": "3/3 nodes ok",
    "gpuprov exec multi -- 'echo $NODE_RANK of $NNODES'": "3 of 4",
}
# a terminal stays open until Ctrl-C: these run until they print this, then get SIGINT
UNTIL = {"gpuprov jupyter exp1": "/lab?token=", "gpuprov monitor exp1": "L40S",
         "gpuprov metrics serve --file-sd ~/prometheus/gpuprov.json": "mon: serving"}
TRAIN_PY = "import os, sys\nprint(f\"rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')}: {sys.argv[1:]}\")\n"


def readme_lines() -> list[str]:
    """Every `$ gpuprov …` line of the README's console blocks, as typed (the trailing comment cut off)."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", README, re.S):
        for line in block.splitlines():
            if line.startswith("$ gpuprov "):
                cut = len(line) - 2
                quote = ""
                for i, ch in enumerate(line[2:]):  # the first '#' after a blank, outside quotes
                    if ch in "'\"" and quote in ("", ch):
                        quote = "" if quote else ch
                    elif ch == "#" and not quote and line[2 + i - 1] == " ":
                        cut = i
                        break
                found.append(line[2:2 + cut].strip())
    return found


def needs_a_node(line: str) -> bool:
    return shlex.split(line)[1] not in OFFLINE or "--live" in line


def test_every_readme_line_that_needs_a_node_runs_in_a_sandbox_scenario() -> None:
    lines = readme_lines()
    ran = [step for steps in SCENARIOS.values() for step in steps if not step.startswith(SETUP)]
    assert [line for line in lines if needs_a_node(line) and line not in ran] == []
    assert [step for step in ran if step not in lines] == []  # no scenario runs a line the README lost


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import importlib.util

    from tests import testnet
    from tests.conftest import skip_or_fail

    if os.geteuid() != 0:
        skip_or_fail("the sandbox's SSH hosts need root (network namespaces)")
    spec = importlib.util.spec_from_file_location("sandbox", ROOT / "tools" / "sandbox.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with module.Sandbox(tmp_path_factory.mktemp("sandbox") / "sb", nodes=14, net=testnet.NET,
                        hosts_subnet=testnet.subnet("10.1.2"), prefix=testnet.prefix("gps")) as sb:
        yield sb


def localised(line: str, sb: Any) -> str:
    return line.removeprefix(SETUP).replace("10.1.2.", f"{sb.hosts_subnet}.")


def run_line(line: str, sb: Any, cwd: Path, home: Path) -> tuple[int, str]:
    """`line` through bash, stdin a terminal that answers (`y`, or `exit 0` to a shell); a line in UNTIL
    runs until it prints its words, then gets Ctrl-C."""
    import pty
    import signal
    import threading
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUPROV_"))}
    env.update(sb.env, HOME=str(home), NO_COLOR="1", COLUMNS="120", PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    env = forkcli.shell_env(env)
    leader, follower = pty.openpty()
    proc = subprocess.Popen(["bash", "-c", localised(line, sb)], stdin=follower, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True)
    os.close(follower)
    os.write(leader, b"exit 0\n" if " ssh " in line else b"y\n")
    out: list[str] = []
    reader = threading.Thread(target=lambda: [out.append(x.decode(errors="replace"))
                                              for x in iter(proc.stdout.readline, b"")])  # type: ignore[union-attr]
    reader.start()
    until = UNTIL.get(line)
    deadline = time.monotonic() + 600
    while until and proc.poll() is None and time.monotonic() < deadline and until not in "".join(out):
        time.sleep(0.1)
    if until and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    try:
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        reader.join(10)
        os.close(leader)
    return code, "".join(out)


@pytest.mark.heavy  # the sandbox: root, SSH test hosts, the moto server
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_readme_examples_run_as_printed_in_the_sandbox(scenario: str, sandbox: Any, tmp_path: Path) -> None:
    cwd, home = tmp_path / "here", tmp_path / "home"
    (cwd / "code").mkdir(parents=True)
    (cwd / "code" / "train.py").write_text(TRAIN_PY)
    inventory = re.search(r"```yaml\n(defaults:.*?)```", README, re.S)
    assert inventory
    (cwd / "hosts.yml").write_text(localised(inventory.group(1), sandbox))
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    shutil.copy(sandbox.key, home / ".ssh" / "gpu.pem")  # the README inventory's key: yours for your hosts
    try:
        for line in SCENARIOS[scenario]:
            code, out = run_line(line, sandbox, cwd, home)
            assert code == 0, f"$ {line}\n{out}"
            assert "Traceback" not in out and "gpuprov hit a bug" not in out, f"$ {line}\n{out}"
            assert SAYS.get(line, "") in out, f"$ {line}\n{out}"
            if "only-node-1" in line and "exec" in line:
                assert "rack:1 | has it" in out and "rack:2 | lacks it" in out, out
        left = {k: v for k, v in sandbox.aws.leftovers().items() if v and k != "key_pairs"}
        assert left == {}, left  # every scenario takes down what it made
    finally:  # a failed scenario leaves nothing for the next one to trip on
        run_line(SETUP + "gpuprov down --all --yes", sandbox, cwd, home)
        run_line(SETUP + "sed -i '/^state = /d' \"$GPUPROV_CONFIG\"", sandbox, cwd, home)  # a team scenario's
        run_line(SETUP + "for c in $(gpuprov cluster list --json | python3 -c 'import json, sys; "
                 "print(\" \".join(c[\"name\"] for c in json.load(sys.stdin)))'); do gpuprov cluster rm $c; done",
                 sandbox, cwd, home)
