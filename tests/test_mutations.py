"""The table of every AWS call gpuprov makes that changes something (gpuprov/mutations.py), and its guard.

The table must name every mutating operation the source sends (found here by scanning src/ for client calls and
matching them with botocore's own service models), each a real operation of its service; the guard, on every client
gpuprov builds, refuses an unlisted mutating call and a LOOK/ONCE one on a client that retries. The behaviour of
each class after a lost answer is tested through the CLI against the local endpoint (test_aws_contracts.py,
test_aws_capacity.py, test_team_store.py)."""

from __future__ import annotations

import re
from pathlib import Path

import botocore.session
import pytest
from botocore import xform_name
from botocore.stub import Stubber

from gpuprov import mutations
from gpuprov.cloud.providers.aws_base import AwsBase
from gpuprov.errors import GpuprovBug

SRC = Path(__file__).resolve().parent.parent / "src" / "gpuprov"
CLIENTS = {"ec2": "ec2", "iam": "iam", "s3": "s3", "self.s3": "s3"}  # the names src/ gives its clients
CALL = re.compile(r"\b(self\.s3|ec2|iam|s3)\.([a-z_0-9]+)\b")


def _operations(service: str) -> dict[str, str]:
    model = botocore.session.get_session().get_service_model(service)
    return {xform_name(op): op for op in model.operation_names}


def test_every_mutating_call_in_the_source_is_in_the_table():
    ops = {s: _operations(s) for s in set(CLIENTS.values())}
    sent: set[tuple[str, str]] = set()
    for path in SRC.rglob("*.py"):
        for var, method in CALL.findall(path.read_text()):
            service = CLIENTS[var]
            if method in ops[service]:
                sent.add((service, ops[service][method]))
    mutating = {(s, op) for s, op in sent if mutations.changes(op)}
    assert ("ec2", "PurchaseCapacityBlock") in mutating and ("s3", "PutObject") in mutating  # the scan sees them
    assert mutating - set(mutations.MUTATIONS) == set()


def test_every_table_entry_is_an_operation_of_its_service():
    from alibabacloud_ecs20140526 import models as ecs_models
    from alibabacloud_ram20150501 import models as ram_models

    for service, op in mutations.MUTATIONS:
        if service in ("alibaba-ecs", "alibaba-ram"):  # Alibaba Cloud's SDKs: one request model per action
            assert hasattr(ecs_models if service == "alibaba-ecs" else ram_models, f"{op}Request"), op
        else:
            assert op in _operations(service).values(), (service, op)
        assert mutations.changes(op)


def test_every_ecs_action_the_alibaba_provider_sends_is_a_read_or_in_the_table():
    source = "".join(p.read_text() for p in (SRC / "cloud" / "providers").glob("alibaba*.py"))
    sent = set(re.findall(r'_(?:call|send|pages|each)\(\s*[\w.]+,\s*"([A-Z][A-Za-z]+)"', source))
    from alibabacloud_ecs20140526 import models as ecs_models

    actions = {a for a in sent if hasattr(ecs_models, f"{a}Request")}
    assert {"RunInstances", "DescribeInstances", "StopInstances"} <= actions  # the scan sees them
    assert {a for a in actions if mutations.changes(a)} - {op for s, op in mutations.MUTATIONS
                                                           if s == "alibaba-ecs"} == set()


def test_the_alibaba_client_refuses_an_unlisted_action_before_it_is_sent(monkeypatch):
    from alibabacloud_ecs20140526 import models as ecs_models

    from gpuprov.cloud.providers.alibaba import AlibabaProvider

    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "testing")
    monkeypatch.setenv("ALIBABA_CLOUD_ECS_METADATA_DISABLED", "true")
    monkeypatch.setenv("GPUPROV_ALIBABA_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: never reached
    client = AlibabaProvider("me@test")._client("cn-hangzhou")
    with pytest.raises(GpuprovBug, match="alibaba-ecs RebootInstances changes something"):
        client.reboot_instances(ecs_models.RebootInstancesRequest(region_id="cn-hangzhou", instance_id=["i-1"]))


@pytest.fixture
def ec2_clients(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    base = AwsBase("me@test")
    return base._client("ec2", "us-east-1"), base._client("ec2", "us-east-1", retries=False)


def test_the_guard_refuses_an_unlisted_mutating_call_before_it_is_sent(ec2_clients):
    retrying, _ = ec2_clients
    with pytest.raises(GpuprovBug, match="CreateVpc changes something and is not in"):
        retrying.create_vpc(CidrBlock="10.0.0.0/16")  # refused at before-call: nothing is sent
    with Stubber(retrying) as stub:
        stub.add_response("describe_vpcs", {"Vpcs": []})
        assert retrying.describe_vpcs()["Vpcs"] == []  # reads pass


@pytest.mark.parametrize("call,args", [
    ("import_key_pair", {"KeyName": "k", "PublicKeyMaterial": b"ssh-ed25519 AAAA"}),
    ("allocate_address", {"Domain": "vpc"}),
    ("purchase_capacity_block", {"CapacityBlockOfferingId": "cb-1", "InstancePlatform": "Linux/UNIX"}),
])
def test_a_call_that_must_not_be_resent_goes_only_on_a_client_without_retries(ec2_clients, call, args):
    retrying, once = ec2_clients
    with pytest.raises(GpuprovBug, match="would be sent again by botocore's retries"):
        getattr(retrying, call)(**args)
    with Stubber(once) as stub:
        stub.add_response(call, {})
        getattr(once, call)(**args)  # the guard lets it through; the stub answers


def test_the_team_buckets_client_is_guarded_too(monkeypatch):
    from gpuprov.state import s3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with pytest.raises(GpuprovBug, match="DeleteBucket changes something"):
        s3.client().delete_bucket(Bucket="b")
