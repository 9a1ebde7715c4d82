"""S3 on the node without the user's keys: `up --s3-access s3://bucket/prefix[:ro]` (repeatable).

gpuprov makes the node a role and an instance profile of its own, scoped to exactly those prefixes, records both
before it creates them, launches with the profile, and removes both at `down` (and in the take-back of a failed
`up`). The policy follows AWS's pattern for one folder of a bucket (Amazon S3 user guide, "Example identity-based
policies", allowing access to a folder: s3:ListBucket on the bucket with an `s3:prefix` condition, object actions
on `arn:aws:s3:::BUCKET/PREFIX/*`; a role's policy names the prefix literally, `${aws:username}` "will not work when
using IAM roles"): read-only prefixes get s3:GetObject, the others also s3:PutObject,
s3:DeleteObject and s3:AbortMultipartUpload (a multipart upload's parts are deleted when it fails). A bucket whose
default encryption is a customer-managed KMS key (GetBucketEncryption, read at `up` before anything is made) gets that
key's kms:Decrypt, and kms:GenerateDataKey for a writer; a key that cannot be read is refused by name.

An `up` killed before CreateRole's answer was recorded leaves an intent row, found by its recorded name. `gc` also
lists `gpuprov-` roles and profiles by their tags (providers/aws_iam.tagged_iam, once, with the first region: IAM is
global; GetInstanceProfile and ListRoleTags, since IAM's listings carry no tags) under the same orphan rules as the
rest, profiles before roles.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuprov.cloud.providers.base import Provider
from gpuprov.cloud.providers.capabilities import ROLES, STORAGE, need
from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.state import Store

if TYPE_CHECKING:
    from gpuprov.say import Say

# S3's bucket names: 3-63 lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit
BUCKET = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
READ = ["s3:GetObject"]
WRITE = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
KMS_READ = ["kms:Decrypt"]
KMS_WRITE = ["kms:Decrypt", "kms:GenerateDataKey"]


@dataclass(frozen=True)
class BucketAccess:
    bucket: str
    prefix: str  # without slashes at either end; "" is the whole bucket
    read_only: bool


def parse(given: str, flag: str = "--s3-access") -> BucketAccess:
    text = given.strip()
    read_only = text.endswith(":ro")
    if read_only:
        text = text[:-3]
    m = re.fullmatch(rf"s3://({BUCKET})(/[^\s*?]*)?", text)
    if not m or ".." in m.group(1):
        raise UserInputError(flag, f"{given!r} is not s3://BUCKET/PREFIX[:ro]", "e.g. s3://my-data/datasets:ro")
    return BucketAccess(m.group(1), (m.group(2) or "").strip("/"), read_only)


def policy(accesses: Sequence[BucketAccess], keys: dict[str, str] | None = None) -> dict[str, Any]:
    """The role's one inline policy: exactly those prefixes, and the use of each bucket's own KMS key (`keys`:
    bucket -> key ARN) its objects are encrypted with: kms:Decrypt to read, kms:GenerateDataKey too to write
    (Amazon S3 user guide, "Using server-side encryption with AWS KMS keys": an upload needs kms:GenerateDataKey, a
    download kms:Decrypt, and a multipart upload both)."""
    statements: list[dict[str, Any]] = []
    for a in accesses:
        objects = f"arn:aws:s3:::{a.bucket}/{a.prefix + '/' if a.prefix else ''}*"
        listing: dict[str, Any] = {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": f"arn:aws:s3:::{a.bucket}"}
        if a.prefix:
            listing["Condition"] = {"StringLike": {"s3:prefix": [a.prefix, f"{a.prefix}/*"]}}
        statements += [listing, {"Effect": "Allow", "Action": READ if a.read_only else WRITE, "Resource": objects}]
        key = (keys or {}).get(a.bucket)
        if key:
            statements.append({"Effect": "Allow", "Action": KMS_READ if a.read_only else KMS_WRITE, "Resource": key})
    return {"Version": "2012-10-17", "Statement": statements}


def bucket_keys(accesses: Sequence[BucketAccess], region: str, provider: Provider, say: Say) -> dict[str, str]:
    """Each bucket's customer-managed KMS key, read before anything is made. A key that cannot be read is refused by
    name (the node would fail on its first object); a bucket whose encryption cannot be read is said, not refused
    (it may not exist yet, or the caller may lack s3:GetEncryptionConfiguration)."""
    keys: dict[str, str] = {}
    for bucket in dict.fromkeys(a.bucket for a in accesses):
        try:
            key = need(provider, STORAGE, what="--s3-access").bucket_key(region, bucket)
        except UserInputError:  # the key named, and unreadable
            raise
        except GpuprovError as exc:
            say(f"  could not read s3://{bucket}'s default encryption ({exc}): if it uses a customer-managed KMS key, "
                "the node also needs kms:Decrypt on it")
            continue
        if key:
            keys[bucket] = key
            say(f"  s3://{bucket} encrypts with the KMS key {key}: the role may use it")
    return keys


def ensure_role(node: str, region: str, given: Sequence[str], provider: Provider, store: Store, say: Say) -> str:
    """Role and instance profile for the node, each recorded before it is created; returns the profile's name."""
    accesses = [parse(g) for g in given]
    name = f"gpuprov-{node}-{uuid.uuid4().hex[:8]}"  # IAM names: up to 64 of [\\w+=,.@-]; node names are 39 at most
    say(f"role and instance profile {name}: " + ", ".join(
        f"s3://{a.bucket}/{a.prefix}{' (read-only)' if a.read_only else ''}" for a in accesses))
    keys = bucket_keys(accesses, region, provider, say)
    rid = store.intend(node, "iam-role", region, name)
    roles = need(provider, ROLES, what="--s3-access")
    roles.create_node_role(region, node, name, policy(accesses, keys))
    store.created(rid, name)
    pid = store.intend(node, "instance-profile", region, name)
    roles.create_node_profile(region, node, name, name)
    store.created(pid, name)
    return name


def download_sizes(plan: Any, provider: Provider) -> list[dict[str, Any]]:
    """A playbook's `data:` downloads with what S3 holds under each prefix now (`plan --live`): objects and bytes,
    from ListObjectsV2 here on the controller (the node is not there yet)."""
    from gpuprov.plan.data import split_s3

    out = []
    for entry in plan.playbook.data:
        row = entry.summary()
        if entry.download:
            bucket, prefix = split_s3(entry.source)
            row["objects"], row["bytes"] = need(provider, STORAGE, what="data").prefix_size(plan.request.region, bucket, prefix)
        out.append(row)
    return out


def size_text(n: int) -> str:
    """1536 -> '1.5 KiB': binary units, as `aws s3 ls --human-readable` prints them."""
    size = float(n)
    for unit in ("Bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} Bytes" if unit == "Bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} Bytes"
