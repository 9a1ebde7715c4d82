"""Every `$ gpuprov …` line in the README: each parses as written (commands, options, values), the offline ones
(gpus, plan, render, config, completion, facts) run and exit as the README says, the examples that depend on each
other agree (the node `jupyter exp1` opens gets JupyterLab), and every `$ ` line of the README runs as printed,
top to bottom, in one fresh sandbox (tools/sandbox.py), as a reader who follows it would run them."""

from __future__ import annotations

import json
import os
import re
import shlex
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


def console_lines() -> list[str]:
    """Every `$ ` line of the README's console blocks without its `$ `, a line ending in ` \\` joined with the
    next, as the shell joins them."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", README, re.S):
        typed = ""
        for line in block.splitlines():
            if typed:
                typed += " " + line.strip()
            elif line.startswith("$ "):
                typed = line[2:]
            if typed and typed.endswith(" \\"):
                typed = typed[:-2].rstrip()
                continue
            if typed:
                found.append(typed)
            typed = ""
    return found


def examples() -> list[tuple[str, str]]:
    """(the command line without `$ `, its trailing comment)."""
    found = []
    for line in console_lines():
        if line.startswith("gpuprov "):
            words = shlex.split(line, comments=True)
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
        pytest.skip("reads the public sources (the README's run reads the sandbox's stand-in of them)")
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
    assert shown.group(1).split(", …")[0] in result.stderr and shown.group(2).split(", …")[0] in result.stderr


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
    assert "jupyter" in [s["name"] for s in json.loads(result.stdout)["steps"]]


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


# --- every example, in README order, in one fresh sandbox (`make sandbox`, tools/sandbox.py) ---------------------
#
# Each `$ ` line of the README's console blocks (gpuprov's, and the shell lines shown to the reader: `export`,
# `mkdir`, `echo … >>`) runs as printed, top to bottom, through bash in the sandbox's folder for the reader (its
# hosts.yml and ./code), with the sandbox's environment (a local AWS endpoint, hosts with shimmed GPUs, a local
# stand-in of the facts' sources, gpuprov's config file setting the subnet, connect mode, login and OS) and a HOME
# of the test's own. Nothing runs that the README does not show. One substitution, the sandbox's, not gpuprov's:
# the hosts "you already have" stand at 10.1.NET.3-.5 (NET: this run's test net; 10.1.2 in `make sandbox`).
# stdin is a terminal that answers the confirmation (`y`) or, for `ssh`, `exit 0`. An `export` line is kept for
# the lines after it, as the reader's shell keeps it.

# what a line prints, where the README says or a user would look for it
SAYS = {
    "gpuprov up try --gpu T4": "try is ready",
    "gpuprov state push s3://acme-gpu-state/team": "shared: moved to s3://acme-gpu-state/team/",
    "gpuprov state": "versioning: Enabled",
    "gpuprov team sync shared": "member(s) authorized",
    "gpuprov state unlock shared": "shared: no lease held",
    "gpuprov up train --gpu A100:8 --spot --persistent --fallback on-demand": "train is ready: p4d.24xlarge",
    "gpuprov stop train": "train: stopped",
    "gpuprov up base2 --gpu A100:8": "a100-stack",
    "gpuprov up dl --gpu L4 --image dlami": "nvidia-driver: unchanged",
    "gpuprov jupyter exp1": "/lab?token=",
    "gpuprov exec exp1 -- nvidia-smi -L": "NVIDIA L40S",
    "gpuprov monitor exp1": "L40S",
    "gpuprov stop exp1": "exp1: stopped; its 100 GB disk costs $8.00/month while stopped",
    "gpuprov stop t4 && gpuprov start t4 --gpu L4 --no-bootstrap": "g6.xlarge (was g4dn.xlarge)",
    "gpuprov bootstrap --inventory hosts.yml -p llm-finetune --parallel 64 --autostop 2h": "trainer-a",
    "gpuprov exec rack -- 'echo $NODE_RANK of $NNODES, $MASTER_ADDR:$MASTER_PORT'": "rack:2 | 2 of 3, ",
    "gpuprov torchrun rack -- code/train.py --epochs 3": "3/3 nodes ok",
    "gpuprov exec multi -- 'echo $NODE_RANK of $NNODES'": "3 of 4",
    "gpuprov facts refresh": "torch: read from http://127.0.0.1:",  # the sandbox's stand-in of the sources
    "gpuprov up ali --cloud alibaba --gpu T4 --spot": "ali is ready: ecs.gn6i",
    "gpuprov stop ali": "ali: stopped; its compute is not billed",
}
# a terminal stays open until Ctrl-C: these run until they print this, then get SIGINT
UNTIL = {"gpuprov jupyter exp1": "/lab?token=", "gpuprov monitor exp1": "L40S",
         "gpuprov metrics serve --file-sd ~/prometheus/gpuprov.json": "mon: serving"}


def readme_lines() -> list[tuple[str, str]]:
    """Every `$ ` line of the README's console blocks, as typed: (the line, its trailing comment)."""
    found = []
    for line in console_lines():
        cut = len(line)
        quote = ""
        for i, ch in enumerate(line):  # the first '#' after a blank, outside quotes
            if ch in "'\"" and quote in ("", ch):
                quote = "" if quote else ch
            elif ch == "#" and not quote and i and line[i - 1] == " ":
                cut = i
                break
        found.append((line[:cut].strip(), line[cut:].lstrip("# ")))
    return found


def test_the_readme_run_runs_every_gpuprov_example() -> None:
    """The in-order run below runs each line `examples()` (the parse test's) finds, and checks only lines it has."""
    ran = {shlex.join(shlex.split(line.split(" > ")[0].split(" && ")[0])) for line, _ in readme_lines()}
    assert [line for line, _ in EXAMPLES if line not in ran] == []
    lines = [line for line, _ in readme_lines()]
    assert [line for line in [*SAYS, *UNTIL] if line not in lines] == []  # no check of a line the README lost


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
                        hosts_subnet=testnet.subnet("10.1.2"), prefix=testnet.prefix("gps"), alibaba_nodes=1) as sb:
        yield sb


def localised(line: str, sb: Any) -> str:
    return line.replace("10.1.2.", f"{sb.hosts_subnet}.")


def run_line(line: str, sb: Any, env: dict[str, str]) -> tuple[int, str]:
    """`line` through bash in the sandbox's folder, stdin a terminal that answers (`y`, or `exit 0` to a shell);
    a line in UNTIL runs until it prints its words, then gets Ctrl-C."""
    import pty
    import signal
    import threading
    import time

    leader, follower = pty.openpty()
    proc = subprocess.Popen(["bash", "-c", localised(line, sb)], stdin=follower, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=sb.work, env=env, start_new_session=True)
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
def test_the_readme_runs_top_to_bottom_in_a_fresh_sandbox(sandbox: Any, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUPROV_"))}
    env.update(sandbox.env, HOME=str(home), NO_COLOR="1", COLUMNS="120",
               PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    env = forkcli.shell_env(env)
    for line, comment in readme_lines():
        if line.startswith("export "):  # the reader's shell keeps it for the lines after
            name, _, value = shlex.split(line)[1].partition("=")
            env[name] = value
            continue
        code, out = run_line(line, sandbox, env)
        assert code == (2 if "exit 2" in comment else 0), f"$ {line}\n{out}"
        assert "Traceback" not in out and "gpuprov hit a bug" not in out, f"$ {line}\n{out}"
        assert SAYS.get(line, "") in out, f"$ {line}\n{out}"
        if line == "gpuprov sync ./code exp1:/work/code":  # the node's /work is its own, not this machine's
            assert not Path("/work/code/train.py").exists()
        if line.startswith("gpuprov metrics dashboard > "):
            assert json.loads((sandbox.work / "gpu.json").read_text())["panels"]
    assert (home / ".config" / "fish" / "completions" / "gpuprov.fish").read_text().startswith(
        "function _gpuprov_completion")
    left = {k: v for k, v in sandbox.aws.leftovers().items() if v and k != "key_pairs"}
    assert left == {}, left  # the README takes down what it made
    from tests.alibaba.cli import leftovers

    left = {k: v for k, v in leftovers(sandbox.ecs).items() if v}
    assert left == {}, left  # on Alibaba Cloud too
