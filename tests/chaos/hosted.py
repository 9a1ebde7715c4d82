"""The walk's nodes with a real SSH host behind them, for the invariants that live on the node: (b) the data rule and
(e) the guards.

Node `h` (HOSTED) of either side is launched with a full bootstrap (no `--no-bootstrap`): a playbook with a `data:`
entry `when: down` (the host's /work/ckpt to the chaos-ckpt bucket), an 8h TTL and a 2h autostop, into a subnet of
its side whose every address is one host of the `aws_hosts` pool: the team's subnet (.64/26 of the pool's /24) is
host 0, carol's (.128/26) host 1. moto hands out an instance's private address in launch order within its subnet;
`Hosts.__enter__` gives each host all of its side's addresses (aliases on its eth0, sshd listening on every address),
so whichever instance of `h` moto launches, SSH to its address reaches its side's host. The other names stay
`--no-bootstrap --no-wait` (no host: steps cheap). A host is wiped (as a fresh instance's disk) before an `up` of `h`
when no live instance stands on it.

The ledger (`Ledger`, one entry per instance seen on a host): the volumes the instance had and the last thing its host
wrote to the data entry's file (read off the host after every step; the playbook's step and the walk's `write` rule
write a new token there). After every step:

(b) an instance whose volumes moto no longer has lost its disk: the bucket must hold the last token its host wrote,
    unless a `down --no-save` ran in that step, or the node's record is still live and a snapshot of the disk exists
    (a `start --move` carries the disk to the new instance through an image).
(e) a node whose record says `ready` or `running` (and that was bootstrapped: `ready_at`), whose instance runs in
    moto at an address of a host, has on that host exactly the guard steps `cloud/guards.recorded_guards` of its
    record names (tests/node_guards.py reads them: each unit's file and enabled), the TTL deadline the record keeps
    (within 5 s: the node's clock sets it a second after the record's) and the autostop window the record shows.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.node_guards import SYSROOT, on_node

HOSTED = "h"
CKPT_BUCKET = "chaos-ckpt"
CKPT_FILE = f"{SYSROOT}/work/ckpt/w.pt"
# the host's /24 (the pool's subnet): the team's launches get .68-.126, carol's .132-.190
SIDES = {"team": (0, 64), "local": (1, 128)}
HOSTED_UP = ("--gpu", "T4", "--ssh-cidr", "198.51.100.7/32", "--yes", "--connect", "private", "--ssh-user", "root",
             "--os", "ubuntu-22.04", "--python", "3.11", "--ttl", "8h", "--autostop", "2h")


def playbook(side: str) -> str:
    """The hosted node's playbook: nothing installed but its guards, a `when: down` upload of /work/ckpt, and a step
    that writes the first checkpoint (a token of the host's clock)."""
    return ("name: chaos\nstack: none\nenv: null\ndata:\n  - from: /work/ckpt\n"
            f"    to: s3://{CKPT_BUCKET}/{side}\n    when: down\nsteps:\n  - name: train\n"
            "    run: 'mkdir -p \"$GPUPROV_SYSROOT/work/ckpt\"; date +boot-%s%N > \"$GPUPROV_SYSROOT/work/ckpt/w.pt\"'\n")


@dataclass
class Disk:
    """One instance seen on a host: its volumes, what its host wrote last, and whether its fate is decided."""

    host: int
    side: str
    node: str
    volumes: tuple[str, ...]
    written: str | None = None
    closed: bool = False


@dataclass
class Ledger:
    disks: dict[str, Disk] = field(default_factory=dict)
    no_save: bool = False  # a `down --no-save` ran in this step
    writes: int = 0


class Hosts:
    """The pool's two hosts as the walk's hosted nodes' machines (see the module docstring)."""

    def __init__(self, pool: Any, s3_url: str) -> None:
        self.pool = pool
        self.s3_url = s3_url
        self.net = ipaddress.ip_network(f"{pool.subnet}.0/24")
        self._kept: dict[int, str] = {}

    @staticmethod
    def side_host(side: str) -> int:
        return SIDES[side][0]

    def block(self, side: str) -> str:
        return f"{self.net.network_address + SIDES[side][1]}/26"

    def addresses(self, side: str) -> list[str]:
        return [str(a) for a in list(ipaddress.ip_network(self.block(side)).hosts())[3:]]

    def host_of(self, address: str | None) -> tuple[int, str] | None:
        for side, (host, _) in SIDES.items():
            if address and ipaddress.ip_address(address) in ipaddress.ip_network(self.block(side)):
                return host, side
        return None

    def __enter__(self) -> Hosts:
        for side, (i, _) in SIDES.items():
            h = self.pool[i]
            config = Path(h.base) / "sshd_config"
            self._kept[i] = config.read_text()
            config.write_text(self._kept[i].replace(f"ListenAddress {h.address}\n", "ListenAddress 0.0.0.0\n"))
            batch = "".join(f"addr add {a}/24 dev eth0\n" for a in self.addresses(side))
            self.pool.exec_in(i, f"ip -batch - <<'EOF'\n{batch}EOF", check=True)
            self.pool.restart(i)
        return self

    def __exit__(self, *exc: object) -> None:
        for side, (i, _) in SIDES.items():
            h = self.pool[i]
            (Path(h.base) / "sshd_config").write_text(self._kept[i])
            batch = "".join(f"addr del {a}/24 dev eth0\n" for a in self.addresses(side))
            self.pool.exec_in(i, f"ip -force -batch - <<'EOF'\n{batch}EOF")
            # empty, as the pool started it: the next test on it sets it up as it needs
            self.pool.exec_in(i, "rm -rf /var/lib/gpuprov/* /var/lib/gpuprov-shim/* /run/gpuprov-shim/*")
            self.pool.restart(i)

    def homes(self, homes: list[Path]) -> None:
        """Every user's gpuprov home has the pool's key as its key pair's (as cloud-init would put it on the node)."""
        for home in homes:
            keys = home / "keys" / "us-east-1"
            keys.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.pool.key_path, keys / "id_ed25519")
            shutil.copy(f"{self.pool.key_path}.pub", keys / "id_ed25519.pub")

    def fresh(self, side: str) -> None:
        """Host of `side` as a new instance's disk: no gpuprov or shim state, a T4, S3 reachable with a role's keys."""
        from tests.hosts.fixture import SITE_IN_HOST

        env = {"GPUPROV_SHIM_GPU": "T4", "GPUPROV_SHIM_BOTO3_PATH": SITE_IN_HOST, "AWS_ENDPOINT_URL_S3": self.s3_url,
               "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}
        lines = "".join(f"export {k}={v}\n" for k, v in env.items())
        self.pool.exec_in(SIDES[side][0], "rm -rf /var/lib/gpuprov/* /var/lib/gpuprov-shim/* /run/gpuprov-shim/*; "
                                          "install -d -m 0755 /var/lib/gpuprov-shim/root; "
                                          f"printf %s '{lines}' > /var/lib/gpuprov-shim/env", check=True)

    def write(self, host: int, token: str) -> bool:
        """The host writes `token` as its checkpoint (False: nothing bootstrapped there yet)."""
        done = self.pool.exec_in(host, f"test -d {SYSROOT}/work/ckpt && echo {token} > {CKPT_FILE}")
        return done.returncode == 0

    def written(self, host: int) -> str | None:
        done = self.pool.exec_in(host, f"cat {CKPT_FILE} 2>/dev/null")
        return done.stdout.strip() or None


def node_of(record: dict[str, Any]) -> Any:
    """A record read straight from a store as gpuprov's own Node (a field it does not know is left)."""
    from gpuprov.state.records import Node

    names = {f.name for f in dataclasses.fields(Node)}
    return Node(**{k: v for k, v in record.items() if k in names})


def data_lost(ledger: Ledger, ec2: Any, s3: Any, live_names: set[str]) -> list[str]:
    """(b): each disk seen gone since the last step whose host's last write is not in the bucket."""
    problems = []
    for iid, disk in ledger.disks.items():
        if disk.closed or not disk.volumes:
            continue
        left = ec2.describe_volumes(Filters=[{"Name": "volume-id", "Values": list(disk.volumes)}])["Volumes"]
        if left:
            continue
        disk.closed = True
        if ledger.no_save or disk.written is None:
            continue
        copied = [s for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"] if s.get("VolumeId") in disk.volumes]
        if disk.node in live_names and copied:
            continue  # moved: the disk went on through its image
        try:
            saved = s3.get_object(Bucket=CKPT_BUCKET, Key=f"{disk.side}/w.pt")["Body"].read().decode().strip()
        except s3.exceptions.NoSuchKey:
            saved = None
        if saved != disk.written:
            problems.append(f"(b) the disk of {disk.node} ({iid}, {', '.join(disk.volumes)}) was deleted with its "
                            f"`when: down` data unsaved: its host wrote {disk.written!r}, the bucket holds {saved!r}, "
                            "and no `down --no-save` ran")
    return problems


def guards_differ(hosts: Hosts, store: str, record: dict[str, Any], host: int) -> list[str]:
    """(e) for one running node on host `host`."""
    from gpuprov.cloud.guards import recorded_guards

    node = node_of(record)
    recorded = recorded_guards(node)
    found = on_node(hosts.pool, host)
    problems = []
    if found.steps != set(recorded.names):
        problems.append(f"guards {sorted(found.steps)} on its host, its record shows {sorted(recorded.names)}")
    if recorded.deadline is not None and (found.deadline is None or abs(found.deadline - recorded.deadline) > 5):
        problems.append(f"TTL deadline {found.deadline} on its host, its record keeps {recorded.deadline}")
    if "autostop" in recorded.names and found.idle_seconds != node.autostop_seconds:
        problems.append(f"autostop window {found.idle_seconds} s on its host, its record shows {node.autostop_seconds}")
    return [f"(e) {store}'s {record['name']} ({record['state']}): {p}" for p in problems]
