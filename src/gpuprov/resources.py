"""Where the shipped templates, playbooks and data files live.

In a wheel they are inside the package (pyproject force-includes them); in a source checkout
they stay at the repository's top level, where people read and edit them.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


@cache
def _find(name: str) -> Path:
    for candidate in (_PACKAGE / name, _PACKAGE.parents[1] / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"gpuprov's {name}/ folder is missing from the installation ({_PACKAGE})")


def templates_dir() -> Path:
    return _find("templates")


def playbooks_dir() -> Path:
    return _find("playbooks")


def data_file(name: str) -> Path:
    return _PACKAGE / "data" / name
