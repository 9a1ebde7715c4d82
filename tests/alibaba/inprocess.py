"""The fast lane's Alibaba Cloud: the ECS imitation (server.py) on a loopback port in a thread, and a provider
pointed at it through GPUPROV_ALIBABA_ENDPOINT; tests/conftest.py imports the fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuprov.cloud.providers.alibaba import AlibabaProvider
from tests.alibaba.server import Ecs, serve


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
