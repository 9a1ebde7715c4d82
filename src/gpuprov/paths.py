"""Where gpuprov keeps its own files: the user's state dir (platformdirs), or $GPUPROV_HOME."""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    override = os.environ.get("GPUPROV_HOME")
    if override:
        path = Path(override)
    else:
        from platformdirs import user_state_dir

        path = Path(user_state_dir("gpuprov", appauthor=False))
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def logs_dir() -> Path:
    path = state_dir() / "logs"
    path.mkdir(exist_ok=True, mode=0o700)
    return path


def keys_dir() -> Path:
    return state_dir() / "keys"


def region_key(keys: Path, region: str) -> Path:
    """This user's private key for a cloud region (its public half is beside it, `.pub`)."""
    return keys / region / "id_ed25519"


def known_hosts_path() -> Path:
    return state_dir() / "known_hosts"
