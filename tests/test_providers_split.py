"""The provider protocol's split (cloud/providers/base.py core, capabilities.py): a cloud is chosen by `--cloud`
through the registry (cloud/providers/__init__.py), a cloud whose module is not installed is one error line, a
provider that declares no capability is refused by name where cloud/ needs one, and no EC2 or boto name is in
cloud/'s code and messages outside providers/aws* (read over the source: every module of cloud/ itself).
In-process: the registry's entry is swapped for a stub in the test."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpuprov.cloud import providers
from gpuprov.cloud.providers import capabilities as caps
from gpuprov.cloud.providers.aws import AwsProvider
from gpuprov.errors import UserInputError

SRC = Path(__file__).resolve().parents[1] / "src" / "gpuprov" / "cloud"
WORDS = re.compile(r"\bEC2\b|boto|botocore|\bAMIs?\b|Elastic IP|ClientToken|\bami-|\bAWS\b")


def cloud_words(path: Path) -> list[str]:
    """`line: text` of each identifier, attribute, imported module or string (docstrings and comments aside) that
    names EC2, boto or AWS."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            text = " ".join([getattr(node, "module", None) or "", *(a.name for a in node.names)])
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            text = node.name
        else:
            continue
        if WORDS.search(text):
            found.append(f"{node.lineno}: {text[:80]}")
    return found


def test_no_ec2_name_in_cloud_outside_the_aws_modules() -> None:
    found = {path.name: words for path in sorted(SRC.glob("*.py")) if (words := cloud_words(path))}
    assert not found, f"EC2/AWS wording in cloud/ (say it as the provider's title, or move it to providers/aws*): {found}"


class Stub:
    """A provider of the core only: it declares no capability, and is asked nothing here."""

    name = "alibaba"
    capabilities: frozenset[str] = frozenset()

    def __init__(self, owner: str, *, poll: float = 2.0, legacy: str | None = None,
                 team: dict[str, str] | None = None) -> None:
        self.owner = owner

    def __getattr__(self, method: str) -> Any:
        raise AssertionError(f"the stub was asked {method}")


def test_need_gives_the_capability_or_one_line_naming_the_cloud() -> None:
    aws = AwsProvider("gpuprov-test", poll=0.1)
    assert caps.need(aws, caps.PLACEMENT, what="--nodes") is aws
    assert {c.flag for c in caps.ALL} == aws.capabilities
    stub: Any = Stub("me")
    with pytest.raises(UserInputError) as refused:
        caps.need(stub, caps.PLACEMENT, what="--nodes")
    assert str(refused.value).startswith("--nodes: Alibaba Cloud has no cluster placement in gpuprov yet")
    assert caps.offered(stub, caps.ROLES) is None


def test_cloud_not_installed_is_one_error_line(fake_cloud, gp_home, monkeypatch) -> None:
    monkeypatch.setitem(providers.CLOUDS, "alibaba", providers.Cloud("gpuprov.cloud.providers.nowhere", "X",
                                                                      "Alibaba Cloud"))
    result = fake_cloud.gp("gpus", "--live", "--cloud", "alibaba")
    assert result.exit_code == 2, result.output
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    assert line == "error: --cloud: Alibaba Cloud is not in this gpuprov install yet"
    assert "Traceback" not in result.output


def test_a_cloud_without_placement_or_stop_modes_refuses_them_by_name(fake_cloud, gp_home, monkeypatch) -> None:
    monkeypatch.setitem(providers.CLOUDS, "alibaba", providers.Cloud(__name__, "Stub", "Alibaba Cloud"))
    monkeypatch.setenv("GPUPROV_CLOUD", "alibaba")
    result = fake_cloud.gp("up", "c1", "--gpu", "T4", "--nodes", "2", "--ssh-cidr", "198.51.100.7/32", "--yes",
                           "--no-bootstrap")
    assert result.exit_code == 2, result.output
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    assert line == "error: --nodes: Alibaba Cloud has no cluster placement in gpuprov yet"
    result = fake_cloud.gp("up", "s1", "--gpu", "T4", "--spot", "--persistent", "--ssh-cidr", "198.51.100.7/32",
                           "--yes", "--no-bootstrap")
    assert result.exit_code == 2, result.output
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    assert line == "error: --persistent: Alibaba Cloud has no stop modes in gpuprov yet"
    assert not any(fake_cloud.leftovers().values())


class Recorded(Stub):
    """A core provider that answers `instances` (none live) and keeps what it was asked."""

    asked: ClassVar[list[tuple[str, list[str]]]] = []

    def instances(self, region: str, *, ids: Any = (), node: str | None = None, everyone: bool = False) -> list[Any]:
        Recorded.asked.append((region, list(ids)))
        return []


def test_commands_on_nodes_follow_the_cloud_each_records(fake_cloud, gp_home, monkeypatch) -> None:
    from gpuprov.state import NodeState, open_store

    monkeypatch.setitem(providers.CLOUDS, "alibaba", providers.Cloud(__name__, "Recorded", "Alibaba Cloud"))
    monkeypatch.setattr(Recorded, "asked", [])
    store = open_store()
    store.create_node("ali", "alibaba", "us-east-1", state=NodeState.READY, instance_type="ecs.gn7i-c8g1.2xlarge")
    store.created(store.intend("ali", "instance", "us-east-1", "token-ali"), "i-ali")
    store.create_node("web", "aws", "us-east-1", state=NodeState.READY, instance_type="g4dn.xlarge")
    # status --refresh: the Alibaba node is asked of its own cloud, the AWS one of AWS
    result = fake_cloud.gp("status", "--refresh", "--json")
    assert result.exit_code == 0, result.output
    assert Recorded.asked == [("us-east-1", ["i-ali"])]
    # nodes of two clouds at once: refused in one line, nothing asked
    result = fake_cloud.gp("down", "ali", "web", "--yes")
    assert result.exit_code == 2, result.output
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    assert line == "error: NAME: ali, web are nodes of alibaba and aws"


def test_alibaba_lists_its_gpu_types_and_plans_on_them_alone(fake_cloud, gp_home) -> None:
    """`gpus --cloud alibaba` lists its documented types (plan plans on them: tests/test_alibaba_plan.py); `plan
    --live`, which reads EC2's instance types, is one line for it, asking nothing of either cloud."""
    listed = fake_cloud.gp("gpus", "--cloud", "alibaba", "a10", "--json")
    assert listed.exit_code == 0, listed.output
    types = json.loads(listed.stdout)["instance_types"]
    assert [t["instance_type"] for t in types] == ["ecs.gn7i-c8g1.2xlarge", "ecs.gn7i-c32g1.32xlarge"]
    assert all(t["gpu"] == "A10" and t["source"].startswith("https://") for t in types)
    for args in (("plan", "--gpu", "T4", "--live"),):
        result = fake_cloud.gp(*args, "--cloud", "alibaba")
        assert result.exit_code == 2, (args, result.output)
        (line,) = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
        assert line == "error: --live: --live reads EC2's instance types; Alibaba Cloud is planned on its shipped catalog"
        assert "Traceback" not in result.output
