"""Every `$ gpuprov …` line in the README: each parses as written (commands, options, values), the
offline ones (gpus, plan, render, config, completion) run and exit as the README says, and the
examples that depend on each other agree (the node `jupyter exp1` opens gets JupyterLab). The
launched-node ones run for real in `make demo` and tests/test_aws_lifecycle.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from gpuprov.cli import main

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
    result = subprocess.run([sys.executable, "-m", "gpuprov", *shlex.split(line)[1:]], capture_output=True, text=True,
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
    result = subprocess.run([sys.executable, "-m", "gpuprov", "plan", "--gpu", "V100", "--torch-cuda", "cu130"],
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
    result = subprocess.run([sys.executable, "-m", "gpuprov", "plan", "--json", *plan_args], capture_output=True,
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
