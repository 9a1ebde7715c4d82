"""docs/iam-policy.json, the policy the README tells a new AWS user to attach, names every AWS action gpuprov's
code calls: the mutating ones (gpuprov/mutations.py's table, which test_mutations.py holds to the source) and the
reads, found here by scanning src/ for client calls as test_mutations.py does (client methods, paginators, and the
operation names handed to the providers' `_call`/`_pages`), matched with botocore's own service models. An action
the policy names that no call needs must be one IAM asks for beside a call (IMPLIED), so the policy grants no
more than gpuprov uses. docs/alibaba-ram-policy.json is held the same way to the Alibaba provider's ECS and RAM actions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import botocore.session
from botocore import xform_name

from gpuprov import mutations

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "gpuprov"
POLICY = ROOT / "docs" / "iam-policy.json"
SERVICES = ("ec2", "iam", "s3", "ssm", "kms", "service-quotas")
CLIENTS = {"ec2": "ec2", "iam": "iam", "s3": "s3", "self.s3": "s3", "ssm": "ssm", "kms": "kms"}  # src/'s names
CALL = re.compile(r"\b(self\.s3|ec2|iam|s3|ssm|kms)\.(?:get_paginator\(\")?([a-z_0-9]+)\b")
CLIENT_CALL = re.compile(r"_client\(\"([a-z-]+)\"[^)]*\)\.([a-z_0-9]+)\(")  # service-quotas, asked in one line
NAMED = re.compile(r"_(?:call|pages|settle)\(\s*(?:[a-z0-9_]+,\s*)?\"(?:([a-z-]+):)?([A-Z][A-Za-z0-9]+)\"")
# the IAM service prefix of an API's service, and the actions whose IAM name is not the operation's
PREFIX = {"service-quotas": "servicequotas"}
ACTION = {("s3", "ListObjectsV2"): "s3:ListBucket", ("s3", "HeadObject"): "s3:GetObject",
          ("s3", "GetBucketEncryption"): "s3:GetEncryptionConfiguration"}
# asked for by IAM beside a call, never called themselves
IMPLIED = {
    "ec2:CreateTags": "RunInstances, CreateSecurityGroup, ... with TagSpecifications (tag on create)",
    "iam:PassRole": "RunInstances with an instance profile (--instance-profile, --s3-access)",
    "iam:TagRole": "CreateRole with Tags",
    "iam:TagInstanceProfile": "CreateInstanceProfile with Tags",
}


def called() -> set[str]:
    session = botocore.session.get_session()
    ops = {s: {xform_name(o): o for o in session.get_service_model(s).operation_names} for s in SERVICES}
    found: set[tuple[str, str]] = {(s, op) for s, op in mutations.MUTATIONS if s in SERVICES}
    for path in SRC.rglob("*.py"):
        if path.name.startswith("alibaba"):
            continue  # Alibaba Cloud's API: RAM, not IAM, grants it (docs/alibaba.md)
        text = path.read_text()
        for var, method in CALL.findall(text):
            if method in ops[CLIENTS[var]]:
                found.add((CLIENTS[var], ops[CLIENTS[var]][method]))
        for service, method in CLIENT_CALL.findall(text):
            if method in ops.get(service, {}):
                found.add((service, ops[service][method]))
        for service, name in NAMED.findall(text):
            owner = next((s for s in ([service] if service else ["ec2", "iam", "s3"]) if name in ops[s].values()), None)
            if owner is not None:
                found.add((owner, name))
    return {ACTION.get((s, op), f"{PREFIX.get(s, s)}:{op}") for s, op in found}


def granted() -> set[str]:
    policy = json.loads(POLICY.read_text())
    assert policy["Version"] == "2012-10-17"
    actions: set[str] = set()
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        actions |= set(statement["Action"])
    return actions


def test_the_policy_names_every_action_gpuprov_calls() -> None:
    needed = called()
    assert {"ec2:RunInstances", "ec2:DescribeSpotPriceHistory", "servicequotas:GetServiceQuota",
            "ssm:GetParameter", "s3:ListBucket"} <= needed  # the scan sees the reads, not only the table
    missing = sorted(needed - granted())
    assert missing == [], f"docs/iam-policy.json lacks {missing}"


def test_the_policy_names_nothing_gpuprov_does_not_call() -> None:
    extra = sorted(granted() - called() - set(IMPLIED))
    assert extra == [], f"docs/iam-policy.json grants {extra}, which no call in src/ needs"


# --- Alibaba Cloud: docs/alibaba-ram-policy.json, the RAM policy docs/alibaba.md tells a RAM user to attach ---------

RAM_POLICY = ROOT / "docs" / "alibaba-ram-policy.json"
# what the Alibaba provider sends: an action named to its client (`_call`, `_pages`, `_send`, `_each`), as
# test_mutations.py reads them, and every row of the mutations table for its API (the client refuses any other change)
SENT = re.compile(r"_(?:call|send|pages|each)\(\s*[\w.]+,\s*\"([A-Z][A-Za-z]+)\"")
# ECS's RAM code is "ecs,vpc" ("RAM authorization", help/en/ecs/authentication-rules): ECS's own copies of VPC's
# listings are read as VPC's actions (VPC's API reference names them vpc:DescribeVpcs, vpc:DescribeVSwitches); the
# rest is ecs:<Action>
# and so are the VPC's and vSwitch's creates and deletes gpuprov's own network sends through ECS (vpc:CreateVpc, in
# "CreateVpc"'s RAM authorization table, alibabacloud.com/help/en/vpc/api-createvpc; vpc:DeleteVSwitch in
# DeleteVSwitch's, alibabacloud.com/help/en/vpc/developer-reference/api-vpc-2016-04-28-deletevswitch)
RAM_ACTION = {a: f"vpc:{a}" for a in ("DescribeVpcs", "DescribeVSwitches", "CreateVpc", "CreateVSwitch", "DeleteVpc",
                                      "DeleteVSwitch")}


def ecs_called() -> set[str]:
    from alibabacloud_ecs20140526 import models

    source = "".join(p.read_text() for p in (SRC / "cloud" / "providers").glob("alibaba*.py"))
    actions = {a for a in SENT.findall(source) if hasattr(models, f"{a}Request")}
    actions |= {op for service, op in mutations.MUTATIONS if service == "alibaba-ecs"}
    return {RAM_ACTION.get(a, f"ecs:{a}") for a in actions}


def ram_called() -> set[str]:
    """RAM's actions the provider sends (alibaba_ram.py: `_ram("Action"` and `_create("Action"`, and the mutations
    table's alibaba-ram rows), and ram:PassRole, which RunInstances' RamRoleName needs of the caller (RunInstances' 403
    InvalidUser.PassRoleForbidden "The RAM user does not have the privilege to pass a RAM role.")."""
    from alibabacloud_ram20150501 import models

    source = (SRC / "cloud" / "providers" / "alibaba_ram.py").read_text()
    actions = set(re.findall(r'_(?:ram|create)\(\s*"([A-Z][A-Za-z]+)"', source))
    actions |= {op for service, op in mutations.MUTATIONS if service == "alibaba-ram"}
    assert all(hasattr(models, f"{a}Request") for a in actions)
    return {f"ram:{a}" for a in actions} | {"ram:PassRole"}


def test_the_ram_policy_names_exactly_the_ecs_actions_the_alibaba_provider_sends() -> None:
    policy = json.loads(RAM_POLICY.read_text())
    assert policy["Version"] == "1"
    allowed: set[str] = set()
    for statement in policy["Statement"]:
        # RAM's own actions on gpuprov's role and its policy only, but its listing
        scoped = ["acs:ram:*:*:role/gpuprov-stop-*", "acs:ram:*:*:policy/gpuprov-stop-*"]
        assert statement["Effect"] == "Allow" and statement["Resource"] in ("*", scoped)
        assert statement["Resource"] == "*" or all(a.startswith("ram:") for a in statement["Action"])
        allowed |= set(statement["Action"])
    needed = ecs_called() | ram_called()
    assert {"ram:CreateRole", "ram:PassRole", "ram:ListRoles"} <= needed
    assert {"ecs:RunInstances", "ecs:DescribeInstances", "ecs:StopInstances", "vpc:DescribeVpcs"} <= needed
    assert sorted(needed - allowed) == [], f"docs/alibaba-ram-policy.json lacks {sorted(needed - allowed)}"
    assert sorted(allowed - needed) == [], f"docs/alibaba-ram-policy.json grants {sorted(allowed - needed)}, which " \
        "no call of the Alibaba provider needs"
