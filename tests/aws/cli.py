"""Running the real `gpuprov` CLI against the fake AWS endpoint: the env fixture and small helpers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests import forkcli, testnet

EMPTY = {"instances": [], "security_groups": [], "key_pairs": [], "volumes": [], "spot_requests": [],
         "launch_templates": [], "placement_groups": [], "addresses": []}


# the CLI's test settings against either imitation (this one, tests/aws/inprocess.py). GPUPROV_TEST_SETTLE_SECONDS:
# the imitation's eventual consistency is counted in look-ups (2 per fresh id, 1 per tag or token filter unless a
# test asks for more), which backoff from 0.1 s covers in seconds; EC2's three minutes would make every `down` after
# a launch that never happened wait them out
# GPUPROV_SOURCES=origins: the test hosts stand for the origins (the shims serve NVIDIA's keyring as its origin does),
# a node on Alibaba Cloud too, whose default internal mirror they cannot stand for (a flag still wins)
CLI_SETTINGS = {"GPUPROV_TEST_POLL_SECONDS": "0.1", "GPUPROV_TEST_SETTLE_SECONDS": "15", "COLUMNS": "200",
                "GPUPROV_SOURCES": "origins"}


@pytest.fixture
def env(aws, gp_home):
    return {**os.environ, **aws.env(), "GPUPROV_HOME": str(gp_home), **CLI_SETTINGS}


def gp(env, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True,
                       timeout=timeout, env=env)


def up_args(name: str, *extra: str) -> list[str]:
    return ["up", name, "--ssh-cidr", "198.51.100.7/32", "--yes", *extra]


def nothing_left(aws) -> None:
    assert aws.leftovers() == EMPTY


def launch_site(aws, pool, gp_home, block: str = ".0/24", regions: tuple[str, ...] = ("us-east-1",)) -> str:
    """The first instance moto launches into the returned subnet (10.220.N`block` in us-east-1a) lands on pool[0]'s
    address, a fresh T4 host that trusts gpuprov's key in each of `regions` (as cloud-init would on EC2)."""
    pool.exec_in(0, "rm -rf /var/lib/gpuprov/* /var/lib/gpuprov-shim/* /run/gpuprov-shim/*; "
                    "install -d -m 0755 /var/lib/gpuprov-shim/root; "  # the host's `/`, 0755 as a real root is
                    "echo 'export GPUPROV_SHIM_GPU=T4' > /var/lib/gpuprov-shim/env", check=True)
    for region in regions:
        keys = gp_home / "keys" / region
        keys.mkdir(parents=True)
        shutil.copy(pool.key_path, keys / "id_ed25519")
        shutil.copy(f"{pool.key_path}.pub", keys / "id_ed25519.pub")
    return aws.subnet_for_hosts(testnet.subnet("10.220.0") + block, "us-east-1a")


def copy_disk(pool, src: int, dst: int) -> None:
    """The image's disk as an instance launched from it sees it: the source host's gpuprov and shim state
    (packages the shims installed, the sysroot) onto the host the new instance's address reaches. The sysroot's
    /run is a tmpfs on a real machine: no snapshot holds it (a bake's backup lives there), so it is left out."""
    out = pool.exec_in(src, "tar -C / --exclude=var/lib/gpuprov-shim/root/run -czf - var/lib/gpuprov "
                            "var/lib/gpuprov-shim | base64 -w0", check=True).stdout
    pool.exec_in(dst, "rm -rf /var/lib/gpuprov/* /var/lib/gpuprov-shim/* /run/gpuprov-shim/* /tmp/disk.b64", check=True)
    for at in range(0, len(out), 60000):
        pool.exec_in(dst, f"printf '%s' '{out[at:at + 60000]}' >> /tmp/disk.b64", check=True)
    pool.exec_in(dst, "base64 -d /tmp/disk.b64 | tar -C / -xzf - && rm /tmp/disk.b64 && : > /var/lib/gpuprov-shim/calls.log",
                 check=True)
