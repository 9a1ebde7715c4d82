"""The fast lane's Alibaba Cloud: the ECS imitation (server.py) on a loopback port in a thread, and a provider
pointed at it through GPUPROV_ALIBABA_ENDPOINT; tests/conftest.py imports the fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuprov.cloud.providers.alibaba import AlibabaProvider
from tests.alibaba.server import Ecs, serve
from tests.aws.cli import CLI_SETTINGS


@pytest.fixture
def ecs_cloud(monkeypatch: pytest.MonkeyPatch) -> Iterator[Ecs]:
    """The imitation's state. The credentials SDK reads its environment once, when first imported: these are set
    before that, and are the same for every test."""
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "testing")
    monkeypatch.setenv("ALIBABA_CLOUD_ECS_METADATA_DISABLED", "true")
    with serve() as (cloud, url):
        monkeypatch.setenv("GPUPROV_ALIBABA_ENDPOINT", url)
        yield cloud


@pytest.fixture
def alibaba(ecs_cloud: Ecs) -> AlibabaProvider:
    return AlibabaProvider("me@host/abc", poll=0.01)


class AliCli:
    """The CLI run in this process against the imitation (Click's CliRunner), as the fast lane's `fake_cloud` runs it
    against moto: `gp(...)` is Click's Result; `ecs` the imitation's state."""

    def __init__(self, ecs: Ecs) -> None:
        self.ecs = ecs

    def gp(self, *args: str) -> Any:
        from click.testing import CliRunner

        from gpuprov.cli import main
        from gpuprov.settings import reset

        reset()
        return CliRunner().invoke(main, list(args), prog_name="gpuprov")


@pytest.fixture
def ali_cli(ecs_cloud: Ecs, gp_home: Path, monkeypatch: pytest.MonkeyPatch) -> AliCli:
    """`gpuprov` on Alibaba Cloud in this process: the imitation, a GPUPROV home of the test's own, GPUPROV_CLOUD
    alibaba and the CLI's test settings."""
    monkeypatch.setenv("GPUPROV_HOME", str(gp_home))
    monkeypatch.setenv("GPUPROV_CLOUD", "alibaba")
    for key, value in CLI_SETTINGS.items():
        monkeypatch.setenv(key, value)
    return AliCli(ecs_cloud)
