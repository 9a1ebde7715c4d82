"""A cluster's deployment set on ECS: what `capabilities.Placement` asks of Alibaba Cloud.

A deployment set of strategy LowLatency keeps its instances "within the same network topology" of one zone (ECS user
guide, "Deployment sets", alibabacloud.com/help/en/doc-detail/130139.html, updated 2025-12-15, read 2026-12-04).
RunInstances' DeploymentSetId puts every instance of its Amount into the set; Amount and MinAmount are all-or-nothing
below MinAmount ("If the ECS inventory is less than MinAmount: No ECS instances are created", RunInstances' request
model in alibabacloud-ecs20140526 7.11.8, as the API reference words it).

ECS tags no deployment set: CreateDeploymentSet takes no Tag, and neither TagResources nor ListTagResources lists
`deploymentset` among their resource types (their request models, same SDK). So the set carries gpuprov's tags in its
description (`gpuprov:node=… gpuprov:owner=…`), written when it is made, and `tagged_sets` reads them back for gc; its
name is the one `up` recorded before the call, and CreateDeploymentSet's ClientToken is that name, so a resend after a
lost answer is the same set. DeleteDeploymentSet refuses a set that still holds instances (403
DependencyViolation.NotEmpty, "There are still instance(s) in the specified DeploymentSetId.": DeleteDeploymentSet API
reference, doc-detail/91311, updated 2026-01-28); DescribeDeploymentSets pages by 50 at most (its request model).
"""

from __future__ import annotations

from gpuprov.backoff import tries
from gpuprov.cloud.providers.alibaba_base import EcsBase, EcsError
from gpuprov.cloud.providers.base import TAG_NODE, TAG_OWNER, TAG_TEAM, CloudResource, NotFound

STRATEGY = "LowLatency"
SET_PAGE = 50  # DescribeDeploymentSets' largest PageSize
MARK = "gpuprov cluster:"  # the description's first words: a set gpuprov made
IN_USE = 300.0  # seconds a released instance may still count as the set's (DependencyViolation.NotEmpty)


class EcsSets(EcsBase):
    """Create, find, list and delete a cluster's LowLatency deployment set; all traffic between the cluster's nodes."""

    def create_placement_group(self, region: str, node: str, name: str) -> str:
        """CreateDeploymentSet (LowLatency) called `name`, gpuprov's tags in its description; returns its id."""
        tags = {TAG_NODE: node, TAG_OWNER: self.owner, **(self.team or {})}
        reply = self._call(region, "CreateDeploymentSet", DeploymentSetName=name, Strategy=STRATEGY,
                           Description=" ".join([MARK, *(f"{k}={v}" for k, v in tags.items())]),
                           ClientToken=name[:64])
        return str(reply["DeploymentSetId"])

    def authorize_self(self, region: str, group_id: str, settle: float) -> None:
        """Every protocol and port from the security group's own members (NCCL, torchrun's rendezvous)."""
        self._settle("security-group", group_id, settle, lambda: self._call(
            region, "AuthorizeSecurityGroup", SecurityGroupId=group_id, IpProtocol="all", PortRange="-1/-1",
            SourceGroupId=group_id, ClientToken=f"self-{group_id}"[:64]))

    def _sets(self, region: str, **filters: str) -> list[dict[str, object]]:
        return self._pages(region, "DescribeDeploymentSets", ("DeploymentSets", "DeploymentSet"), size=SET_PAGE,
                           **filters)

    def tagged_sets(self, region: str) -> list[CloudResource]:
        """The region's deployment sets gpuprov made, with the node and owner their description names."""
        out = []
        for raw in self._sets(region, Strategy=STRATEGY):
            text = str(raw.get("DeploymentSetDescription") or "")
            if not text.startswith(MARK):
                continue
            tags = dict(word.split("=", 1) for word in text.removeprefix(MARK).split() if "=" in word)
            out.append(CloudResource(kind="placement-group", id=str(raw["DeploymentSetId"]), region=region,
                                     node=tags.get(TAG_NODE), owner=tags.get(TAG_OWNER), team=tags.get(TAG_TEAM),
                                     member=tags.get("gpuprov:member")))
        return out

    def delete_set(self, region: str, set_id: str, settle: float) -> None:
        """DeleteDeploymentSet by id, or by the recorded name of a create whose answer was lost (NotFound when no set
        has it); a set ECS still counts an instance in is asked again for a while."""
        if not set_id.startswith("ds-"):
            named = self._sets(region, DeploymentSetName=set_id)
            if not named:
                raise NotFound("placement-group", set_id, "InvalidDeploymentSetId.NotFound")
            set_id = str(named[0]["DeploymentSetId"])
        for _ in tries(IN_USE, self.poll, self.poll * 8):
            try:
                self._settle("placement-group", set_id, settle, lambda: self._call(
                    region, "DeleteDeploymentSet", DeploymentSetId=set_id))
                return
            except EcsError as exc:
                if exc.code != "DependencyViolation.NotEmpty":
                    raise
        raise EcsError("DeleteDeploymentSet", "DependencyViolation.NotEmpty",
                       f"{set_id} still holds instances after {IN_USE:.0f}s")
