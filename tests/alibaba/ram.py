"""An imitation of Alibaba Cloud RAM's API (2015-05-01) as its official SDK (alibabacloud-ram20150501) sends it, served
beside the ECS imitation (server.py: the same endpoint, told apart by the request's `x-acs-version`), as strict: each
request read back through the SDK's own `<Action>Request` model (its `<Action>ShrinkRequest` where the client sends
one: CreateRole's and CreatePolicy's Tag go as JSON), an unknown or missing parameter refused as ECS's imitation
refuses it, every answer recorded (`answers`) for the contract test to read through `<Action>ResponseBody`.

Rules and their sources (read 2026-12-04):
  - RAM's names: a role's 1 to 64 letters, digits, periods and hyphens, else 400
    InvalidParameter.RoleName.InvalidChars / .Length ("DeleteRole", alibabacloud.com/help/en/resource-management/
    api-deleterole, updated 2025-12-15, and CreateRole's request table); a policy's 1 to 128 letters, digits and
    hyphens (CreatePolicy's request model's words);
  - 404 EntityNotExist.Role "The role does not exist." and 409 DeleteConflict.Role.Policy "The role cannot have any
    attached policies when you delete it." (the same DeleteRole page);
  - 404 EntityNotExist.Policy "The policy does not exist." (DeletePolicy's error table, in a copy of Alibaba's API
    documents kept in a public repository; it lists 409 DeleteConflict.Policy.User / .Group / .Version, none for a
    role: a policy still attached to a role is not refused here);
  - 409 EntityAlreadyExists.Role, EntityAlreadyExists.Policy, EntityAlreadyExists.Role.Policy, 404
    EntityNotExist.Role.Policy: their codes as RAM's clients and Alibaba's own console guides name them (DTS's
    "EntityAlreadyExists.Role and EntityAlreadyExists.Role.Policy" page); their messages unverified;
  - a role's trust policy names who may assume it; ECS takes a role for an instance only when it trusts
    `ecs.aliyuncs.com` (RunInstances' 401 InvalidRamRole.NotEcsRole, server.py); RAM is eventually consistent: ECS may
    not know a role for a moment after CreateRole answers (`lag`: RunInstances refused InvalidRamRole.NotFound that
    many times per new role).

`credentials(role)` hands out the STS credentials ECS's metadata would give an instance with the role, and grants them
to the ECS imitation allowed only the ECS actions the role's attached policies name (its RPC-signed path checks them).
"""

from __future__ import annotations

import itertools
import json
import re
import time
import uuid
from typing import Any

from alibabacloud_ram20150501 import models

from tests.alibaba.server import Fault, Refused, check_request, meet

VERSION = "2015-05-01"
REQUIRED = {
    "CreateRole": ("RoleName", "AssumeRolePolicyDocument"),
    "GetRole": ("RoleName",),
    "DeleteRole": ("RoleName",),
    "CreatePolicy": ("PolicyName", "PolicyDocument"),
    "GetPolicy": ("PolicyName", "PolicyType"),
    "DeletePolicy": ("PolicyName",),
    "AttachPolicyToRole": ("PolicyType", "PolicyName", "RoleName"),
    "DetachPolicyFromRole": ("PolicyType", "PolicyName", "RoleName"),
    "ListPoliciesForRole": ("RoleName",),
}
ACCOUNT = "1234567890123456"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Ram:
    """RAM's state for the one account: roles, custom policies, which is attached to which."""

    def __init__(self) -> None:
        self.roles: dict[str, dict[str, Any]] = {}
        self.policies: dict[str, dict[str, Any]] = {}
        self.attached: set[tuple[str, str]] = set()  # (role, policy)
        self.tags: dict[str, dict[str, str]] = {}  # role -> its tags
        self.unseen: dict[str, int] = {}  # role -> RunInstances ECS still refuses it for
        self.lag = 0
        self.faults: list[Fault] = []
        self.answers: list[tuple[str, dict[str, Any]]] = []
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.keys = itertools.count(1)

    def handle(self, action: str, flat: dict[str, str]) -> tuple[dict[str, Any], bool, bool]:
        """The answer, whether it is lost after the work is done, and whether it is held (the caller, holding the ECS
        imitation's lock now, waits for its `release` once it has let go of the lock)."""
        self.calls.append((action, flat))
        request = check_request(action, flat, models, REQUIRED)
        lose, hold = meet(self.faults, action)
        body = getattr(self, action)(request.to_map())
        body["RequestId"] = str(uuid.uuid4()).upper()
        self.answers.append((action, body))
        return body, lose, hold

    # --- roles -------------------------------------------------------------------------------------------

    def _role_name(self, name: str) -> str:
        if len(name) > 64:
            raise Refused(400, "InvalidParameter.RoleName.Length", "The maximum length of the role name is exceeded.")
        if not re.fullmatch(r"[A-Za-z0-9.-]+", name):
            raise Refused(400, "InvalidParameter.RoleName.InvalidChars", "The specified role name contains invalid "
                          "characters.")
        return name

    def _role(self, name: str) -> dict[str, Any]:
        if name not in self.roles:
            raise Refused(404, "EntityNotExist.Role", "The role does not exist.")
        return self.roles[name]

    def _listed(self, name: str) -> dict[str, Any]:
        """A role as ListRoles answers it: with its tags, without its trust policy (GetRole's is the other way round,
        as the SDK's response models have them)."""
        tags = self.tags.get(name, {})
        return {**{k: v for k, v in self.roles[name].items() if k != "AssumeRolePolicyDocument"},
                "Tags": {"Tag": [{"TagKey": k, "TagValue": v} for k, v in tags.items()]}}

    def CreateRole(self, p: dict[str, Any]) -> dict[str, Any]:
        name = self._role_name(p["RoleName"])
        if name in self.roles:
            raise Refused(409, "EntityAlreadyExists.Role", "The role already exists.")
        json.loads(p["AssumeRolePolicyDocument"])  # a malformed one would be MalformedPolicyDocument: gpuprov's is not
        self.roles[name] = {"RoleName": name, "RoleId": str(next(self.keys) * 7919), "Arn": f"acs:ram::{ACCOUNT}:role/"
                            f"{name.lower()}", "Description": p.get("Description", ""),
                            "AssumeRolePolicyDocument": p["AssumeRolePolicyDocument"], "MaxSessionDuration": 3600,
                            "CreateDate": _now(), "UpdateDate": _now()}
        self.tags[name] = {t["Key"]: t["Value"] for t in json.loads(p.get("Tag") or "[]")}
        self.unseen[name] = self.lag
        return {"Role": {k: v for k, v in self.roles[name].items() if k != "UpdateDate"}}

    def GetRole(self, p: dict[str, Any]) -> dict[str, Any]:
        self._role(p["RoleName"])
        return {"Role": dict(self.roles[p["RoleName"]])}

    def ListRoles(self, p: dict[str, Any]) -> dict[str, Any]:
        names = sorted(self.roles)
        start = int(p.get("Marker") or 0)
        size = int(p.get("MaxItems") or 100)
        if not 1 <= size <= 1000:
            raise Refused(400, "InvalidParameter.MaxItems", "The parameter MaxItems is invalid.")  # code unverified
        page = names[start:start + size]
        more = start + size < len(names)
        return {"Roles": {"Role": [self._listed(n) for n in page]}, "IsTruncated": more,
                **({"Marker": str(start + size)} if more else {})}

    def DeleteRole(self, p: dict[str, Any]) -> dict[str, Any]:
        name = self._role(p["RoleName"])["RoleName"]
        if any(role == name for role, _ in self.attached):
            raise Refused(409, "DeleteConflict.Role.Policy", "The role cannot have any attached policies when you "
                          "delete it.")
        del self.roles[name]
        self.tags.pop(name, None)
        self.unseen.pop(name, None)
        return {}

    # --- policies ------------------------------------------------------------------------------------------

    def _policy(self, name: str) -> dict[str, Any]:
        if name not in self.policies:
            raise Refused(404, "EntityNotExist.Policy", "The policy does not exist.")
        return self.policies[name]

    def CreatePolicy(self, p: dict[str, Any]) -> dict[str, Any]:
        name = p["PolicyName"]
        if not re.fullmatch(r"[A-Za-z0-9-]{1,128}", name):
            raise Refused(400, "InvalidParameter.PolicyName.InvalidChars", "The parameter PolicyName contains invalid "
                          "chars.")
        if name in self.policies:
            raise Refused(409, "EntityAlreadyExists.Policy", "The policy already exists.")
        json.loads(p["PolicyDocument"])
        self.policies[name] = {"PolicyName": name, "PolicyType": "Custom", "Description": p.get("Description", ""),
                               "DefaultVersion": "v1", "CreateDate": _now(), "document": p["PolicyDocument"]}
        return {"Policy": {k: v for k, v in self.policies[name].items() if k != "document"}}

    def GetPolicy(self, p: dict[str, Any]) -> dict[str, Any]:
        policy = self._policy(p["PolicyName"])
        return {"Policy": {**{k: v for k, v in policy.items() if k != "document"},
                           "AttachmentCount": sum(1 for _, n in self.attached if n == policy["PolicyName"])},
                "DefaultPolicyVersion": {"VersionId": "v1", "IsDefaultVersion": True,
                                         "PolicyDocument": policy["document"], "CreateDate": policy["CreateDate"]}}

    def DeletePolicy(self, p: dict[str, Any]) -> dict[str, Any]:
        self._policy(p["PolicyName"])
        del self.policies[p["PolicyName"]]
        self.attached = {(r, n) for r, n in self.attached if n != p["PolicyName"]}
        return {}

    def AttachPolicyToRole(self, p: dict[str, Any]) -> dict[str, Any]:
        role, policy = self._role(p["RoleName"])["RoleName"], self._policy(p["PolicyName"])["PolicyName"]
        if (role, policy) in self.attached:
            raise Refused(409, "EntityAlreadyExists.Role.Policy", "The policy has already been attached to this role.")
        self.attached.add((role, policy))
        return {}

    def DetachPolicyFromRole(self, p: dict[str, Any]) -> dict[str, Any]:
        role, policy = self._role(p["RoleName"])["RoleName"], self._policy(p["PolicyName"])["PolicyName"]
        if (role, policy) not in self.attached:
            raise Refused(404, "EntityNotExist.Role.Policy", "The policy has not been attached to this role.")
        self.attached.discard((role, policy))
        return {}

    def ListPoliciesForRole(self, p: dict[str, Any]) -> dict[str, Any]:
        role = self._role(p["RoleName"])["RoleName"]
        rows = [{"PolicyName": n, "PolicyType": self.policies[n]["PolicyType"], "DefaultVersion": "v1",
                 "Description": self.policies[n]["Description"], "AttachDate": _now()}
                for r, n in sorted(self.attached) if r == role]
        return {"Policies": {"Policy": rows}}

    # --- what ECS reads of it ---------------------------------------------------------------------------

    def for_ecs(self, name: str) -> None:
        """RunInstances' check of its RamRoleName: known (after `lag` looks) and trusting ECS, refused as ECS does."""
        if name not in self.roles or self.unseen.get(name, 0) > 0:
            if name in self.unseen:
                self.unseen[name] -= 1
            raise Refused(404, "InvalidRamRole.NotFound", "The specified parameter \"RAMRoleName\" does not exist.")
        trust = json.loads(self.roles[name]["AssumeRolePolicyDocument"])
        services = [s for st in trust.get("Statement", []) if st.get("Action") == "sts:AssumeRole"
                    for s in ((st.get("Principal") or {}).get("Service") or [])]
        if "ecs.aliyuncs.com" not in services:
            raise Refused(401, "InvalidRamRole.NotEcsRole", "The specified ram role is not authorized for ecs, please "
                          "check your role policy.")

    def allowed(self, name: str) -> tuple[str, ...]:
        """The ECS actions the role's attached policies allow (`ecs:StopInstances` -> StopInstances)."""
        actions: list[str] = []
        for role, policy in sorted(self.attached):
            if role != name:
                continue
            for statement in json.loads(self.policies[policy]["document"]).get("Statement", []):
                if statement.get("Effect") == "Allow":
                    given = statement.get("Action")
                    actions += [a.removeprefix("ecs:") for a in ([given] if isinstance(given, str) else given)
                                if a.startswith("ecs:")]
        return tuple(actions)
