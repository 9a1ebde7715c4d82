"""A playbook's `data:` entries on a real-sshd test host against moto's S3 (behind the fault proxy): the dataset comes
down before the playbook's own steps, a cut download resumes with only what is missing, and the checkpoint goes up on
a spot notice (after the on-interrupt hook that writes it) and before a TTL shutdown. The host's `aws` is the shim
tests/shims/libexec/aws_s3.py: `aws s3 sync` for real through boto3, refusing what it does not model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator

import boto3
import pytest

from tests.aws.cli import gp, launch_site, nothing_left, up_args
from tests.hosts.fixture import SITE_IN_HOST
from tests.test_guardrails import HOST_SYSROOT, WATCH, _Metadata

HOST = 6
TTL_CHECK = f"{HOST_SYSROOT}/usr/local/lib/gpuprov/ttl-check"
OBJECTS = {"datasets/x/a.txt": b"alpha\n", "datasets/x/sub/b.bin": bytes(range(256)) * 8, "datasets/x/c.txt": b"c\n"}
PLAYBOOK = """\
name: data
stack: none
env: null
data:
  - from: s3://my-data/datasets/x
    to: /data/x
  - from: /work/ckpt
    to: s3://my-ckpt/run1
    when: interrupt|stop
on_interrupt: 'echo last > "${GPUPROV_SYSROOT:-}/work/ckpt/last.pt"'
steps:
  - name: train
    run: 'mkdir -p "$GPUPROV_SYSROOT/work/ckpt"; cat "$GPUPROV_SYSROOT/data/x/a.txt" > "$GPUPROV_SYSROOT/work/ckpt/model.pt"'
"""


class _Forward:
    """TCP from the hosts' bridge address to the fault proxy on 127.0.0.1 (the hosts reach only their subnet)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = port
        self.server = socket.create_server((host, 0))
        self.url = f"http://{host}:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def _s3_for(pool, aws) -> Iterator[str]:
    """The S3 endpoint as the pool's hosts reach it."""
    if pool.mode != "netns":
        yield aws.url
        return
    forward = _Forward(f"{pool.subnet}.1", int(aws.url.rsplit(":", 1)[1]))
    try:
        yield forward.url
    finally:
        forward.server.close()


def _shim_env(pool, s3_url: str, **more: str) -> str:
    """The host's shim env lines: the host's python3 with this test's boto3 (the venv's own interpreter may live under
    the hosts' private /root; its site-packages are mounted at SITE_IN_HOST in a netns host), the endpoint and
    credentials as the node's role would give them."""
    site = SITE_IN_HOST if pool.mode == "netns" else os.path.dirname(os.path.dirname(boto3.__file__))
    env = {"GPUPROV_SHIM_BOTO3_PATH": site, "AWS_ENDPOINT_URL_S3": s3_url,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true", **more}
    return "".join(f"export {k}={v}\n" for k, v in env.items())


@pytest.fixture
def s3_on_hosts(host_pool, aws) -> Iterator[str]:
    with _s3_for(host_pool, aws) as url:
        yield url


@pytest.fixture
def metadata(host_pool) -> Iterator[_Metadata]:
    meta = _Metadata(f"{host_pool.subnet}.1" if host_pool.mode == "netns" else "127.0.0.1")
    try:
        yield meta
    finally:
        meta.server.shutdown()
        meta.server.server_close()


def test_data_comes_down_before_the_steps_resumes_after_a_cut_and_the_checkpoint_goes_up_on_notice_and_shutdown(
        host_pool, aws, env, s3_on_hosts, metadata, tmp_path):
    pool, i = host_pool, HOST
    s3 = aws.client("s3")
    for bucket in ("my-data", "my-ckpt"):
        s3.create_bucket(Bucket=bucket)
    for key, body in OBJECTS.items():
        s3.put_object(Bucket="my-data", Key=key, Body=body)
    playbook = tmp_path / "data.yml"
    playbook.write_text(PLAYBOOK)

    # plan --live sizes the download from here (ListObjectsV2), before any node exists
    plan = gp(env, "plan", "--gpu", "T4", "-p", str(playbook), "--live", "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["data"] == [
        {"from": "s3://my-data/datasets/x", "to": "/data/x", "when": ["up"], "objects": 3,
         "bytes": sum(map(len, OBJECTS.values()))},
        {"from": "/work/ckpt", "to": "s3://my-ckpt/run1", "when": ["interrupt", "stop"]}]

    pool.exec_in(i, "rm -rf /var/lib/gpuprov/* /var/lib/gpuprov-shim/* /run/gpuprov-shim/* /tmp/gp-*; "
                    "mkdir -p /var/lib/gpuprov-shim", check=True)
    # an image without the AWS CLI (Canonical's Ubuntu): the data steps install it with snap, once
    lines = _shim_env(pool, s3_on_hosts, GPUPROV_SHIM_CURL_PASSTHROUGH=metadata.url, GPUPROV_SHIM_AWS="absent")
    pool.exec_in(i, f"printf %s '{lines}' > /var/lib/gpuprov-shim/env", check=True)

    def bootstrap() -> tuple[int, list[tuple[str, str]], str]:
        out = gp(env, "bootstrap", f"root@{pool[i].address}", "-i", str(pool.key_path), "--accept-new-host-key",
                 "--os", "ubuntu-22.04", "-p", str(playbook), "--ttl", "8h", "--connect-timeout", "3", "--json")
        steps = [(s["name"], s["outcome"]) for s in json.loads(out.stdout)[0]["steps"]] if out.stdout else []
        return out.returncode, steps, out.stdout + out.stderr

    # the third object's first GET is refused: the download stops there, and the playbook's step never runs
    aws.faults({"service": "s3", "action": "GetObject", "match": {"Key": "datasets/x/c.txt"}, "status": 403,
                "code": "AccessDenied", "times": 1})
    rc, steps, text = bootstrap()
    assert rc != 0 and ("data-fetch", "failed") in steps and "train" not in dict(steps), text
    assert pool.exec_in(i, f"cat {HOST_SYSROOT}/data/x/a.txt").stdout == "alpha\n", text
    # the rerun fetches only what is missing: each object was read once in all
    rc, steps, text = bootstrap()
    assert rc == 0, text
    assert steps[-3:] == [("data-save", "skipped"), ("data-fetch", "changed"), ("train", "changed")], steps
    gets = [e["form"].get("Key") for e in aws.log() if e.get("action") == "GetObject" and e["status"] == 200]
    assert sorted(gets) == sorted(OBJECTS), gets
    calls = pool.exec_in(i, "cat /var/lib/gpuprov-shim/calls.log").stdout.splitlines()
    assert [c for c in calls if c.startswith("snap ")] == ["snap install aws-cli --classic"], calls
    refused = pool.exec_in(i, "snap install aws-cli --classic; snap install s5cmd")  # as snapd answers them
    assert "already installed" in refused.stdout and 'snap "s5cmd" not found' in refused.stderr
    got = pool.exec_in(i, f"cd {HOST_SYSROOT}/data/x && sha256sum a.txt sub/b.bin c.txt", check=True).stdout
    assert [line.split()[0] for line in got.splitlines()] == [hashlib.sha256(b).hexdigest() for b in OBJECTS.values()]

    # a spot notice: the hook writes last.pt, then save-data uploads the checkpoint folder
    metadata.notice = {"action": "terminate", "time": "2026-03-01T12:02:00Z"}
    watch = pool.exec_in(i, f"{WATCH} --once", env={"GPUPROV_SYSROOT": HOST_SYSROOT,
                                                    "GPUPROV_METADATA_URL": metadata.url}, timeout=30)
    assert watch.returncode == 0, watch.stderr
    log = pool.exec_in(i, f"cat {HOST_SYSROOT}/var/log/gpuprov/interrupt.log").stdout
    assert "save-data interrupt exited 0" in log, log

    def saved() -> dict[str, bytes]:
        listed = s3.list_objects_v2(Bucket="my-ckpt").get("Contents", [])
        return {o["Key"]: s3.get_object(Bucket="my-ckpt", Key=o["Key"])["Body"].read() for o in listed}

    assert saved() == {"run1/model.pt": b"alpha\n", "run1/last.pt": b"last\n"}

    # the TTL's deadline passes: the checkpoint goes up again (what changed) before the shutdown
    pool.exec_in(i, f"echo step-2 > {HOST_SYSROOT}/work/ckpt/model.pt", check=True)
    pool.exec_in(i, TTL_CHECK, env={"GPUPROV_SYSROOT": HOST_SYSROOT, "GPUPROV_NOW": "4000000000",
                                        "GPUPROV_BOOT_TIME": "1000"}, check=True)
    assert saved()["run1/model.pt"] == b"step-2\n"
    calls = pool.exec_in(i, "cat /var/lib/gpuprov-shim/calls.log").stdout.splitlines()
    shutdown = next(n for n, c in enumerate(calls) if c.startswith("shutdown"))
    assert any(c.startswith("aws s3 sync") and "/work/ckpt" in c for c in calls[:shutdown]), calls

    # `gpuprov sync` with an S3 side runs `aws s3 sync` on the host; between here and S3 it is refused with the advice
    pool.exec_in(i, "mkdir -p /tmp/gp-out && echo result > /tmp/gp-out/r.txt", check=True)
    up = gp(env, "sync", f"root@{pool[i].address}:/tmp/gp-out", "s3://my-ckpt/synced", "-i", str(pool.key_path))
    assert up.returncode == 0, up.stdout + up.stderr
    assert "upload: /tmp/gp-out/r.txt to s3://my-ckpt/synced/r.txt" in up.stdout
    assert s3.get_object(Bucket="my-ckpt", Key="synced/r.txt")["Body"].read() == b"result\n"
    here = gp(env, "sync", str(tmp_path), "s3://my-ckpt/x")
    assert here.returncode == 2 and "between here and S3 copying is the AWS CLI's job (`aws s3 sync" in here.stderr


def test_down_saves_the_checkpoint_first_and_a_failed_save_takes_nothing_down(aws, env, aws_hosts, gp_home, tmp_path):
    pool = aws_hosts
    subnet = launch_site(aws, pool, gp_home)
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="my-ckpt")
    playbook = tmp_path / "ckpt.yml"
    playbook.write_text("name: ckpt\nstack: none\nenv: null\ndata:\n  - from: /work/ckpt\n    to: s3://my-ckpt/run1\n"
                        "    when: down\nsteps:\n  - name: train\n    run: 'mkdir -p \"$GPUPROV_SYSROOT/work/ckpt\"; "
                        "echo w > \"$GPUPROV_SYSROOT/work/ckpt/w.pt\"'\n")
    with _s3_for(pool, aws) as url:
        pool.exec_in(0, f"printf %s '{_shim_env(pool, url)}' >> /var/lib/gpuprov-shim/env", check=True)
        up = gp(env, *up_args("saver", "--gpu", "T4", "--subnet", subnet, "--connect", "private", "--ssh-user", "root",
                              "--os", "ubuntu-22.04", "-p", str(playbook)))
        assert up.returncode == 0, up.stdout + up.stderr
        # the bucket refuses the upload once: down stops before it touches anything
        aws.faults({"service": "s3", "action": "PutObject", "match": {"Key": "run1/w.pt"}, "status": 403,
                    "code": "AccessDenied", "times": 1})
        refused = gp(env, "down", "saver", "--yes")
        assert refused.returncode == 1 and "its data was not saved (save-data exited 1: 1 upload(s) failed)" in \
            refused.stderr, refused.stdout + refused.stderr
        assert "nothing was taken down" in refused.stderr and "--no-save" in refused.stderr
        (inst,) = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
        assert inst["State"]["Name"] == "running"
        down = gp(env, "down", "saver", "--yes")
        assert down.returncode == 0, down.stdout + down.stderr
        assert "saver: saving its data first" in down.stdout + down.stderr
    assert s3.get_object(Bucket="my-ckpt", Key="run1/w.pt")["Body"].read() == b"w\n"
    nothing_left(aws)


def test_the_aws_shim_fails_as_the_cli_does_without_credentials_and_on_a_refused_listing(aws, tmp_path):
    """What the data steps see from `aws s3 sync` when the node has no role, or its role is refused: the CLI's own
    lines, exit 1 for both (an s3 command's fatal error, not the 253/254 of other commands)."""
    aws.client("s3").create_bucket(Bucket="shim-bucket")
    site = os.path.dirname(os.path.dirname(boto3.__file__))
    base = {"PATH": os.environ["PATH"], "GPUPROV_SHIM_STATE": str(tmp_path / "state"),
            "GPUPROV_SHIM_RUN": str(tmp_path / "run"), "GPUPROV_SHIM_BOTO3_PATH": site,
            "AWS_ENDPOINT_URL_S3": aws.env()["AWS_ENDPOINT_URL"], "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
    shim = os.path.join(os.path.dirname(__file__), "shims", "bin", "aws")
    sync = [shim, "s3", "sync", "--no-progress", "s3://shim-bucket/x", str(tmp_path / "d")]
    bare = subprocess.run(sync, env=base, capture_output=True, text=True, timeout=60)
    assert (bare.returncode, bare.stderr.strip()) == (1, "fatal error: Unable to locate credentials")
    aws.faults({"service": "s3", "action": "ListObjectsV2", "status": 403, "code": "AccessDenied", "message": "Access Denied"})
    keyed = {**base, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    refused = subprocess.run(sync, env=keyed, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert refused.stderr.strip() == ("fatal error: An error occurred (AccessDenied) when calling the ListObjectsV2 "
                                      "operation: Access Denied")
