"""`up --s3-access`: the node's own role and instance profile, scoped to exactly the prefixes asked for, read back
from IAM (moto's, behind the fault proxy), launched with, and removed by `down` and by a failed `up`'s take-back."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from urllib.parse import unquote

from tests import forkcli
from tests.aws.cli import gp, nothing_left, up_args

NO_WAIT = ("--no-bootstrap", "--no-wait")
ONE_TYPE = ("--gpu", "T4", "--max-hourly", "0.6")


def _iam_ours(aws) -> tuple[list[str], list[str]]:
    iam = aws.client("iam")
    roles = [r["RoleName"] for r in iam.list_roles()["Roles"] if r["RoleName"].startswith("gpuprov-")]
    profiles = [p["InstanceProfileName"] for p in iam.list_instance_profiles()["InstanceProfiles"]
                if p["InstanceProfileName"].startswith("gpuprov-")]
    return roles, profiles


def test_the_role_has_exactly_the_prefixes_the_node_launches_with_it_and_down_removes_it(aws, env):
    made = gp(env, *up_args("s3n", *ONE_TYPE, "--s3-access", "s3://my-data/datasets/imagenet:ro",
                            "--s3-access", "s3://my-ckpt/run1/", *NO_WAIT))
    assert made.returncode == 0, made.stdout + made.stderr
    iam = aws.client("iam")
    (role,), (profile,) = _iam_ours(aws)
    assert role == profile and role.startswith("gpuprov-s3n-")
    trust = iam.get_role(RoleName=role)["Role"]["AssumeRolePolicyDocument"]
    trust = json.loads(unquote(trust)) if isinstance(trust, str) else trust
    assert trust["Statement"] == [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                   "Action": "sts:AssumeRole"}]
    (name,) = iam.list_role_policies(RoleName=role)["PolicyNames"]
    doc = iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
    doc = json.loads(unquote(doc)) if isinstance(doc, str) else doc
    assert doc["Statement"] == [
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": "arn:aws:s3:::my-data",
         "Condition": {"StringLike": {"s3:prefix": ["datasets/imagenet", "datasets/imagenet/*"]}}},
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": "arn:aws:s3:::my-data/datasets/imagenet/*"},
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": "arn:aws:s3:::my-ckpt",
         "Condition": {"StringLike": {"s3:prefix": ["run1", "run1/*"]}}},
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
         "Resource": "arn:aws:s3:::my-ckpt/run1/*"}]
    assert [r["RoleName"] for r in iam.get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Roles"]] \
        == [role]
    (run,) = [e for e in aws.log("RunInstances") if e["status"] == 200]
    assert run["form"]["IamInstanceProfile.Name"] == profile
    # recorded before they were made: the node's rows name them
    calls = [e["action"] for e in aws.log() if e["action"] in ("CreateRole", "CreateInstanceProfile", "RunInstances")]
    assert calls.index("CreateRole") < calls.index("CreateInstanceProfile") < calls.index("RunInstances")
    down = gp(env, "down", "s3n", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert _iam_ours(aws) == ([], [])
    nothing_left(aws)


def test_a_bucket_encrypted_with_its_own_kms_key_gets_that_keys_use_in_the_role(aws, env):
    """A customer-managed KMS key as a bucket's default encryption: readers need kms:Decrypt, writers
    kms:GenerateDataKey too; without them the node failed after launch. A key that cannot be read is refused first."""
    kms, s3 = aws.client("kms"), aws.client("s3")
    by_id = kms.create_key(Description="datasets")["KeyMetadata"]
    by_arn = kms.create_key(Description="checkpoints")["KeyMetadata"]
    for bucket, key in (("enc-data", by_id["KeyId"]), ("enc-ckpt", by_arn["Arn"]), ("enc-gone", "alias/no-such-key")):
        s3.create_bucket(Bucket=bucket)
        s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={"Rules": [
            {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key}}]})
    made = gp(env, *up_args("kms", *ONE_TYPE, "--s3-access", "s3://enc-data/ds:ro", "--s3-access", "s3://enc-ckpt/run",
                            *NO_WAIT))
    assert made.returncode == 0, made.stdout + made.stderr
    (role,), _ = _iam_ours(aws)
    doc = aws.client("iam").get_role_policy(RoleName=role, PolicyName="gpuprov-s3-access")["PolicyDocument"]
    doc = json.loads(unquote(doc)) if isinstance(doc, str) else doc
    kms_rows = [(st["Action"], st["Resource"]) for st in doc["Statement"] if st["Action"][0].startswith("kms:")]
    assert kms_rows == [(["kms:Decrypt"], by_id["Arn"]), (["kms:Decrypt", "kms:GenerateDataKey"], by_arn["Arn"])]
    assert gp(env, "down", "kms", "--yes").returncode == 0
    refused = gp(env, *up_args("gone", *ONE_TYPE, "--s3-access", "s3://enc-gone/x", *NO_WAIT))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "error: --s3-access: s3://enc-gone encrypts its objects with the KMS key alias/no-such-key" in refused.stderr
    made_by = [e["action"] for e in aws.log() if e["status"] == 200]
    assert made_by.count("RunInstances") == 1 and made_by.count("CreateRole") == 1  # the first node's: nothing more
    assert made_by.count("CreateSecurityGroup") == 1
    assert _iam_ours(aws) == ([], [])
    nothing_left(aws)


def test_a_failed_up_takes_the_role_back_and_bad_access_is_refused_before_anything(aws, env):
    aws.faults({"action": "RunInstances", "code": "InsufficientInstanceCapacity", "message": "no capacity"})
    failed = gp(env, *up_args("s3f", *ONE_TYPE, "--s3-access", "s3://my-data/x", *NO_WAIT))
    assert failed.returncode == 1 and "no capacity anywhere" in failed.stderr
    assert _iam_ours(aws) == ([], [])
    nothing_left(aws)
    bad = gp(env, *up_args("s3b", *ONE_TYPE, "--s3-access", "s3://No_Such/x", *NO_WAIT))
    assert bad.returncode == 2 and "error: --s3-access: 's3://No_Such/x' is not s3://BUCKET/PREFIX[:ro]" in bad.stderr
    both = gp(env, *up_args("s3b", *ONE_TYPE, "--s3-access", "s3://my-data/x", "--instance-profile", "p", *NO_WAIT))
    assert both.returncode == 2 and "--s3-access or --instance-profile" in both.stderr
    # the two refused `up`s made nothing: the failed one's role and group are the only ones ever asked for
    assert [e["action"] for e in aws.log() if e["action"] in ("CreateRole", "CreateSecurityGroup")] == \
        ["CreateRole", "CreateSecurityGroup"]


def test_gc_takes_the_role_of_an_up_killed_mid_create_and_one_that_no_record_names(aws, env):
    iam = aws.client("iam")
    aws.faults({"action": "CreateRole", "hold": True, "times": 1})
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", *up_args("s3k", *ONE_TYPE, "--s3-access", "s3://d-1/x",
                                                                   *NO_WAIT)], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        aws.wait_held(timeout=120)
        proc.kill()  # between CreateRole and its answer: the role is made, only the intent row recorded names it
    finally:
        proc.wait()
    aws.release()
    for _ in range(200):  # the held request reaches IAM once released
        if _iam_ours(aws)[0]:
            break
        time.sleep(0.05)
    (role,), _ = _iam_ours(aws)
    tags = iam.list_role_tags(RoleName=role)["Tags"]
    # a role and profile tagged as this install's that no record names (a state folder lost, say)
    ghost = "gpuprov-ghost-0a1b2c3d"
    ghost_tags = [{"Key": "gpuprov:node", "Value": "ghost"}, *[t for t in tags if t["Key"] == "gpuprov:owner"]]
    iam.create_role(RoleName=ghost, AssumeRolePolicyDocument="{}", Tags=ghost_tags)
    iam.create_instance_profile(InstanceProfileName=ghost, Tags=ghost_tags)
    iam.add_role_to_instance_profile(InstanceProfileName=ghost, RoleName=ghost)
    listed = gp(env, "gc")
    assert listed.returncode == 0 and "s3k" in listed.stdout and listed.stdout.count(ghost) == 2, listed.stdout
    swept = gp(env, "gc", "--yes")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert _iam_ours(aws) == ([], [])
    nothing_left(aws)
