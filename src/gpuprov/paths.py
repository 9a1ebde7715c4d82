"""Where gpuprov keeps its own files: the user's state dir (platformdirs), or $GPUPROV_HOME.

A state dir that is a file or cannot be made is bad input; `state_folder` is its path for a command that only
reads, checked the same way and not made. Also here: the config file's path (`$GPUPROV_CONFIG`,
else the XDG config dir; plan/config.py reads it), the facts and cache folders, gpuprov's known_hosts, and
`install_id`, made once per install and kept in STATE/install-id (the owner tag's ID, cloud/tags.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from functools import cache
from pathlib import Path

from gpuprov.errors import UserInputError
from gpuprov.settings import settings


def state_dir() -> Path:
    """The state folder, created (0700) if missing; one that cannot be made or written is a UserInputError naming
    GPUPROV_HOME (or, for the default's path, HOME or XDG_STATE_HOME), before anything else happens."""
    path, field = _state_folder()
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise UserInputError(field, f"cannot create {path}: {exc.strerror or exc}", _HOME_HINT) from None
    # a read-only mount is left to the records' own words (state/errors.py: "on a read-only disk")
    if not os.access(path, os.W_OK | os.X_OK) and not os.statvfs(path).f_flag & os.ST_RDONLY:
        raise UserInputError(field, f"{path} is not writable by this user", _HOME_HINT)
    return path


def state_folder() -> Path:
    """The state folder as `state_dir` finds it, not created: what a command that only reads looks in (a typo in
    GPUPROV_HOME, or a HOME that does not exist, must not become a fresh, empty state there)."""
    return _state_folder()[0]


_HOME_HINT = "point GPUPROV_HOME at a folder you can write (it is created if missing)"


def _state_folder() -> tuple[Path, str]:
    override = settings().home
    if override:
        path = override
    else:
        from platformdirs import user_state_dir

        path = Path(user_state_dir("gpuprov", appauthor=False))
    field = "GPUPROV_HOME" if override else _home_field()
    try:  # a folder above it this user may not enter (EACCES) is the environment's, not a bug
        if path.exists() and not path.is_dir():
            raise UserInputError(field, f"{path} is a file, not a folder", _HOME_HINT)
        above = next((p for p in path.parents if p.exists()), None)  # a folder that could never be made there
    except OSError as exc:
        raise UserInputError(field, f"cannot create {path}: {exc.strerror or exc}", _HOME_HINT) from None
    if above is not None and not above.is_dir():
        raise UserInputError(field, f"cannot create {path}: {above} is a file", _HOME_HINT)
    return path, field


def _home_field() -> str:
    """What a default state folder that cannot be made is blamed on: the variable its path came from."""
    return "XDG_STATE_HOME" if os.environ.get("XDG_STATE_HOME") else "HOME"


def logs_dir() -> Path:
    path = state_dir() / "logs"
    try:
        path.mkdir(exist_ok=True, mode=0o700)
    except OSError as exc:  # a read-only mount: state_dir leaves it to the records' words, which a log never reaches
        raise UserInputError("GPUPROV_HOME" if settings().home else _home_field(),
                             f"cannot create {path}: {exc.strerror or exc}",
                             "point GPUPROV_HOME at a folder you can write (it is created if missing)") from None
    return path


def keys_dir() -> Path:
    return state_dir() / "keys"


def region_key(keys: Path, region: str) -> Path:
    """This user's private key for a cloud region (its public half is beside it, `.pub`)."""
    return keys / region / "id_ed25519"


def cache_dir() -> Path | None:
    """Files gpuprov can rebuild (compiled templates): $GPUPROV_HOME/cache, else the user's cache dir
    (~/.cache/gpuprov). None when it cannot be created: a cache is never worth an error."""
    override = settings().home
    if override:
        path = override / "cache"
    else:
        from platformdirs import user_cache_dir

        path = Path(user_cache_dir("gpuprov", appauthor=False))
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    return path


def facts_dir() -> Path:
    """Where `gpuprov facts refresh` keeps the facts it read (an overlay on the shipped data/*.yaml):
    $GPUPROV_FACTS_DIR, else $GPUPROV_HOME/facts, else facts/ in the user's data dir (~/.local/share/gpuprov).
    Not created here: reading finds nothing there until a refresh writes it."""
    found = settings()
    if found.facts_dir:
        return found.facts_dir
    if found.home:
        return found.home / "facts"
    from platformdirs import user_data_dir

    return Path(user_data_dir("gpuprov", appauthor=False)) / "facts"


def known_hosts_path() -> Path:
    return state_dir() / "known_hosts"


def config_path() -> Path:
    """The user's config file: $GPUPROV_CONFIG, else config.toml in the XDG config dir (~/.config/gpuprov)."""
    return settings().config.path


def install_id() -> str:
    """This install's random id, made once and kept beside the state (`install-id`): part of the owner tag
    of everything it makes in a cloud (cloud/tags.py), and how a host's runner tells its clients apart."""
    return _install_id(state_dir())


def made_install_id() -> str | None:
    """This install's id if one was made, read without making it or the state folder (a command that only
    reads): None when this install has made nothing yet."""
    try:
        return (state_folder() / "install-id").read_text().strip() or None
    except OSError:
        return None


@cache
def _install_id(folder: Path) -> str:
    path = folder / "install-id"
    if not path.exists():
        # written whole, then linked into place: two first runs at once agree on one id, and no reader ever
        # sees an empty file
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".install-id.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(6) + "\n")
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
    return path.read_text().strip()
