"""Baked images and Deep Learning AMIs (issue 12) through the real CLI, against moto behind the fault proxy
(realistic: a new image id answers NotFound twice and is `pending` twice before `available`; a second image
of the same name is InvalidAMIName.Duplicate) and real sshd test hosts standing in for the launched nodes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests import forkcli
from tests.aws.cli import copy_disk, gp, launch_site, nothing_left, up_args
from tests.aws.fixture import os_ami, ubuntu_ami
from tests.node_guards import on_node

SYSROOT = "/var/lib/gpuprov-shim/root"
STACK_ARGS = ("--gpu", "T4", "--os", "ubuntu-22.04", "--python", "3.11")
INSTALL_STEPS = ("kernel-headers", "nouveau-off", "nvidia-driver", "persistence", "python-env", "pytorch")
USER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHVzZXJzLW93bi1rZXktbm90LWdwdXByb3ZzMDAwMDAwMDA me@laptop"


def owner() -> str:
    from gpuprov.cloud.tags import owner as this_install

    return this_install()  # GPUPROV_HOME is the test's gpuprov home (the gp_home fixture)


def plan_stack(region: str = "us-east-1", os_name: str = "ubuntu-22.04") -> str:
    from gpuprov.cloud.images import plan_stack
    from gpuprov.plan.plan import NodeRequest, make_plan
    from gpuprov.plan.stack import StackPins

    return plan_stack(make_plan(NodeRequest(gpu="T4", os=os_name, region=region, pins=StackPins(python="3.11"))))


def images_in(aws, region: str = "us-east-1") -> list[dict]:
    return aws.ec2(region).describe_images(Owners=["self"])["Images"]


def snapshots_in(aws, region: str = "us-east-1") -> list[str]:
    return [s["SnapshotId"] for s in aws.ec2(region).describe_snapshots(OwnerIds=["self"])["Snapshots"]]


def tags(raw: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags") or []}


def seed_node_identity(pool, i: int, public_key: str) -> None:
    """What an EC2 instance has that an image must not carry: host keys, the launch key in authorized_keys
    (next to a key of the user's own), cloud-init's instance data and log (under the hosts' sysroot)."""
    pool.exec_in(i, f"""set -e; r={SYSROOT}; mkdir -p $r/etc/ssh $r/root/.ssh $r/var/lib/cloud/instance $r/var/log
        for t in rsa ecdsa ed25519; do
          echo key > $r/etc/ssh/ssh_host_${{t}}_key; echo pub > $r/etc/ssh/ssh_host_${{t}}_key.pub
        done
        printf '%s\\n%s\\n' '{public_key}' '{USER_KEY}' > $r/root/.ssh/authorized_keys; chmod 600 $r/root/.ssh/authorized_keys
        echo i-0 > $r/var/lib/cloud/instance/instance-id; echo boot > $r/var/log/cloud-init.log""", check=True)


def test_bake_cleans_the_node_tags_the_image_and_the_next_up_skips_every_install_step(aws, env, aws_hosts, gp_home):
    pool = aws_hosts
    subnet = launch_site(aws, pool, gp_home)
    public_key = (gp_home / "keys" / "us-east-1" / "id_ed25519.pub").read_text().strip()
    seed_node_identity(pool, 0, public_key)
    where = ("--subnet", subnet, "--connect", "private", "--ssh-user", "root")
    first = gp(env, *up_args("base", *STACK_ARGS, *where, "--ttl", "8h"))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "image: Canonical's Ubuntu" in first.stdout and "no baked image of stack" in first.stdout

    # a bake killed once CreateImage was sent (its answer held, then lost): the clean-up has run by then
    aws.faults({"action": "CreateImage", "hold": True, "times": 1})
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", "image", "bake", "base", "--name", "t4-stack", "--yes"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        try:
            aws.wait_held(1, timeout=120)
        except TimeoutError:
            proc.kill()
            raise AssertionError(proc.communicate()) from None
        host = pool.exec_in(0, f"ls {SYSROOT}/etc/ssh; cat {SYSROOT}/root/.ssh/authorized_keys; "
                               f"ls /var/lib/gpuprov/markers; ls -A {SYSROOT}/var/lib/cloud; "
                               f"test -e {SYSROOT}/var/lib/gpuprov/ttl-deadline && echo DEADLINE; "
                               "grep cloud-init /var/lib/gpuprov-shim/calls.log", check=True).stdout
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(10)
        aws.release()
    assert "ssh_host_" not in host and USER_KEY in host and public_key not in host
    for step in INSTALL_STEPS:
        assert f"{step}.sha256" in host  # the markers stay: an up from the image skips those steps
    assert "ttl.sha256" not in host and "DEADLINE" not in host and "cloud-init clean --logs" in host
    (created,) = aws.log("CreateImage")
    form = created["form"]
    assert form["Name"] == "t4-stack" and form["NoReboot"] == "false"
    assert form["InstanceId"] == next(i["InstanceId"] for r in aws.ec2().describe_instances()["Reservations"]
                                      for i in r["Instances"])
    (image,) = images_in(aws)
    assert tags(image)["gpuprov:stack"] == plan_stack() and tags(image)["gpuprov:os"] == "ubuntu-22.04"
    assert tags(image)["gpuprov:owner"] == owner() and tags(image)["gpuprov:source-node"] == "base"
    (snap,) = aws.ec2().describe_snapshots(SnapshotIds=[image["BlockDeviceMappings"][0]["Ebs"]["SnapshotId"]])[
        "Snapshots"]
    assert tags(snap)["gpuprov:image"] == "t4-stack" and tags(snap)["gpuprov:owner"] == owner()
    # the node says a bake is in flight, the image EC2 has, and what settles it; gc records the image, never sweeps it
    row = _refreshed(env, "base")
    assert row["state"] == "baking" and image["ImageId"] in row["state_reason"], row
    assert "`gpuprov start base` settles it" in row["state_reason"], row
    swept = gp(env, "gc", "--yes")
    assert swept.returncode == 0 and "base: image bake interrupted at CreateImage" in swept.stdout + swept.stderr
    assert [i["ImageId"] for i in images_in(aws)] == [image["ImageId"]]
    _all_recorded(aws, env)
    again = gp(env, "image", "bake", "base", "--name", "t4-other", "--yes")
    assert again.returncode == 2 and "`gpuprov start base` first" in again.stderr, again.stderr
    settled = gp(env, "start", "base")  # waits for the image, then a stop and a start: a first boot, guards back
    assert settled.returncode == 0, settled.stdout + settled.stderr
    assert f"its interrupted bake made {image['ImageId']}" in settled.stdout
    _reachable_with_its_guards(env, pool)
    (listed,) = json.loads(gp(env, "image", "list", "--json").stdout)
    assert (listed["id"], listed["state"], listed["recorded"]) == (image["ImageId"], "available", True)
    assert gp(env, "image", "rm", "t4-stack", "--yes").returncode == 0
    assert images_in(aws) == [] and snap["SnapshotId"] not in snapshots_in(aws)

    # killed right after the clean-up, before EC2 saw CreateImage (then refused): stop undoes the bake, start ends it
    aws.faults({"action": "CreateImage", "pause": True, "times": 1})
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", "image", "bake", "base", "--name", "t4-stack", "--yes"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        aws.wait_held(1, timeout=120)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(10)
    sent = len(aws.log("CreateImage"))
    aws.faults({"action": "CreateImage", "code": "InvalidInstanceID.NotFound", "message": "gone", "times": 1})
    aws.release()
    while len(aws.log("CreateImage")) == sent:  # the paused request, refused
        time.sleep(0.05)
    row = _refreshed(env, "base")
    assert row["state"] == "baking" and "image t4-stack not found" in row["state_reason"], row
    stopped = gp(env, "stop", "base")
    assert stopped.returncode == 0 and "base: stopped (its interrupted bake settled)" in stopped.stdout, stopped.stdout
    assert images_in(aws) == [] and json.loads(gp(env, "image", "list", "--json").stdout) == []
    assert gp(env, "start", "base").returncode == 0
    _reachable_with_its_guards(env, pool)

    baked = gp(env, "image", "bake", "base", "--name", "t4-stack", "--yes")
    assert baked.returncode == 0, baked.stdout + baked.stderr
    assert "pending" in baked.stdout and "t4-stack" in baked.stdout and "gpuprov down base" in baked.stdout
    (row,) = json.loads(gp(env, "image", "list", "--json").stdout)
    assert (row["name"], row["stack"], row["state"], row["recorded"]) == ("t4-stack", plan_stack(), "available", True)
    assert row["snapshot_ids"] and row["id"].startswith("ami-")
    table = gp(env, "image", "list")
    assert "t4-stack" in table.stdout and plan_stack()[:12] in table.stdout

    assert gp(env, "down", "base", "--yes").returncode == 0
    assert [i["ImageId"] for i in images_in(aws)] == [row["id"]]  # images outlive nodes
    nothing_left(aws)

    copy_disk(pool, 0, 1)  # the next instance in the subnet lands on pool[1], with the image's disk
    live = json.loads(gp(env, "plan", *STACK_ARGS, "--live", "--json").stdout)["image"]
    assert (live["source"], live["id"], live["steps_to_run"]) == ("baked", row["id"], [])
    second = gp(env, *up_args("again", *STACK_ARGS, *where))
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"image: baked image t4-stack ({row['id']}" in second.stdout
    assert aws.log("RunInstances")[-1]["form"]["ImageId"] == row["id"]
    for step in INSTALL_STEPS:
        assert f"  {step}: unchanged" in second.stdout
    timeline = json.loads(gp(env, "status", "again", "--timeline", "--json").stdout)  # where the time went
    assert timeline["image"] == f"baked t4-stack {row['id']}"
    steps = {s["name"]: s["outcome"] for p in timeline["phases"] for s in p["steps"]}
    assert {step: steps[step] for step in INSTALL_STEPS} == dict.fromkeys(INSTALL_STEPS, "skipped")
    calls = pool.exec_in(1, "cat /var/lib/gpuprov-shim/calls.log", check=True).stdout
    assert "apt-get install" not in calls and "uv pip install" not in calls
    assert gp(env, "down", "again", "--yes").returncode == 0
    removed = gp(env, "image", "rm", "t4-stack", "--yes")
    assert removed.returncode == 0, removed.stderr
    assert images_in(aws) == [] and row["snapshot_ids"][0] not in snapshots_in(aws)
    nothing_left(aws)


def _image(aws, region: str, name: str, stack: str, os_name: str = "ubuntu-24.04") -> str:
    """An image of this owner made straight in moto (not through gpuprov: another machine's bake, say)."""
    ec2 = aws.ec2(region)
    (inst,) = ec2.run_instances(ImageId=ubuntu_ami("24.04"), MinCount=1, MaxCount=1, InstanceType="t3.micro")["Instances"]
    image = ec2.create_image(InstanceId=inst["InstanceId"], Name=name, TagSpecifications=[{"ResourceType": "image", "Tags": [
        {"Key": "gpuprov:node", "Value": "(image)"}, {"Key": "gpuprov:owner", "Value": owner()},
        {"Key": "gpuprov:stack", "Value": stack}, {"Key": "gpuprov:os", "Value": os_name}]}])["ImageId"]
    ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
    return image


def _stack_24(region: str = "us-east-1") -> str:
    from gpuprov.cloud.images import plan_stack
    from gpuprov.plan.plan import NodeRequest, make_plan

    return plan_stack(make_plan(NodeRequest(gpu="T4", region=region)))


@pytest.mark.instant_aws
def test_up_picks_the_baked_image_of_its_stack_in_its_region_only(aws, env):
    stack = _stack_24()
    assert stack == _stack_24("us-west-2")  # the scripts do not name the region: only where the image is differs
    _image(aws, "us-west-2", "elsewhere", stack)
    _image(aws, "us-east-1", "other-stack", "0" * 64)
    _image(aws, "us-east-1", "other-os", stack, os_name="ubuntu-22.04")
    plain = gp(env, *up_args("p1", "--gpu", "T4", "--no-bootstrap", "--no-wait"))
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert aws.log("RunInstances")[-1]["form"]["ImageId"] == ubuntu_ami("24.04")
    mine = _image(aws, "us-east-1", "mine", stack)
    live = json.loads(gp(env, "plan", "--gpu", "T4", "--live", "--json").stdout)["image"]
    assert (live["id"], live["steps_to_run"]) == (mine, [])
    human = gp(env, "plan", "--gpu", "T4", "--live")
    assert "baked image mine" in human.stdout and "steps that will run: none" in human.stdout
    picked = gp(env, *up_args("p2", "--gpu", "T4", "--no-bootstrap", "--no-wait"))
    assert picked.returncode == 0 and aws.log("RunInstances")[-1]["form"]["ImageId"] == mine
    fresh = gp(env, *up_args("p3", "--gpu", "T4", "--no-bootstrap", "--no-wait", "--image", "fresh"))
    assert fresh.returncode == 0 and aws.log("RunInstances")[-1]["form"]["ImageId"] == ubuntu_ami("24.04")
    named = gp(env, *up_args("p4", "--gpu", "T4", "--no-bootstrap", "--no-wait", "--image", "other-stack"))
    assert named.returncode == 0 and "steps whose scripts differ run again" in named.stdout
    assert gp(env, "down", "--all", "--yes").returncode == 0
    assert len(images_in(aws)) + len(images_in(aws, "us-west-2")) == 4  # down leaves images
    nothing_left(aws)


def test_up_os_finds_each_distributions_own_image_and_logs_in_as_its_user(aws, env):
    """`up --os` beyond Ubuntu (data/os.yaml `aws`): Debian's public SSM parameter (Amazon Linux's is looked up the same
    way), the newest x86_64 image of Rocky's and Red Hat's accounts by name (not an older release, not a newer aarch64
    one), each OS's login user."""
    seen = {}
    for os_name in ("debian-12", "rocky-9"):
        out = gp(env, "plan", "--gpu", "T4", "--os", os_name, "--live", "--json")
        assert out.returncode == 0, out.stdout + out.stderr
        image = json.loads(out.stdout)["image"]
        seen[os_name] = (image["source"], image["id"], image["user"])
    assert seen == {"debian-12": ("public", os_ami("debian-12"), "admin"), "rocky-9": ("public", os_ami("rocky-9"), "rocky")}
    up = gp(env, *up_args("el", "--gpu", "T4", "--os", "rhel-9", "--no-bootstrap", "--no-wait"))
    assert up.returncode == 0, up.stdout + up.stderr
    assert aws.log("RunInstances")[-1]["form"]["ImageId"] == os_ami("rhel-9")
    assert "login user ec2-user" in up.stdout
    assert gp(env, "down", "el", "--yes").returncode == 0
    nothing_left(aws)


def test_gc_and_image_rm_deregister_images_and_delete_their_snapshots(aws, env):
    stray = _image(aws, "us-east-1", "lost-record", "1" * 64)
    kept = _image(aws, "us-east-1", "named", "2" * 64)
    ec2 = aws.ec2()
    vol = ec2.create_volume(Size=8, AvailabilityZone="us-east-1a")["VolumeId"]
    orphan = ec2.create_snapshot(VolumeId=vol, TagSpecifications=[{"ResourceType": "snapshot", "Tags": [
        {"Key": "gpuprov:node", "Value": "(image)"}, {"Key": "gpuprov:owner", "Value": owner()},
        {"Key": "gpuprov:image", "Value": "deregistered-long-ago"}]}])["SnapshotId"]
    ec2.delete_volume(VolumeId=vol)
    snaps = {i["ImageId"]: i["BlockDeviceMappings"][0]["Ebs"]["SnapshotId"] for i in images_in(aws)}
    found = json.loads(gp(env, "gc", "--json").stdout)["found"]
    assert {(r["kind"], r["id"]) for r in found} == {("image", stray), ("image", kept), ("snapshot", orphan)}
    removed = gp(env, "image", "rm", "named", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert f"snapshot {snaps[kept]}" in removed.stdout
    assert gp(env, "gc", "--yes").returncode == 0
    assert images_in(aws) == [] and not set(snapshots_in(aws)) & {orphan, *snaps.values()}
    assert gp(env, "gc").stdout.startswith("nothing to collect")
    missing = gp(env, "image", "rm", "named", "--yes")
    assert missing.returncode == 2 and "no image 'named'" in missing.stderr


DLAMI_PREFIX = "/test/deeplearning"


def _seed_dlami(aws, os_name: str = "ubuntu-22.04") -> str:
    ami = ubuntu_ami(os_name.removeprefix("ubuntu-"))
    aws.client("ssm").put_parameter(
        Name=f"{DLAMI_PREFIX}/ami/x86_64/base-oss-nvidia-driver-gpu-{os_name}/latest/ami-id", Value=ami,
        Type="String", DataType="aws:ec2:image")
    return ami


def test_dlami_with_its_driver_preinstalled_the_driver_step_is_unchanged(aws, env, aws_hosts, gp_home):
    pool = aws_hosts
    subnet = launch_site(aws, pool, gp_home)
    ami = _seed_dlami(aws)
    # the DLAMI's driver (R595, its release notes) is loaded; dpkg lists no NVIDIA driver or pinning package
    pool.exec_in(0, "echo 'export GPUPROV_SHIM_DRIVER_PREINSTALLED=595.91.07' >> /var/lib/gpuprov-shim/env", check=True)
    env = {**env, "GPUPROV_TEST_DLAMI_SSM_PREFIX": DLAMI_PREFIX}
    result = gp(env, *up_args("dl", *STACK_ARGS, "--subnet", subnet, "--connect", "private", "--ssh-user", "root",
                              "--image", "dlami"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Deep Learning Base OSS Nvidia Driver GPU AMI" in result.stdout and "R595" in result.stdout
    assert aws.log("RunInstances")[-1]["form"]["ImageId"] == ami
    assert "  nvidia-driver: unchanged" in result.stdout
    calls = pool.exec_in(0, "cat /var/lib/gpuprov-shim/calls.log", check=True).stdout
    assert "nvidia-open" not in calls and "cuda-keyring" not in calls
    assert gp(env, "down", "dl", "--yes").returncode == 0
    nothing_left(aws)


def test_dlami_of_another_driver_branch_is_refused_before_launch(aws, env):
    _seed_dlami(aws, "ubuntu-24.04")
    env = {**env, "GPUPROV_TEST_DLAMI_SSM_PREFIX": DLAMI_PREFIX}
    result = gp(env, *up_args("dl", "--gpu", "T4", "--driver", "580", "--image", "dlami", "--no-bootstrap", "--no-wait"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "error: --image:" in result.stderr and "R595" in result.stderr and "--driver 595" in result.stderr
    assert not aws.log("RunInstances") and not aws.log("CreateSecurityGroup")
    nothing_left(aws)


def test_bad_image_names_are_refused_before_any_aws_call(aws, env):
    result = gp(env, *up_args("x", "--gpu", "T4", "--image", "no|pipes"))
    assert result.returncode == 2 and result.stderr.startswith("error: --image: 'no|pipes' is no image")
    bake = gp(env, "image", "bake", "nosuch", "--name", "a|b", "--yes")
    assert bake.returncode == 2 and bake.stderr.startswith("error: --name")
    assert aws.log() == []
    nothing_left(aws)


def _refreshed(env, name: str) -> dict:
    (row,) = [n for n in json.loads(gp(env, "status", "--refresh", "--json").stdout) if n["name"] == name]
    return row


def _all_recorded(aws, env) -> None:
    """Every image of ours EC2 has (and so its snapshots, which name it) is one a record names."""
    recorded = {r["id"] for r in json.loads(gp(env, "image", "list", "--json").stdout) if r["recorded"]}
    assert {i["ImageId"] for i in images_in(aws)} <= recorded


def _reachable_with_its_guards(env, pool) -> None:
    """A settled bake: the node ready, nothing in flight, reached over SSH, and on it exactly the guards its record
    shows (its 8h TTL)."""
    (row,) = json.loads(gp(env, "status", "base", "--json").stdout)
    assert (row["state"], row["journal"], row["ttl_seconds"]) == ("ready", None, 8 * 3600), row
    assert on_node(pool, 0).steps == {"ttl"}
    assert gp(env, "exec", "base", "--", "true").returncode == 0


def _baked_node(aws, env, pool, gp_home, *extra: str) -> tuple[tuple[str, ...], str]:
    """A ready node `base` on pool[0] with its host identity and an 8h TTL (and `extra`): what a bake cleans."""
    subnet = launch_site(aws, pool, gp_home)
    public_key = (gp_home / "keys" / "us-east-1" / "id_ed25519.pub").read_text().strip()
    seed_node_identity(pool, 0, public_key)
    where = ("--subnet", subnet, "--connect", "private", "--ssh-user", "root")
    first = gp(env, *up_args("base", *STACK_ARGS, *where, "--ttl", "8h", *extra))
    assert first.returncode == 0, first.stdout + first.stderr
    return where, public_key


def _identity(pool) -> str:
    return pool.exec_in(0, f"ls {SYSROOT}/etc/ssh; cat {SYSROOT}/root/.ssh/authorized_keys; "
                           f"ls /var/lib/gpuprov/markers; cat {SYSROOT}/var/lib/gpuprov/ttl-deadline; "
                           f"ls {SYSROOT}/etc/systemd/system; ls -A {SYSROOT}/var/lib/cloud; "
                           f"ls -d {SYSROOT}/run/gpuprov-bake 2>&1", check=False).stdout


def test_a_refused_create_image_puts_the_node_back_as_it_was(aws, env, aws_hosts, gp_home):
    pool = aws_hosts
    _baked_node(aws, env, pool, gp_home)
    before = _identity(pool)
    assert "ssh_host_ed25519_key" in before and "gpuprov-ttl.timer" in before and "ttl.sha256" in before
    aws.faults({"action": "CreateImage", "code": "UnauthorizedOperation", "message": "not allowed to CreateImage",
                "times": 1})
    baked = gp(env, "image", "bake", "base", "--name", "t4-stack", "--yes")
    assert baked.returncode == 1, baked.stdout + baked.stderr
    assert "UnauthorizedOperation: not allowed to CreateImage" in baked.stderr
    assert "base: AWS refused the image; the node is as it was" in baked.stdout
    after = _identity(pool)
    assert after.replace("No such file or directory", "") == before.replace("No such file or directory", "")
    assert "gpuprov-bake" in after and "cannot access" in after  # the backup is gone again
    calls = pool.exec_in(0, "cat /var/lib/gpuprov-shim/calls.log", check=True).stdout
    assert "systemctl enable --now gpuprov-ttl.timer" in calls  # its TTL ticks again
    assert json.loads(gp(env, "status", "base", "--json").stdout)[0]["state"] == "ready"
    assert gp(env, "exec", "base", "--", "true").returncode == 0  # still reachable with its pinned key
    assert images_in(aws) == [] and json.loads(gp(env, "image", "list", "--json").stdout) == []
    assert gp(env, "down", "base", "--yes").returncode == 0
    nothing_left(aws)


def test_a_bake_puts_the_guards_back_as_the_record_shows_them(aws, env, aws_hosts, gp_home):
    pool = aws_hosts
    _baked_node(aws, env, pool, gp_home, "--autostop", "2h")
    deadline_file = f"{SYSROOT}/var/lib/gpuprov/ttl-deadline"
    before = pool.exec_in(0, f"cat {deadline_file}", check=True).stdout.split()
    baked = gp(env, "image", "bake", "base", "--name", "t4-stack", "--yes")
    assert baked.returncode == 0, baked.stdout + baked.stderr
    assert "base: its guards are back (autostop, ttl)" in baked.stdout
    units = pool.exec_in(0, f"ls {SYSROOT}/etc/systemd/system", check=True).stdout.split()
    assert {"gpuprov-ttl.timer", "gpuprov-autostop.timer"} <= set(units)
    # the recorded deadline (the node's own clock may have set it a second apart), not a new 8h one
    after = pool.exec_in(0, f"cat {deadline_file}", check=True).stdout.split()
    assert after[0] == before[0] and abs(int(after[1]) - int(before[1])) <= 5
    assert "7200" in pool.exec_in(0, f"cat {SYSROOT}/etc/gpuprov/autostop.conf", check=True).stdout
    back = on_node(pool, 0)  # those two and nothing else: no metrics or health watch it never had
    assert back.steps == {"autostop", "ttl"} and not back.exporter
    calls = pool.exec_in(0, "cat /var/lib/gpuprov-shim/calls.log", check=True).stdout.splitlines()
    for timer in ("gpuprov-ttl.timer", "gpuprov-autostop.timer"):  # disabled by the clean-up, enabled again
        last = [c for c in calls if c.startswith("systemctl") and timer in c][-1]
        assert last == f"systemctl enable --now {timer}", last
    (row,) = json.loads(gp(env, "status", "base", "--json").stdout)
    assert (row["state"], row["autostop_seconds"], row["ttl_seconds"]) == ("ready", 7200, 8 * 3600)
    assert round(row["ttl_deadline"]) == int(after[1])
    assert gp(env, "exec", "base", "--", "true").returncode == 0  # its host key pinned again
    assert gp(env, "down", "base", "--yes").returncode == 0
    assert gp(env, "image", "rm", "t4-stack", "--yes").returncode == 0
    nothing_left(aws)


def test_a_bake_keeps_a_budget_deadline_sooner_than_the_ttl(aws, env, aws_hosts, gp_home):
    pool = aws_hosts
    _baked_node(aws, env, pool, gp_home, "--budget", "2")  # about 4h at the on-demand price: sooner than 8h
    deadline_file = f"{SYSROOT}/var/lib/gpuprov/ttl-deadline"
    before = pool.exec_in(0, f"cat {deadline_file}", check=True).stdout.split()
    assert int(before[0]) < 8 * 3600
    baked = gp(env, "image", "bake", "base", "--name", "t4-stack", "--yes")
    assert baked.returncode == 0, baked.stdout + baked.stderr
    assert "base: its guards are back (ttl)" in baked.stdout
    after = pool.exec_in(0, f"cat {deadline_file}", check=True).stdout.split()
    assert abs(int(after[1]) - int(before[1])) <= 5  # the budget's deadline, not a new one
    (row,) = json.loads(gp(env, "status", "base", "--json").stdout)
    assert row["budget_usd"] == 2 and 1.9 < row["budget_left_usd"] <= 2.0
    assert gp(env, "down", "base", "--yes").returncode == 0
    assert gp(env, "image", "rm", "t4-stack", "--yes").returncode == 0
    nothing_left(aws)


def test_guards_that_cannot_be_put_back_after_a_bake_are_recorded_off(aws, env, aws_hosts, gp_home):
    pool = aws_hosts
    _baked_node(aws, env, pool, gp_home, "--autostop", "2h")
    aws.faults({"action": "CreateImage", "hold": True, "times": 1})
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", "image", "bake", "base", "--name", "t4-stack", "--yes"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        aws.wait_held(1, timeout=120)
        # the clean-up has run: a file where the guards' scripts go makes every guard step fail
        pool.exec_in(0, f"touch {SYSROOT}/usr/local/lib/gpuprov", check=True)
    finally:
        aws.release()
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err  # the image is made
    assert "base: its guards could not be put back" in out and "no autostop, TTL or budget" in out
    (row,) = json.loads(gp(env, "status", "base", "--json").stdout)
    assert (row["autostop_seconds"], row["ttl_seconds"], row["ttl_deadline"]) == (None, None, None)
    pool.exec_in(0, f"rm -f {SYSROOT}/usr/local/lib/gpuprov", check=True)
    assert gp(env, "down", "base", "--yes").returncode == 0
    assert gp(env, "image", "rm", "t4-stack", "--yes").returncode == 0
    nothing_left(aws)


def test_monitoring_that_cannot_be_put_back_after_a_bake_leaves_the_guards_back_and_recorded(aws, env, aws_hosts,
                                                                                            gp_home):
    pool = aws_hosts
    _baked_node(aws, env, pool, gp_home, "--autostop", "2h", "--health")
    aws.faults({"action": "CreateImage", "hold": True, "times": 1})
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", "image", "bake", "base", "--name", "t4-stack", "--yes"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        aws.wait_held(1, timeout=120)
        # the clean-up has run: a file where the health watch keeps its findings makes its step fail, and it alone
        pool.exec_in(0, f"touch {SYSROOT}/var/lib/gpuprov/health", check=True)
    finally:
        aws.release()
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err
    assert "base: its guards are back, its monitoring is not" in out and "`gpuprov start base`" in out, out
    assert on_node(pool, 0).steps == {"autostop", "ttl"}
    (row,) = json.loads(gp(env, "status", "base", "--json").stdout)
    assert (row["autostop_seconds"], row["ttl_seconds"]) == (7200, 8 * 3600) and row["ttl_deadline"]
    pool.exec_in(0, f"rm -f {SYSROOT}/var/lib/gpuprov/health", check=True)
    assert gp(env, "down", "base", "--yes").returncode == 0
    assert gp(env, "image", "rm", "t4-stack", "--yes").returncode == 0
    nothing_left(aws)


def test_a_bake_of_a_node_another_member_locked_is_refused_before_anything_is_made(aws, env, aws_hosts, gp_home):
    from gpuprov.state import open_store

    pool = aws_hosts
    _baked_node(aws, env, pool, gp_home, "--locked")
    open_store().update_node("base", guards_locked_by="alice-0000")  # as alice's `up --locked` records it
    before = _identity(pool)
    calls = pool.exec_in(0, "cat /var/lib/gpuprov-shim/calls.log", check=True).stdout
    baked = gp(env, "image", "bake", "base", "--name", "t4-stack", "--yes")
    assert baked.returncode == 2, baked.stdout + baked.stderr
    line, hint = baked.stderr.splitlines()  # the error and what to do, no traceback
    assert line.startswith("error: NAME: base's autostop, TTL and budget are locked by alice-0000") and \
        "image bake refused" in line, line
    assert hint == "  ask them, or `gpuprov stop base` / `gpuprov down base`"
    assert _identity(pool) == before  # not reached: its guards and host keys where they were
    assert pool.exec_in(0, "cat /var/lib/gpuprov-shim/calls.log", check=True).stdout == calls
    assert not aws.log("CreateImage") and images_in(aws) == []
    assert json.loads(gp(env, "image", "list", "--json").stdout) == []
    assert gp(env, "down", "base", "--yes").returncode == 0
    nothing_left(aws)


def test_gc_during_a_bake_leaves_the_image_being_made(aws, env, aws_hosts, gp_home):
    pool = aws_hosts
    _baked_node(aws, env, pool, gp_home)
    aws.faults({"action": "CreateImage", "hold": True, "times": 1})
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", "image", "bake", "base", "--name", "t4-stack", "--yes"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        aws.wait_held(1, timeout=120)
        sweep = gp(env, "gc", "--yes")
        assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    finally:
        aws.release()
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err
    assert not aws.log("DeregisterImage")
    (image,) = images_in(aws)
    assert image["Name"] == "t4-stack" and image["State"] == "available"
    assert gp(env, "down", "base", "--yes").returncode == 0
    assert gp(env, "image", "rm", "t4-stack", "--yes").returncode == 0
    nothing_left(aws)


def test_the_bake_templates_are_bash_and_shellcheck_clean(tmp_path):
    from gpuprov.cloud import bake
    from gpuprov.plan.render import StepPlan, render_steps
    from tests.test_guardrails import assert_bash_and_shellcheck_pass

    values = {"image_clean.sh.j2": (("key_blob", "AAAA"), ("ssh_user", "ubuntu"), ("guard_units", bake.GUARD_UNITS),
                                    ("guard_steps", bake.GUARD_STEPS), ("backup", bake.BACKUP_DIR)),
              "image_restore.sh.j2": (("backup", bake.BACKUP_DIR), ("guard_units", bake.GUARD_UNITS))}
    paths = []
    for template, given in values.items():
        (script,) = render_steps((StepPlan("s", template, "guard", "x", given),), {}, {}).scripts
        paths.append(tmp_path / template.replace(".j2", ""))
        paths[-1].write_text(script.text)
    assert_bash_and_shellcheck_pass(paths)
