"""gpuprov's settings, read once per process: the `GPUPROV_*` environment, `config.toml` and the built-in defaults.

`settings()` is the one reader of both. It is called when a value is first needed, never at import: a value read
at import would be the importing process's, and a process forked after the import (the tests' fork server) would
keep it. The environment is looked at again only to see whether this process changed its own `GPUPROV_*`
variables (or HOME, XDG_CONFIG_HOME: where the config file is; tests change them between commands they run
in-process); the config file is read with it, once, and `reset()` forgets both.

Each value keeps where it came from, so a refusal names it as the user wrote it: `error: GPUPROV_X: …`, or
`error: PATH:LINE: key: …` for the config file. A value is checked where it is used, not here: a bad variable
fails the commands that read it, not every command.

User-facing variables are listed in docs/configuration.md; the tests' own knobs, all `GPUPROV_TEST_*`, in
docs/testing.md.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprov.errors import UserInputError

PREFIX = "GPUPROV_"
# what else the config file's default path depends on (platformdirs' XDG config dir)
_ALSO_WATCHED = ("HOME", "XDG_CONFIG_HOME")


@dataclass(frozen=True)
class Sourced:
    """A value as it was given, and where: a variable's name, or the config file's `PATH:LINE: key`."""

    text: str
    where: str

    def seconds(self, *, positive: bool = False) -> float:
        """The value as seconds: a finite number >= 0 (> 0 when `positive`); anything else is bad input naming
        where it came from."""
        try:
            value = float(self.text)
            if not math.isfinite(value) or value < 0 or (positive and value == 0):
                raise ValueError(self.text)
        except ValueError:
            raise UserInputError(self.where, f"expected seconds (a number {'>' if positive else '>='} 0), "
                                             f"got {self.text!r}") from None
        return value


@dataclass(frozen=True)
class ConfigText:
    """config.toml as it was read: its keys (none when there is no file) and, for a file that could not be read or
    parsed, what is wrong with it (the commands' check, plan/config.py, refuses it with these words; the records'
    own keys are then unset, as if there were no file)."""

    path: Path
    named: bool  # GPUPROV_CONFIG named it: a missing file is an error, not "no config"
    kind: str  # "file", "missing", or "other" (a folder, a socket: something that is not a file)
    data: Mapping[str, Any]
    lines: tuple[str, ...]
    problem: str | None = None  # "cannot read it (…)" or "not valid TOML (…)"
    # what the problem is blamed on: the file, or the variable naming a folder on its path this user cannot enter
    field: str = "config"

    def where(self, key: str) -> str:
        """Where the file sets `key`, as an error names it: `PATH:LINE: key` (`PATH: key` when the line is not
        found: a key in an inline table, say)."""
        line = next((n for n, text in enumerate(self.lines, 1) if re.match(rf"\s*{re.escape(key)}\s*=", text)), None)
        return f"{self.path}:{line}: {key}" if line else f"{self.path}: {key}"

    def get(self, key: str) -> Sourced | None:
        """The file's `key` as text with where it is set; None when the file does not set it."""
        if key not in self.data:
            return None
        return Sourced(str(self.data[key]), self.where(key))


@dataclass(frozen=True)
class Settings:
    """Every setting gpuprov's own process reads. The options' defaults (GPUPROV_GPU, _PLAYBOOK, _SSH_CIDR, _KEY,
    _AUTOSTOP, _PARALLEL) are Click's to read, as each option's envvar; `env` has them for `gpuprov config`."""

    env: Mapping[str, str]  # the GPUPROV_* environment as read
    config: ConfigText
    home: Path | None  # GPUPROV_HOME: the state folder instead of the user's state dir
    facts_dir: Path | None  # GPUPROV_FACTS_DIR: where `facts refresh` keeps what it read
    state: Sourced | None  # GPUPROV_STATE, else config `state`: where the records live
    lease: Sourced | None  # GPUPROV_LEASE_SECONDS, else config `lease`: how long a lease outlives its holder
    debug: bool  # GPUPROV_DEBUG: a bug raises its traceback instead of saving it
    pypi_url: Sourced | None  # GPUPROV_PYPI_URL and the next two: mirrors of the facts' sources
    pytorch_index_url: Sourced | None
    nvidia_repos_url: Sourced | None
    # the tests' knobs (docs/testing.md): a fake cloud's names, and time scaled down for imitations
    test_today: Sourced | None  # the day the facts' ages are counted to
    test_poll_seconds: Sourced | None  # between AWS polls
    test_settle_seconds: Sourced | None  # EC2's eventual-consistency window
    test_wait_backoff_seconds: Sourced | None  # `up --wait`'s first pause
    test_reboot_poll_seconds: Sourced | None  # between looks for a rebooting host
    test_patience_seconds: Sourced | None  # a bounded wait for a lock (state/coordinator.py)
    test_dlami_ssm_prefix: str | None  # the fake cloud's stand-ins for AWS's public SSM names
    test_ubuntu_ssm_prefix: str | None
    test_public_ssm_root: str | None

    def variable(self, name: str) -> Sourced | None:
        """gpuprov's own variable `name` (GPUPROV_*) when it is set and not empty."""
        value = self.env.get(name)
        return Sourced(value, name) if value else None


_lock = threading.Lock()
_cached: tuple[tuple[tuple[str, str], ...], Settings] | None = None


def settings() -> Settings:
    """This process's settings, read on the first call; read again only after `reset()` or when this process
    changed a GPUPROV_* variable since."""
    global _cached
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(PREFIX) or k in _ALSO_WATCHED))
    found = _cached
    if found is not None and found[0] == env:
        return found[1]
    with _lock:
        if _cached is None or _cached[0] != env:
            _cached = env, _read({k: v for k, v in env if k.startswith(PREFIX)})
        return _cached[1]


def reset() -> None:
    """Forget what was read: the next `settings()` reads the environment and the config file again."""
    global _cached
    with _lock:
        _cached = None


def _read(env: dict[str, str]) -> Settings:
    def var(name: str) -> Sourced | None:
        value = env.get(name)
        return Sourced(value, name) if value else None

    def path(name: str) -> Path | None:
        value = env.get(name)
        return Path(value).expanduser() if value else None

    config = _config(env)
    state = env.get("GPUPROV_STATE")
    return Settings(
        env=env,
        config=config,
        home=path("GPUPROV_HOME"),
        facts_dir=path("GPUPROV_FACTS_DIR"),
        state=Sourced(state, "GPUPROV_STATE") if state is not None and state.strip() else config.get("state"),
        lease=var("GPUPROV_LEASE_SECONDS") or config.get("lease"),
        debug=bool(env.get("GPUPROV_DEBUG")),
        pypi_url=var("GPUPROV_PYPI_URL"),
        pytorch_index_url=var("GPUPROV_PYTORCH_INDEX_URL"),
        nvidia_repos_url=var("GPUPROV_NVIDIA_REPOS_URL"),
        test_today=var("GPUPROV_TEST_TODAY"),
        test_poll_seconds=var("GPUPROV_TEST_POLL_SECONDS"),
        test_settle_seconds=var("GPUPROV_TEST_SETTLE_SECONDS"),
        test_wait_backoff_seconds=var("GPUPROV_TEST_WAIT_BACKOFF_SECONDS"),
        test_reboot_poll_seconds=var("GPUPROV_TEST_REBOOT_POLL_SECONDS"),
        test_patience_seconds=var("GPUPROV_TEST_PATIENCE_SECONDS"),
        test_dlami_ssm_prefix=env.get("GPUPROV_TEST_DLAMI_SSM_PREFIX") or None,
        test_ubuntu_ssm_prefix=env.get("GPUPROV_TEST_UBUNTU_SSM_PREFIX") or None,
        test_public_ssm_root=env.get("GPUPROV_TEST_PUBLIC_SSM_ROOT") or None,
    )


def _config(env: dict[str, str]) -> ConfigText:
    """The config file: $GPUPROV_CONFIG, else config.toml in the XDG config dir (~/.config/gpuprov)."""
    named = env.get("GPUPROV_CONFIG")
    if named:
        where = Path(named).expanduser()
    else:
        from platformdirs import user_config_dir

        where = Path(user_config_dir("gpuprov", appauthor=False)) / "config.toml"
    try:
        kind = "file" if where.is_file() else "other" if where.exists() else "missing"
    except OSError as exc:  # a folder on its path this user may not enter: the environment's, said by its variable
        field = "GPUPROV_CONFIG" if named else "XDG_CONFIG_HOME" if os.environ.get("XDG_CONFIG_HOME") else "HOME"
        folder = where if named else os.environ.get(field) or Path.home()
        return ConfigText(where, bool(named), "file", {}, (), f"{folder} cannot be read ({exc.strerror}: "
                          f"{exc.filename})", field)
    if kind != "file":
        return ConfigText(where, bool(named), kind, {}, ())
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]

    try:
        text = where.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = f"cannot read it ({exc.strerror or exc})" if isinstance(exc, OSError) else f"not valid TOML ({exc})"
        return ConfigText(where, bool(named), "file", {}, (), why)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return ConfigText(where, bool(named), "file", {}, tuple(text.splitlines()), f"not valid TOML ({exc})")
    return ConfigText(where, bool(named), "file", data, tuple(text.splitlines()))
