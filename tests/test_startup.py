"""Start-up: `gpuprov --help` must not pay for boto3 or Fabric (imported only by commands that use them), a command
imports its own module and not the others' (cli/lazy.py), and start-up is not rescanned by the garbage collector."""

from __future__ import annotations

import ast
import importlib
import json
import os
import pkgutil
import shlex
import subprocess
import sys

import click
import pytest

import gpuprov.cli as cli_package
from gpuprov.cli import lazy, main

HEAVY = ("boto3", "botocore", "fabric", "paramiko", "invoke")


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--help"], ["plan", "--gpu", "T4"], ["gpus"],
                                  ["bootstrap", "--help"]])
def test_offline_commands_import_no_cloud_or_ssh_sdk(argv):
    code = (  # the executable leaves through os._exit after the atexit handlers: one of them reports
        "import atexit, runpy, sys\n"
        f"atexit.register(lambda: print('LOADED', sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
        f"sys.argv = ['gpuprov', *{argv!r}]\n"
        "runpy.run_module('gpuprov', run_name='__main__')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "LOADED []"


def test_the_executable_skips_teardown_but_not_its_output_or_exit_code():
    """`gpuprov` leaves with os._exit (no module teardown): a long output still arrives whole, exit codes
    are kept, and a reader that leaves early (`| head`) gets no traceback."""
    run = [sys.executable, "-m", "gpuprov"]
    listed = subprocess.run([*run, "gpus", "--json"], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)["gpus"]) >= 10  # every GPU, to the closing brace
    bad = subprocess.run([*run, "plan", "--gpu", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --gpu"), bad.stderr
    piped = subprocess.run(["bash", "-o", "pipefail", "-c", f"{shlex.join(run)} gpus | head -n 1"],
                           capture_output=True, text=True)
    assert piped.returncode == 0 and piped.stdout.strip(), piped.stderr
    assert "Traceback" not in piped.stderr and "Exception ignored" not in piped.stderr, piped.stderr


def _run_reporting(argv: list[str], report: str, exit_code: int = 0, env: dict[str, str] | None = None) -> str:
    """`gpuprov ARGV` as the executable runs it; `report` (an expression) is printed at exit, the last line."""
    code = (
        "import atexit, gc, runpy, sys\n"
        "import gpuprov.cli\n"
        "before = [s['collections'] for s in gc.get_stats()]\n"
        f"atexit.register(lambda: print('REPORT', {report}))\n"
        f"sys.argv = ['gpuprov', *{argv!r}]\n"
        "runpy.run_module('gpuprov', run_name='__main__')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == exit_code, run.stderr
    return run.stdout.strip().splitlines()[-1].removeprefix("REPORT ")


def test_a_command_imports_its_own_module_and_no_other_commands():
    """`gpuprov bootstrap` loads gpuprov.cli.hosts, not the modules of `up`, `exec`, `team`... (cli/lazy.py),
    nor the cloud's."""
    loaded = _run_reporting(["bootstrap", "--help"], "sorted(m for m in sys.modules if m.startswith(('gpuprov.cli.', "
                                                     "'gpuprov.cloud', 'boto3', 'fabric', 'paramiko')))")
    modules = ast.literal_eval(loaded)
    assert {m.removeprefix("gpuprov.cli.") for m in modules} & set(lazy.COMMANDS.values()) == {"hosts"}, loaded
    assert not [m for m in modules if not m.startswith("gpuprov.cli.")], loaded


def test_bootstrap_of_a_stack_none_playbook_imports_no_catalog_solver_or_docker(tmp_path):
    """A host's plan with no GPU named and no Docker needs neither the catalog, the stack solver nor Docker's facts:
    `bootstrap` to its first connection (a host that refuses it) does not import them."""
    playbook = tmp_path / "none.yml"
    playbook.write_text("name: none\ndescription: d\nstack: none\nenv: null\nsteps:\n  - name: one\n    run: 'true'\n")
    inventory = tmp_path / "inv.yml"
    inventory.write_text("defaults: {user: root}\nhosts:\n  - host: 127.0.0.1\n    port: 1\n")
    env = {**os.environ, "GPUPROV_HOME": str(tmp_path / "home")}
    loaded = ast.literal_eval(_run_reporting(
        ["bootstrap", "--inventory", str(inventory), "-p", str(playbook), "--os", "ubuntu-24.04", "--json"],
        "sorted(m for m in sys.modules if m.startswith('gpuprov.plan.'))", exit_code=1, env=env))
    assert "gpuprov.plan.plan" in loaded  # it did plan
    assert not {"gpuprov.plan.catalog", "gpuprov.plan.compat", "gpuprov.plan.kept", "gpuprov.plan.docker"} & set(loaded)


def test_every_command_is_in_the_lazy_table_under_its_own_module():
    """The table `gpuprov --help`, completion and dispatch read names every command, each by the module that
    defines it: a command missing from it would be missing from `gpuprov` altogether."""
    lazy.load_all()
    for module in pkgutil.iter_modules(cli_package.__path__):  # a command in a module the table does not name
        importlib.import_module(f"gpuprov.cli.{module.name}")
    defined = {name: cmd.callback.__module__.removeprefix("gpuprov.cli.")
               for name, cmd in main.commands.items() if cmd.callback is not None}
    assert defined == lazy.COMMANDS
    ctx = click.Context(main)
    assert main.list_commands(ctx) == sorted(lazy.COMMANDS)


def test_help_lists_every_command_from_the_table_importing_none():
    """`gpuprov --help` lists each command by lazy.SUMMARIES without importing a command module; the listing is
    the one the commands' own docstrings make, at any width, and each summary is its command's first sentence."""
    loaded = ast.literal_eval(_run_reporting(["--help"], "sorted(m for m in sys.modules if m.startswith('gpuprov.cli.'))"))
    assert not {m.removeprefix("gpuprov.cli.") for m in loaded} & set(lazy.COMMANDS.values()), loaded
    lazy.load_all()
    assert {name: main.commands[name].get_short_help_str(limit=10**6) for name in lazy.COMMANDS} == lazy.SUMMARIES
    for width in (50, 80, 200):
        fresh = [sys.executable, "-m", "gpuprov", "--help"]
        env = {**os.environ, "COLUMNS": str(width)}
        lazily = subprocess.run(fresh, capture_output=True, text=True, env=env, check=True).stdout
        whole = subprocess.run([sys.executable, "-c", "import runpy, sys; from gpuprov.cli import lazy; lazy.load_all(); "
                                "sys.argv = ['gpuprov', '--help']; runpy.run_module('gpuprov', run_name='__main__')"],
                               capture_output=True, text=True, env=env, check=True).stdout
        assert lazily == whole


def test_start_up_is_not_rescanned_by_the_garbage_collector():
    """A command's start-up makes tens of thousands of objects that live as long as the process; the
    executable collects young objects every 100k allocations, so `plan` does not scan them again and again
    (with the interpreter's default, ~60 young collections and several older-generation passes)."""
    collections = ast.literal_eval(_run_reporting(["plan", "--gpu", "T4"],
                                      "[s['collections'] - b for s, b in zip(gc.get_stats(), before)]"))
    assert collections[0] <= 1 and collections[1:] == [0, 0], collections


def test_a_mistyped_command_is_still_matched_against_every_command():
    """Click's "did you mean" looks among the commands imported: a name no command has imports them all first,
    so a fresh process (not the tests' fork server, which has every module loaded) still suggests `bootstrap`."""
    typo = subprocess.run([sys.executable, "-m", "gpuprov", "boostrap", "10.0.0.1"], capture_output=True, text=True)
    assert typo.returncode == 2 and typo.stderr.startswith("error: boostrap: no such command (did you mean bootstrap?)"), \
        typo.stderr
