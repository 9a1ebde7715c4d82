"""A node's own role and instance profile, scoped to S3 prefixes (`up --s3-access`): the IAM calls; and the size of an
S3 prefix a playbook's `data:` entry fetches (`plan --live`: ListObjectsV2, read from here, never from the node).

Order from the EC2 user guide ("IAM roles for Amazon EC2", create a role and instance profile with the AWS CLI):
CreateRole with EC2's trust policy -> PutRolePolicy (inline) -> CreateInstanceProfile -> AddRoleToInstanceProfile.
Removal in the order IAM requires (botocore's IAM model, DeleteRole: "remove … Inline policies (DeleteRolePolicy) …
Instance profile (RemoveRoleFromInstanceProfile)"; DeleteInstanceProfile: "must not have an associated role"):
RemoveRoleFromInstanceProfile -> DeleteInstanceProfile, then DeleteRolePolicy -> DeleteRole, after the instance.
"""

from __future__ import annotations

import fnmatch
import functools
import json
from typing import Any

from gpuprov.cloud.providers.aws_base import AwsBase, AwsError
from gpuprov.cloud.providers.base import TAG_NODE, TAG_OWNER, TAG_TEAM, CloudResource, NotFound
from gpuprov.errors import UserInputError

TRUST = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                                  "Action": "sts:AssumeRole"}]}
POLICY_NAME = "gpuprov-s3-access"


class AwsIam(AwsBase):
    def create_node_role(self, region: str, node: str, name: str, policy: dict[str, Any]) -> None:
        """The role (EC2 may assume it) with its one inline policy; an EntityAlreadyExists is this name's own
        earlier create whose answer was lost (the name is the node's, made once)."""
        iam = self._client("iam", region)
        tags = [t for t in self._tags(node) if t["Key"] != "Name"]
        try:
            self._call("iam:CreateRole", lambda: iam.create_role(
                RoleName=name, AssumeRolePolicyDocument=json.dumps(TRUST), Tags=tags,
                Description=f"gpuprov node {node}: S3 access it was launched with"))
        except AwsError as exc:
            if exc.code != "EntityAlreadyExists":
                raise
        self._call("iam:PutRolePolicy", lambda: iam.put_role_policy(
            RoleName=name, PolicyName=POLICY_NAME, PolicyDocument=json.dumps(policy)))

    def create_node_profile(self, region: str, node: str, name: str, role: str) -> None:
        iam = self._client("iam", region)
        tags = [t for t in self._tags(node) if t["Key"] != "Name"]
        try:
            self._call("iam:CreateInstanceProfile", lambda: iam.create_instance_profile(
                InstanceProfileName=name, Tags=tags))
        except AwsError as exc:
            if exc.code != "EntityAlreadyExists":
                raise
        try:
            self._call("iam:AddRoleToInstanceProfile", lambda: iam.add_role_to_instance_profile(
                InstanceProfileName=name, RoleName=role))
        except AwsError as exc:
            if exc.code != "LimitExceeded":  # "can contain only one role": it is in already
                raise

    def delete_node_profile(self, region: str, name: str) -> None:
        iam = self._client("iam", region)
        try:
            roles = self._call("iam:GetInstanceProfile", lambda: iam.get_instance_profile(
                InstanceProfileName=name))["InstanceProfile"]["Roles"]
        except AwsError as exc:
            if exc.code == "NoSuchEntity":
                raise NotFound("instance-profile", name, exc.code) from None
            raise
        for role in roles:
            self._call("iam:RemoveRoleFromInstanceProfile", functools.partial(
                iam.remove_role_from_instance_profile, InstanceProfileName=name, RoleName=role["RoleName"]))
        self._call("iam:DeleteInstanceProfile", lambda: iam.delete_instance_profile(InstanceProfileName=name))

    def delete_node_role(self, region: str, name: str) -> None:
        iam = self._client("iam", region)
        try:
            policies = self._call("iam:ListRolePolicies", lambda: iam.list_role_policies(RoleName=name))["PolicyNames"]
        except AwsError as exc:
            if exc.code == "NoSuchEntity":
                raise NotFound("iam-role", name, exc.code) from None
            raise
        for policy in policies:
            self._call("iam:DeleteRolePolicy", functools.partial(iam.delete_role_policy, RoleName=name, PolicyName=policy))
        self._call("iam:DeleteRole", lambda: iam.delete_role(RoleName=name))

    def tagged_iam(self, region: str, everyone: bool = False) -> list[CloudResource]:
        """gpuprov's instance profiles and roles (named `gpuprov-NODE-…`), by their tags, for `gc`: IAM is global, so
        they are listed once, under `region`. IAM's listings carry no tags (IAM API reference, ListInstanceProfiles:
        "does not return tags … see GetInstanceProfile"; ListRoles likewise), so each `gpuprov-` name
        is read on its own: GetInstanceProfile, ListRoleTags."""
        iam = self._client("iam", region)
        mine = self.family if everyone else self.owners  # EC2 filter patterns (`user@host/*`): fnmatch here
        found: list[CloudResource] = []
        for kind, listing, key, field in (("instance-profile", "ListInstanceProfiles", "InstanceProfiles",
                                           "InstanceProfileName"), ("iam-role", "ListRoles", "Roles", "RoleName")):
            for item in self._pages(iam, listing, key):
                name = item[field]
                if not name.startswith("gpuprov-"):
                    continue
                try:
                    raw = self._call("iam:GetInstanceProfile", functools.partial(
                        iam.get_instance_profile, InstanceProfileName=name))["InstanceProfile"] \
                        if kind == "instance-profile" else \
                        self._call("iam:ListRoleTags", functools.partial(iam.list_role_tags, RoleName=name))
                except AwsError as exc:
                    if exc.code == "NoSuchEntity":  # gone since the listing (a `down` meanwhile)
                        continue
                    raise
                tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
                owner, team = tags.get(TAG_OWNER), tags.get(TAG_TEAM)
                ours = team == self.team.get(TAG_TEAM) if self.team else \
                    owner is not None and any(fnmatch.fnmatchcase(owner, m) for m in mine)
                if ours:
                    found.append(CloudResource(kind, name, region, tags.get(TAG_NODE), "", owner, team))
        return found

    def prefix_size(self, region: str, bucket: str, prefix: str) -> tuple[int, int]:
        """(objects, bytes) under s3://BUCKET/PREFIX/, every page of ListObjectsV2 (1,000 keys a page at most)."""
        s3 = self._client("s3", region)
        key_prefix = f"{prefix}/" if prefix else ""
        # a page without keys has no Contents at all (S3 API reference, ListObjectsV2)
        objects = self._call("s3:ListObjectsV2", lambda: [
            o for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key_prefix)
            for o in page.get("Contents", [])])
        return len(objects), sum(int(o.get("Size", 0)) for o in objects)

    def bucket_key(self, region: str, bucket: str) -> str | None:
        """GetBucketEncryption's default rule (S3 API reference): SSE-KMS (aws:kms, aws:kms:dsse) with a
        KMSMasterKeyID names the key; an alias or a bare key id is turned into the key's ARN with KMS DescribeKey
        (a role's policy names keys by ARN), and an AWS managed key (KeyManager AWS, alias/aws/s3) needs no grant."""
        s3 = self._client("s3", region)
        try:
            rules = self._call("s3:GetBucketEncryption", lambda: s3.get_bucket_encryption(Bucket=bucket))[
                "ServerSideEncryptionConfiguration"]["Rules"]
        except AwsError as exc:
            if exc.code == "ServerSideEncryptionConfigurationNotFoundError":
                return None
            raise
        defaults = [rule.get("ApplyServerSideEncryptionByDefault") or {} for rule in rules]
        keys = [str(d["KMSMasterKeyID"]) for d in defaults
                if str(d.get("SSEAlgorithm", "")).startswith("aws:kms") and d.get("KMSMasterKeyID")]
        if not keys or keys[0] == "alias/aws/s3":
            return None
        key = keys[0]
        if ":key/" in key:
            return key
        kms = self._client("kms", region)
        try:
            meta = self._call("kms:DescribeKey", lambda: kms.describe_key(KeyId=key))["KeyMetadata"]
        except AwsError as exc:  # the node could not use the key either: refused before anything is made
            raise UserInputError("--s3-access", f"s3://{bucket} encrypts its objects with the KMS key {key}, which "
                                 f"could not be read ({exc.code}: {exc.message})",
                                 "the node needs kms:Decrypt (and kms:GenerateDataKey to write) on it: allow "
                                 "kms:DescribeKey on it to the caller, or give the bucket a key it can use") from None
        return None if meta.get("KeyManager") == "AWS" else str(meta["Arn"])
