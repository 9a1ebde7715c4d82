"""The house by its parts (docs/architecture.md), held by import-linter's contracts in pyproject.toml: which part
may import which, plan/ reaching no network, no import circle. grimp reads every import, at the top, inside a
function or under TYPE_CHECKING, since each is a dependency a reader has to follow.

Each contract is also broken on purpose in a copy of the tree, so a contract that stopped biting fails here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "gpuprov"
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(src_parent: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src_parent)}
    return subprocess.run([str(LINT), "--no-cache", str(ROOT / "pyproject.toml")], cwd=src_parent, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_parts_keep_to_their_floors_and_no_circle():
    done = _lint(SRC.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_parts_are_folders():
    assert {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == \
        {"cli", "plan", "hosts", "cluster", "cloud", "sources", "state"}
    assert (SRC / "cloud" / "providers" / "__init__.py").exists()


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("plan/spec.py", "def _f():\n    from gpuprov.hosts import remote\n", "a lower part never imports a higher one"),
    ("plan/spec.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import boto3\n", "plan/ is pure"),
    ("plan/stack.py", "import http.client\n", "plan/ is pure"),
    ("hosts/remote.py", "from gpuprov.cloud import node\n", "a lower part never imports a higher one"),
    ("cloud/providers/aws.py", "from gpuprov.state import Store\n", "a provider makes and removes machines"),
    ("state/records.py", "from gpuprov.plan import spec\n", "a lower part never imports a higher one"),
    ("state/locks.py", "import paramiko\n", "the ground floor uses no SSH"),
    ("kinds.py", "from gpuprov.state import records\n", "a lower part never imports a higher one"),
    ("cloud/node.py", "from ..cli import report\n", "a lower part never imports a higher one"),
    ("cloud/node.py", "from gpuprov.sources import refresh\n", "a lower part never imports a higher one"),
    ("hosts/check.py", "import boto3\n", "hosts/ and cluster/ reach hosts over SSH"),
    ("cloud/tags.py", "from gpuprov.cloud import node\n", "no import circle"),
])
def test_a_broken_contract_is_named(tmp_path, module, line, contract):
    """A copy of the tree with one forbidden import added: lint-imports fails and names the contract."""
    shutil.copytree(SRC, tmp_path / "gpuprov", ignore=shutil.ignore_patterns("__pycache__", "data"))
    target = tmp_path / "gpuprov" / module
    target.write_text(target.read_text() + "\n" + line)
    done = _lint(tmp_path)
    assert done.returncode != 0, done.stdout
    broken = done.stdout.split("Broken contracts")[-1]
    assert contract in broken, done.stdout


def _exception_classes() -> list[tuple[str, str]]:
    """Every exception class defined in src/gpuprov (nested ones too) and its module's path under it: a class whose
    base is a builtin exception or one of these, by name, until nothing more is found."""
    import ast
    import builtins

    found: list[tuple[str, str, list[str]]] = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
                found.append((node.name, path.relative_to(SRC).as_posix(), bases))
    known = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    classes: list[tuple[str, str]] = []
    while True:
        names = known | {name for name, _ in classes}
        more = [(name, where) for name, where, bases in found if (name, where) not in classes and set(bases) & names]
        if not more:
            return classes
        classes += more


def test_every_exception_class_is_in_the_tree_errors_py_draws():
    """errors.py's docstring names each exception class with the module it lives in, and names no class that is gone;
    no two exception classes share a name."""
    import re

    import gpuprov.errors

    drawn = {m[1]: m[2] for m in re.finditer(r"^ +(\w+) +([\w/]+\.py) ", gpuprov.errors.__doc__ or "", re.M)}
    classes = _exception_classes()
    assert len(classes) > 20  # the search found them
    names = [name for name, _ in classes]
    assert sorted({n for n in names if names.count(n) > 1}) == []
    assert {name: where for name, where in classes if drawn.get(name) != where} == {}
    assert set(drawn) - set(names) == set()
