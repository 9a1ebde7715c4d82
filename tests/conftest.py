"""Shared fixtures: a private gpuprov state dir per test, and a pool of real SSH test hosts."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import lanes, shimdata, testnet
from tests.machine import shared_user

# the test hosts reboot in about a second, not a minute: look for them coming back more often than a user's run
os.environ.setdefault("GPUPROV_TEST_REBOOT_POLL_SECONDS", "0.25")
# every test plans with the shipped facts, whatever `gpuprov facts refresh` left in this machine's data folder;
# the tests of the overlay point GPUPROV_FACTS_DIR at their own folder
_FACTS_DIR = tempfile.mkdtemp(prefix="gpuprov-test-facts-")
os.environ["GPUPROV_FACTS_DIR"] = _FACTS_DIR
atexit.register(shutil.rmtree, _FACTS_DIR, True)

ROOT = Path(__file__).resolve().parents[1]
SHIMS = ROOT / "tests" / "shims"
# uv's release archive as the shimmed hosts serve it, pinned in the session's facts folder
shimdata.pin_uv_stand_in(Path(_FACTS_DIR))
SUDO_USER = "gpuprov-sudoer"  # a login user that becomes root through `sudo -n`, like `ubuntu` on EC2
REAL_UNITS = "prometheus-node-exporter,gpuprov-gpu-metrics,nvidia-dcgm,nvidia-dcgm-exporter"
# every ssh session on the test hosts: the fake root the steps write into, and the test time scale of the
# steps' waits (retry back-off, apt-lock poll), as tests/shimrun.py sets them for local runs
HOST_ENV = {"GPUPROV_SYSROOT": "/var/lib/gpuprov-shim/root", "GPUPROV_RETRY_DELAY": "0", "GPUPROV_APT_LOCK_POLL": "1",
            # each host has its own network namespace, so the exporters can run for real there (tests/shims/lib/units.sh)
            "GPUPROV_SHIM_REAL_UNITS": REAL_UNITS}


def sweep(cases: list[Any], first: int) -> list[Any]:
    """A crash sweep's cases: the first `first` run in `make test`, the rest are marked `sweep` and run in
    `make test-all` (the same code path at more instants; CI's suite must stay under 10 minutes on 2 cores)."""
    return [c if i < first else pytest.param(*(c if isinstance(c, tuple) else (c,)), marks=pytest.mark.sweep)
            for i, c in enumerate(cases)]


def skip_or_fail(reason: str) -> None:
    """Skip a test whose environment is missing, except under CI=true, where the suite must prove the
    real-sshd paths: there it fails, so a CI runner without root or network namespaces cannot go green. In the
    fast lane it fails too: a test there must need none of it (tests/lanes.py)."""
    if lanes.fast():
        lanes.refuse(reason)
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {reason}: this test must run in CI, not skip", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def fresh_settings() -> Iterator[None]:
    """gpuprov reads its settings (the GPUPROV_* environment, config.toml) once per process and keeps them: each
    test starts from what its own environment and files say, not from an earlier test's."""
    from gpuprov.settings import reset

    reset()
    yield
    reset()


@pytest.fixture
def reads_of(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], list[Path]]:
    """`reads_of(path)`: a list that gets an entry at each read of `path`'s text from then on (the settings read
    config.toml once: the tests count)."""

    def counting(path: Path) -> list[Path]:
        reads: list[Path] = []
        read_text = Path.read_text

        def counted(self: Path, *args: Any, **kwargs: Any) -> str:
            if self == path:
                reads.append(self)
            return read_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", counted)
        return reads

    return counting


@pytest.fixture
def gp_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """gpuprov's state dir, and a HOME of its own (gpuprov adds an Include to ~/.ssh/config)."""
    home = tmp_path / "gpuprov-home"
    monkeypatch.setenv("GPUPROV_HOME", str(home))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return home


@pytest.fixture(scope="session")
def host_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """8 real OpenSSH hosts (network namespaces as root, else loopback) with the GPU-tool shims.

    Every ssh session on them gets GPUPROV_SYSROOT, so the rendered scripts write their config
    files into the host's private state instead of the real machine's /etc.
    """
    if os.environ.get("GPUPROV_TEST_MUTATE"):
        pytest.skip("mutation runs (tools/mutate.py) use no SSH test hosts")
    if os.geteuid() != 0:
        skip_or_fail("the SSH test hosts need root (network namespaces, sshd on port 22)")
    from tests.hosts.fixture import HostPool

    # other xdist workers and other checkouts' runs use the same user: shared, deleted by the last one out
    with shared_user(SUDO_USER):
        pool = HostPool(8, tmp_path_factory.mktemp("hosts"), shims_dir=SHIMS, prefix=testnet.prefix("gpt"),
                        bridge=testnet.bridge("gptbr0"), subnet=testnet.subnet("10.210.0"), loop_net=testnet.NET,
                        host_env=HOST_ENV, sudo_users=(SUDO_USER,))
        pool.start()
        print(f"\nSSH test hosts: {len(pool)} in mode {pool.mode}")
        try:
            yield pool
        finally:
            pool.stop()


from tests.alibaba.cli import ali_env  # noqa: E402,F401  (the CLI's environment for the ECS imitation)
from tests.alibaba.inprocess import alibaba, ecs_cloud  # noqa: E402,F401  (... and its Alibaba Cloud)
from tests.alibaba.inprocess_cli import ecs_cli  # noqa: E402,F401  (... through the CLI, in this process)
from tests.aws.cli import env  # noqa: E402,F401  (pytest fixture: the CLI's environment for the fake AWS)
from tests.aws.fixture import aws, aws_endpoint  # noqa: E402,F401  (pytest fixtures)
from tests.aws.inprocess import fake_cloud  # noqa: E402,F401  (the fast lane's in-process cloud)


@pytest.fixture(scope="session")
def aws_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """2 SSH test hosts on the addresses moto hands out in a 10.220.0.0/24 subnet (.4, .5, …)."""
    if os.environ.get("GPUPROV_TEST_MUTATE"):
        pytest.skip("mutation runs (tools/mutate.py) use no SSH test hosts")
    if os.geteuid() != 0:
        skip_or_fail("the SSH test hosts need root (network namespaces, sshd on port 22)")
    from tests.hosts.fixture import HostPool

    pool = HostPool(2, tmp_path_factory.mktemp("aws-hosts"), shims_dir=SHIMS, offset=3, prefix=testnet.prefix("gpa"),
                    bridge=testnet.bridge("gpabr0"), subnet=testnet.subnet("10.220.0"), loop_net=testnet.NET,
                    host_env=HOST_ENV)
    pool.start()
    if pool.mode != "netns":
        pool.stop()
        skip_or_fail("launched-node tests need network namespaces (hosts on moto's private addresses)")
    try:
        yield pool
    finally:
        pool.stop()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help="the fast lane (make test-fast): only tests that need no root, SSH test hosts, moto server "
                          "or system package, and a guard that fails one that reaches for them (tests/lanes.py)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", lanes.MARK_HELP)
    if config.getoption("fast"):
        os.environ[lanes.ENV] = "fast"  # xdist's workers, and what the tests start, inherit it
        lanes.arm()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lanes.mark_and_select(config, items)
    # the suite's longest test, the README top to bottom in one sandbox (minutes), starts first: a worker that
    # reached it last would end the run alone
    items.sort(key=lambda item: not item.nodeid.startswith("tests/test_readme.py::test_the_readme_runs_top_to_bottom"))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`-n N` (--dist load): each test goes to whichever worker is free, except that the tests of a module with a
    module-scoped fixture of its own (the real-apt chroot story, the harness's own host pool, ...) stay together on
    one worker, so that fixture is built once, not once per worker. Session fixtures (host pools, moto) are per
    worker anyway. (xdist's own --dist loadgroup would need xdist_group marks, which pytest 9.2 no longer lets
    xdist put into the node ids.)"""
    if config.getoption("dist") != "load":
        return None
    import re

    from xdist.scheduler import LoadScopeScheduling

    module_fixture = re.compile(r"""scope\s*=\s*["']module["']""")
    grouped: dict[str, bool] = {}

    class ModuleFixtureGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path not in grouped:
                source = config.rootpath / path
                grouped[path] = source.is_file() and bool(module_fixture.search(source.read_text()))
            return path if grouped[path] else nodeid

    return ModuleFixtureGroups(config, log)  # type: ignore[arg-type]
