"""The RAM role an Alibaba Cloud node's guards stop it with: what `capabilities.StopRole` asks of Alibaba Cloud,
through Alibaba's RAM SDK (alibabacloud-ram20150501).

The node's `ecs-stop` (templates/guard_ecs_stop.py.j2) reads its instance RAM role's STS credentials from ECS's
metadata and asks ECS for StopInstances in economical mode; this module makes that role. One per owner (RAM is global:
no region), shared by every Alibaba node of the owner, named from the owner's digest so that its name is known before
it is made and is the same on every machine of the install:
  - the role, trusted by ECS only (the trust policy's Principal Service `ecs.aliyuncs.com`, as "Create an instance RAM
    role" shows it: alibabacloud.com/help/en/ecs/user-guide/attach-an-instance-ram-role-to-an-ecs-instance, read
    2026-12-04), with gpuprov's tags (CreateRole's Tag) and a description naming what it is for;
  - a custom policy of the same name allowing ecs:StopInstances and nothing else, on ECS instances: StopInstances'
    RAM authorization table names the resource type Instance (`acs:ecs:{#regionId}:{#accountId}:instance/
    {#instanceId}`) and no condition key ("StopInstances", alibabacloud.com/help/en/ecs/api-stopinstances, read
    2026-12-04), so no tag or per-instance condition can narrow it: the role may stop any instance of the account, in
    any region (docs/alibaba.md says so). ecs-stop sends StopInstances only, so the singular StopInstance is left out;
  - the policy attached to the role (AttachPolicyToRole, PolicyType Custom).

RAM takes no ClientToken: each create is sent on a client with its own retries off, and after an answer that never
came the result is looked for (GetRole, GetPolicy, ListPoliciesForRole) before it is asked for again; a resend that
meets the first create is refused as EntityAlreadyExists.Role, EntityAlreadyExists.Policy or
EntityAlreadyExists.Role.Policy, which is read as that first create (the name is this owner's alone). Removal in the
order RAM requires: the policy detached (DeleteRole: "409 DeleteConflict.Role.Policy: The role cannot have any
attached policies when you delete it", alibabacloud.com/help/en/resource-management/api-deleterole, updated
2025-12-15), then the role, then the policy.

GPUPROV_ALIBABA_ENDPOINT points RAM's calls at the same endpoint as ECS's (the tests' imitation serves both);
otherwise RAM's one endpoint, ram.aliyuncs.com (the SDK's endpoint map names it for every region).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from gpuprov import mutations
from gpuprov.cloud.providers.alibaba_base import RETRIES, EcsBase, EcsError, EcsNoAnswer
from gpuprov.cloud.providers.base import GLOBAL, SHARED, TAG_NODE, TAG_OWNER, TAG_TEAM, CloudResource, NotFound

RAM_ENDPOINT = "ram.aliyuncs.com"
TRUST = {"Version": "1", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                        "Principal": {"Service": ["ecs.aliyuncs.com"]}}]}
POLICY = {"Version": "1", "Statement": [{"Effect": "Allow", "Action": ["ecs:StopInstances"],
                                         "Resource": ["acs:ecs:*:*:instance/*"]}]}
MARK = "gpuprov:"  # the description's first word: a role gpuprov made
PAGE = 1000  # ListRoles' largest MaxItems
THROTTLED = ("Throttling", "ServiceUnavailable", "InternalError")


class RamRoles(EcsBase):
    """Make, find, list and delete the owner's stop role."""

    def stop_role_name(self) -> str:
        """The role's (and its policy's) name: RAM's names take letters, digits, periods and hyphens, 64 at most."""
        return f"gpuprov-stop-{hashlib.sha256(self.owner.encode()).hexdigest()[:12]}"

    # --- the one path every RAM call takes ---------------------------------------------------------

    def _ram_client(self) -> Any:
        from alibabacloud_ram20150501.client import Client

        with self._lock:
            return self._made("ram", Client, "alibaba-ram", endpoint=RAM_ENDPOINT)

    def _ram(self, action: str, **params: Any) -> dict[str, Any]:
        """One RAM call, the request built by the SDK's `<Action>Request` model; a read is sent again after no
        answer or throttling, a change never here (`_create` looks first)."""
        from alibabacloud_ram20150501 import models

        from gpuprov.cloud.providers.alibaba_base import _method

        method = _method(action, "alibabacloud_ram20150501")
        for attempt in range(1, RETRIES + 1):
            self.fence()
            request = getattr(models, f"{action}Request")().from_map(params)
            try:
                return self._ask(self._ram_client(), request, method, action, f"RAM {action}")
            except EcsNoAnswer:
                if mutations.changes(action) or attempt == RETRIES:
                    raise
            except EcsError as exc:
                if not exc.code.startswith(THROTTLED) or mutations.changes(action) or attempt == RETRIES:
                    raise
            time.sleep(self.poll * attempt)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _create(self, action: str, exists: str, look: Callable[[], bool], **params: Any) -> None:
        """A create RAM cannot deduplicate: after no answer (or throttling) `look` for its result before it is sent
        again; `exists` (the refusal a resend meets when the first was made) is that first create."""
        for attempt in range(1, RETRIES + 1):
            try:
                self._ram(action, **params)
                return
            except EcsNoAnswer:
                if attempt == RETRIES:
                    raise
            except EcsError as exc:
                if exc.code == exists:
                    return
                if not exc.code.startswith(THROTTLED) or attempt == RETRIES:
                    raise
            time.sleep(self.poll * attempt)
            if look():
                return
        raise AssertionError("unreachable: the last attempt returns or raises")

    # --- make ----------------------------------------------------------------------------------------

    def create_stop_role(self) -> str:
        """The policy, the role, and the one attached to the other, each found or made; returns the role's name."""
        name = self.stop_role_name()
        tags = [{"Key": k, "Value": v} for k, v in {TAG_NODE: SHARED, TAG_OWNER: self.owner, **(self.team or {})}.items()]
        description = (f"{MARK} lets the ECS instances of {self.owner} stop themselves in economical mode (their "
                       "autostop and TTL); deleted with the last of them")[:1024]
        self._create("CreatePolicy", "EntityAlreadyExists.Policy", lambda: self._has_policy(name), PolicyName=name,
                     PolicyDocument=json.dumps(POLICY), Description=description[:1024], Tag=tags)
        self._create("CreateRole", "EntityAlreadyExists.Role", lambda: self._role(name) is not None, RoleName=name,
                     AssumeRolePolicyDocument=json.dumps(TRUST), Description=description, Tag=tags)
        self._create("AttachPolicyToRole", "EntityAlreadyExists.Role.Policy", lambda: self._attached(name),
                     PolicyType="Custom", PolicyName=name, RoleName=name)
        return name

    def has_stop_role(self) -> bool:
        return self._role(self.stop_role_name()) is not None

    def _role(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self._ram("GetRole", RoleName=name).get("Role") or {})
        except EcsError as exc:
            if exc.code == "EntityNotExist.Role":
                return None
            raise

    def _has_policy(self, name: str) -> bool:
        try:
            self._ram("GetPolicy", PolicyName=name, PolicyType="Custom")
        except EcsError as exc:
            if exc.code == "EntityNotExist.Policy":
                return False
            raise
        return True

    def _attached(self, name: str) -> bool:
        reply = self._ram("ListPoliciesForRole", RoleName=name)
        return any(p.get("PolicyName") == name for p in (reply.get("Policies") or {}).get("Policy") or [])

    # --- list and delete -------------------------------------------------------------------------------

    def tagged_stop_roles(self, everyone: bool = False) -> list[CloudResource]:
        """gpuprov's stop roles of this owner (`everyone`: of every install with this user and host name), with the
        owner their tags name, for `gc`: every page of ListRoles, whose rows carry their tags."""
        found, marker = [], None
        while True:
            page = self._ram("ListRoles", MaxItems=PAGE, **({"Marker": marker} if marker else {}))
            for role in (page.get("Roles") or {}).get("Role") or []:
                name = str(role.get("RoleName") or "")
                if not name.startswith("gpuprov-stop-"):
                    continue
                tags = {str(t.get("TagKey")): str(t.get("TagValue")) for t in (role.get("Tags") or {}).get("Tag") or []}
                if self._mine(tags, everyone):
                    found.append(CloudResource("ram-role", name, GLOBAL, SHARED, "", tags.get(TAG_OWNER),
                                               tags.get(TAG_TEAM)))
            marker = page.get("Marker") if page.get("IsTruncated") else None
            if not marker:
                return found

    def delete_stop_role(self, name: str) -> None:
        """The policy detached, the role deleted, then the policy; NotFound when neither was there (a create whose
        record was written and whose call never went out)."""
        gone = 0
        for action, params, missing in (
                ("DetachPolicyFromRole", {"PolicyType": "Custom", "PolicyName": name, "RoleName": name},
                 ("EntityNotExist.Role.Policy", "EntityNotExist.Role", "EntityNotExist.Policy")),
                ("DeleteRole", {"RoleName": name}, ("EntityNotExist.Role",)),
                ("DeletePolicy", {"PolicyName": name}, ("EntityNotExist.Policy",))):
            try:
                self._ram(action, **params)
            except EcsError as exc:
                if exc.code not in missing:
                    raise
                gone += action != "DetachPolicyFromRole"
        if gone == 2:
            raise NotFound("ram-role", name, "EntityNotExist.Role")
