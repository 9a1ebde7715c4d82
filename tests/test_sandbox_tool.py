"""tools/sandbox.py and tools/demo.py, in-process: what the sandbox leaves outside its folder once stopped (the
Include line a gpuprov `up` pointed at it added to ~/.ssh/config), and one demo at a time on a machine. The sandbox
itself runs in test_readme.py, the README top to bottom."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

from gpuprov.hosts.sshconfig import MARK

ROOT = Path(__file__).resolve().parents[1]


def sandbox() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sandbox", ROOT / "tools" / "sandbox.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stopping_takes_the_include_its_nodes_added_out_of_ssh_config(tmp_path: Path) -> None:
    workdir, home, other = tmp_path / "sb", tmp_path / "home", tmp_path / "other"
    (home / ".ssh").mkdir(parents=True)
    mine = "Host work\n  HostName 192.0.2.9\n"
    elsewhere = f"Include {tmp_path}/real-state/ssh_config  {MARK}\n"  # a real gpuprov's, not the sandbox's
    (home / ".ssh" / "config").write_text(f"Include {workdir}/state/ssh_config  {MARK}\n{elsewhere}{mine}")
    changed = sandbox().forget_includes(workdir, [home, other])
    assert changed == [home / ".ssh" / "config"]
    assert (home / ".ssh" / "config").read_text() == elsewhere + mine
    assert sandbox().forget_includes(workdir, [home]) == []  # nothing more to take


def test_a_second_demo_ends_with_one_line_naming_the_first(tmp_path: Path) -> None:
    import pytest

    spec = importlib.util.spec_from_file_location("demo", ROOT / "tools" / "demo.py")
    assert spec and spec.loader
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    lock = tmp_path / "demo.lock"
    with demo.only_one(lock):
        with pytest.raises(SystemExit) as second, demo.only_one(lock):
            pass
        assert str(second.value) == (f"demo: another `make demo` runs on this machine (pid {os.getpid()}); run it "
                                     "again once that one ends")
    with demo.only_one(lock):  # the first one ended: the next runs
        pass


def test_the_folder_for_the_reader_has_the_readmes_inventory_for_the_sandboxs_hosts(tmp_path: Path) -> None:
    """The README's examples run in the sandbox's folder: its hosts.yml is the README's inventory (the same hosts,
    names, GPUs and jumps), with the sandbox's addresses and key; ./code has the script they sync and torchrun."""
    import re

    from gpuprov.plan.inventory import load_inventory

    module = sandbox()
    box = module.Sandbox(tmp_path / "sb", hosts_subnet="10.9.2")
    box.workdir.mkdir(parents=True)
    box.key = tmp_path / "sb" / "id_ed25519"
    work = box._write_work(["10.9.2.3", "10.9.2.4", "10.9.2.5"])
    shown = re.search(r"```yaml\n(defaults:.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert shown
    (tmp_path / "readme.yml").write_text(shown.group(1).replace("10.1.2.", "10.9.2."))
    readme, made = (load_inventory(str(p)) for p in (tmp_path / "readme.yml", work / "hosts.yml"))
    assert made.hosts == readme.hosts
    assert (made.defaults.user, made.defaults.key) == (readme.defaults.user, str(box.key))
    assert "sys.argv" in (work / "code" / "train.py").read_text()
