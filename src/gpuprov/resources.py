"""Where the shipped templates, playbooks and data files live.

In a wheel they are inside the package (pyproject force-includes them); in a source checkout
they stay at the repository's top level, where people read and edit them.

The package's data/ (catalog, stack, OSes, Docker, quotas, images, monitoring, Xids, the Grafana dashboard) holds
facts several parts read through `data_file`; `load_data` parses a shipped data file with libyaml's C parser where PyYAML has it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

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


def load_data(name: str) -> Any:
    """A shipped data file (data/NAME.yaml) parsed, by libyaml's C parser where PyYAML was built with it (the
    wheels are): the same safe subset of YAML, read many times faster than by the pure-Python parser, and every
    plan reads several of these files."""
    import yaml

    return yaml.load(data_file(name).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
