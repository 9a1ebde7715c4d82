"""Every AWS call gpuprov makes that changes something, with what makes it safe to send twice; held at the client.

A request whose answer is lost (the connection dropped, a 500 after the work was done) may have done its work.
botocore's standard retry mode sends it again after a 5xx or a dropped connection (botocore/retries/standard.py,
`TransientRetryableChecker`), which is safe only for a call whose second send meets the first one's result. So each
mutating call is in `MUTATIONS` with one of these classes, and `guard`, registered on every boto3 client gpuprov
builds (the EC2 and IAM providers', the team bucket's) and `check` called by the Alibaba Cloud ECS client before
every call (cloud/providers/alibaba.py), refuses to send one that is not listed, or one of the two
classes that must never be sent again blindly on a client that retries. The refusal is a `GpuprovBug`: the code
that sends such a call has to say first how a lost answer is settled.

  TOKEN      a ClientToken: sent again with the same token, EC2 answers with the first call's result
             (EC2 API reference, "Ensure idempotency in Amazon EC2 API requests").
  NAME       a name unique in the account and region: a resend meets the first and is refused as a Duplicate,
             which the provider reads as its own first create and finds by that name.
  LOOK       neither: sent with retries off; after a lost answer the provider looks for the result (by tag or
             name) before it asks again (cloud/providers/aws_base.py `_create_once`).
  ONCE       cannot be undone (a Capacity Block is paid up front and "can't be modified or cancelled"): sent once
             with retries off; after a lost answer it is looked for and never asked for again.
  HARMLESS   a second send changes nothing: a delete answers NotFound (gone), a state change is already made.
  CONDITIONAL an S3 write with If-None-Match / If-Match: a resend after a lost answer meets its own first write and
             is answered 412, so the store reads the object back and compares it with what it sent (state/s3.py).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from gpuprov.errors import GpuprovBug

READS = ("Describe", "Get", "List", "Head")  # operation names that change nothing


class Repeat(str, Enum):
    TOKEN = "token"
    NAME = "name"
    LOOK = "look"
    ONCE = "once"
    HARMLESS = "harmless"
    CONDITIONAL = "conditional"


# (service, operation) -> its class; the only list of what gpuprov changes in AWS
MUTATIONS: dict[tuple[str, str], Repeat] = {
    ("ec2", "RunInstances"): Repeat.TOKEN,
    ("ec2", "CopyImage"): Repeat.TOKEN,
    ("ec2", "CreateImage"): Repeat.NAME,
    ("ec2", "CreateSecurityGroup"): Repeat.NAME,
    ("ec2", "CreatePlacementGroup"): Repeat.NAME,
    ("ec2", "AuthorizeSecurityGroupIngress"): Repeat.NAME,  # the same rule again: InvalidPermission.Duplicate
    ("ec2", "AuthorizeSecurityGroupEgress"): Repeat.NAME,
    ("ec2", "ImportKeyPair"): Repeat.LOOK,
    ("ec2", "AllocateAddress"): Repeat.LOOK,
    ("ec2", "PurchaseCapacityBlock"): Repeat.ONCE,
    ("ec2", "StartInstances"): Repeat.HARMLESS,
    ("ec2", "StopInstances"): Repeat.HARMLESS,
    ("ec2", "TerminateInstances"): Repeat.HARMLESS,
    ("ec2", "ModifyInstanceAttribute"): Repeat.HARMLESS,
    ("ec2", "AssociateAddress"): Repeat.HARMLESS,
    ("ec2", "ReleaseAddress"): Repeat.HARMLESS,
    ("ec2", "CancelSpotInstanceRequests"): Repeat.HARMLESS,
    ("ec2", "DeleteVolume"): Repeat.HARMLESS,
    ("ec2", "DeleteSnapshot"): Repeat.HARMLESS,
    ("ec2", "DeregisterImage"): Repeat.HARMLESS,
    ("ec2", "DeleteSecurityGroup"): Repeat.HARMLESS,
    ("ec2", "DeletePlacementGroup"): Repeat.HARMLESS,
    ("ec2", "DeleteKeyPair"): Repeat.HARMLESS,
    ("iam", "CreateRole"): Repeat.NAME,
    ("iam", "CreateInstanceProfile"): Repeat.NAME,
    ("iam", "AddRoleToInstanceProfile"): Repeat.NAME,  # a second add: LimitExceeded, read as already there
    ("iam", "PutRolePolicy"): Repeat.HARMLESS,  # the same policy under the same name
    ("iam", "RemoveRoleFromInstanceProfile"): Repeat.HARMLESS,
    ("iam", "DeleteRolePolicy"): Repeat.HARMLESS,
    ("iam", "DeleteRole"): Repeat.HARMLESS,
    ("iam", "DeleteInstanceProfile"): Repeat.HARMLESS,
    ("s3", "PutObject"): Repeat.CONDITIONAL,
    ("s3", "DeleteObject"): Repeat.HARMLESS,
    # Alibaba Cloud ECS (cloud/providers/alibaba.py): its SDK client is built with its own retries off, and gpuprov
    # resends only what this table allows (ECS API reference, "How to ensure idempotence": ClientToken)
    ("alibaba-ecs", "RunInstances"): Repeat.TOKEN,
    ("alibaba-ecs", "CreateSecurityGroup"): Repeat.TOKEN,
    ("alibaba-ecs", "AuthorizeSecurityGroup"): Repeat.TOKEN,
    ("alibaba-ecs", "CreateImage"): Repeat.TOKEN,
    ("alibaba-ecs", "ImportKeyPair"): Repeat.NAME,  # a second import of the name: KeyPair.AlreadyExist
    ("alibaba-ecs", "StartInstances"): Repeat.HARMLESS,
    ("alibaba-ecs", "StopInstances"): Repeat.HARMLESS,
    ("alibaba-ecs", "DeleteInstances"): Repeat.HARMLESS,
    ("alibaba-ecs", "ModifyInstanceSpec"): Repeat.HARMLESS,  # the same type again: the instance already has it
    ("alibaba-ecs", "DeleteKeyPairs"): Repeat.HARMLESS,
    ("alibaba-ecs", "DeleteSecurityGroup"): Repeat.HARMLESS,
    ("alibaba-ecs", "DeleteImage"): Repeat.HARMLESS,
    ("alibaba-ecs", "DeleteSnapshot"): Repeat.HARMLESS,
    ("alibaba-ecs", "CreateDeploymentSet"): Repeat.TOKEN,  # its ClientToken is the set's recorded name
    ("alibaba-ecs", "DeleteDeploymentSet"): Repeat.HARMLESS,
    ("alibaba-ecs", "CreateVpc"): Repeat.TOKEN,  # its ClientToken is the VPC's recorded name
    ("alibaba-ecs", "CreateVSwitch"): Repeat.TOKEN,  # its ClientToken is the vSwitch's recorded name
    ("alibaba-ecs", "DeleteVSwitch"): Repeat.HARMLESS,
    ("alibaba-ecs", "DeleteVpc"): Repeat.HARMLESS,
    # Alibaba Cloud RAM (cloud/providers/alibaba_ram.py): no ClientToken; the names are the owner's alone, so a resend
    # meets the first create as EntityAlreadyExists.*; after a lost answer the result is looked for first
    ("alibaba-ram", "CreatePolicy"): Repeat.NAME,
    ("alibaba-ram", "CreateRole"): Repeat.NAME,
    ("alibaba-ram", "AttachPolicyToRole"): Repeat.NAME,  # a second attach: EntityAlreadyExists.Role.Policy
    ("alibaba-ram", "DetachPolicyFromRole"): Repeat.HARMLESS,
    ("alibaba-ram", "DeleteRole"): Repeat.HARMLESS,
    ("alibaba-ram", "DeletePolicy"): Repeat.HARMLESS,
}

NEVER_RESENT = (Repeat.LOOK, Repeat.ONCE)


def changes(operation: str) -> bool:
    return not operation.startswith(READS)


def check(service: str, operation: str, retries: bool) -> None:
    """Refuse, as a bug, a mutating call the table lacks, or a LOOK/ONCE one on a client that would resend it."""
    if not changes(operation):
        return
    repeat = MUTATIONS.get((service, operation))
    if repeat is None:
        raise GpuprovBug(f"{service} {operation} changes something and is not in gpuprov.mutations.MUTATIONS: say "
                         "what makes it safe to send again before sending it")
    if retries and repeat in NEVER_RESENT:
        raise GpuprovBug(f"{service} {operation} ({repeat.value}) would be sent again by botocore's retries after a "
                         "lost answer: send it on a client with retries off")


def guard(client: Any, service: str, retries: bool) -> None:
    """Check every call `client` makes (botocore's `before-call` event) against the table."""
    def before_call(model: Any, **_: Any) -> None:
        check(service, str(model.name), retries)

    handler: Callable[..., None] = before_call
    # the per-client event system sees only this client's calls; registered first on the deepest wildcard, which
    # botocore calls before any other handler of the event, so nothing (a test's Stubber) answers a call unchecked
    client.meta.events.register_first("before-call.*.*", handler)
