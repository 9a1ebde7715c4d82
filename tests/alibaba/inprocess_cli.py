"""The fast lane's Alibaba Cloud through the CLI: `gpuprov` run in this process with Click's CliRunner against the ECS
imitation (`ecs_cloud`, tests/alibaba/inprocess.py), --cloud alibaba by its variable, a GPUPROV home of the test's own.

    def test_x(ecs_cli):
        result = ecs_cli.up("n1")                      # up --no-bootstrap --no-wait: a node recorded, nothing reached
        result = ecs_cli.gp("gc", "--json")            # Click's Result: exit_code, stdout, stderr, output
        ecs_cli.cloud.tags                             # the imitation's ground truth

AWS is pointed at a loopback port nothing listens on, with one attempt: a command that asked AWS anything on the way
would fail, so the tests see that nothing of AWS is read for Alibaba Cloud.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.alibaba.server import Ecs

SSH_CIDR = "198.51.100.7/32"  # the caller's address as the tests give it (no lookup of the real one)
NO_AWS = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1", "AWS_EC2_METADATA_DISABLED": "true"}


class EcsCli:
    def __init__(self, cloud: Ecs, home: Path) -> None:
        self.cloud = cloud
        self.home = home

    def gp(self, *args: str, **env: str) -> Any:
        """`gpuprov ARGS` in this process: Click's Result. Each command reads its settings afresh."""
        from click.testing import CliRunner

        from gpuprov.cli import main
        from gpuprov.settings import reset

        reset()
        return CliRunner().invoke(main, list(args), prog_name="gpuprov", env=env or None)

    def up(self, name: str, *extra: str) -> Any:
        """A node launched and recorded (`up … --no-bootstrap --no-wait`): A10 on-demand unless `extra` says."""
        result = self.gp("up", name, "--gpu", "A10", "--ssh-cidr", SSH_CIDR, "--yes", "--no-bootstrap", "--no-wait",
                         *extra)
        assert result.exit_code == 0, result.output
        return result

    def forget(self, name: str) -> None:
        """The node's record and its resources' rows gone (a lost state), what it made left in the cloud."""
        import sqlite3

        with sqlite3.connect(self.home / "state.sqlite") as db:
            db.execute("DELETE FROM resources WHERE node = ?", (name,))
            db.execute("DELETE FROM nodes WHERE name = ?", (name,))

    def ours(self) -> dict[str, list[str]]:
        """What the imitation holds tagged by gpuprov, by ListTagResources' type."""
        out: dict[str, list[str]] = {}
        for (kind, rid), tags in sorted(self.cloud.tags.items()):
            if "gpuprov:owner" in tags:
                out.setdefault(kind, []).append(rid)
        return out


def error_line(result: Any) -> str:
    """The one `error: ` line of a command refused as bad input (exit 2, no traceback)."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    return line


@pytest.fixture
def ecs_cli(ecs_cloud: Ecs, gp_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EcsCli]:
    for key, value in {**NO_AWS, "GPUPROV_CLOUD": "alibaba", "GPUPROV_TEST_POLL_SECONDS": "0.02",
                       "GPUPROV_TEST_SETTLE_SECONDS": "5", "COLUMNS": "200"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ALIBABA_CLOUD_REGION_ID", raising=False)
    yield EcsCli(ecs_cloud, gp_home)
