"""`make sandbox`: a local AWS endpoint and SSH hosts with shimmed GPUs, to try every gpuprov command on.

    sudo make sandbox                       # starts it, prints the environment, runs until Ctrl-C
    eval "$(.venv/bin/python tools/sandbox.py env)"    # in another shell: point gpuprov at it
    cd "$SANDBOX_WORK"                      # its folder for you: hosts.yml and ./code
    gpuprov up try --gpu T4                 # the README's commands, as printed, in order
    .venv/bin/python tools/sandbox.py down  # or Ctrl-C where it runs: everything stops, nothing is left

What runs (the test harness's own pieces, tests/aws and tests/hosts):
  * moto behind the fault proxy, with Canonical's Ubuntu images and AWS's Deep Learning AMI parameter seeded,
    and a subnet without public addresses in us-east-1a;
  * N hosts (--nodes, default 16: one per instance the README's examples launch, in order) in network
    namespaces on that subnet's addresses (.4, .5, ... as moto hands them out in launch order), reached as root.
    Each stands for the instance moto has at its address: its GPUs are that instance type's (the shims ask the
    sandbox, which asks moto), as an EC2 instance's are;
  * 3 hosts "you already have" at 10.1.2.3, .4 and .5 (the README's addresses; --hosts-subnet for others),
    with 2 A100-80GB (.3, .4) or 2 H100 (.5) each, login `ubuntu` with passwordless sudo as on EC2 (the user is created on this
    machine while the sandbox runs, if missing), `gpu-box` and `bastion` as Host aliases in the sandbox's ssh
    config;
  * Alibaba Cloud's ECS imitation (tests/alibaba/server.py) on 127.0.0.1, which GPUPROV_ALIBABA_ENDPOINT points the
    SDK at (with test credentials, and the SDK's ECS metadata look-up off), and --alibaba-nodes hosts (default 2) on
    a subnet of their own: each new ECS instance is given the next one's address as its private address, and its
    GPUs are its type's (the shims play T4s: `gpuprov up NAME --cloud alibaba --gpu T4` launches, connects and
    bootstraps, as the README's Alibaba Cloud section does). Its nodes download from the origins the shims stand
    for: the config's empty [sources] says so, over the internal mirror they would default to.

What it brings along for the README's examples, which run in order, as printed, in its folder `work`
(SANDBOX_WORK; tests/test_readme.py runs them so): a hosts.yml naming its hosts you already have (the README's
inventory, with the sandbox's key), ./code with a train.py to sync and torchrun, the instance profile and the
team bucket the examples name, and a local stand-in of the public sources `facts refresh` reads
(tests/indexsite.py: PyPI, the PyTorch wheel index and NVIDIA's repository, on 127.0.0.1), which
GPUPROV_PYPI_URL, GPUPROV_PYTORCH_INDEX_URL and GPUPROV_NVIDIA_REPOS_URL point at.

What it sets, through gpuprov's own config file (GPUPROV_CONFIG), not through flags: subnet, connect =
private, ssh_user = root, os = ubuntu-22.04 (what the shims imitate), python = 3.11, ssh_cidr (the bridge),
key and ssh_config for the hosts you already have. GPUPROV_HOME is the sandbox's own state, so your real
nodes and the sandbox's never mix. The hosts' keys are pinned in that state's known_hosts, as machines you
already ssh into would be in ~/.ssh/known_hosts. With AWS_ENDPOINT_URL local, gpuprov never connects to a
public address (moto makes them up; they are real machines on the internet).

The hosts are namespaces on this machine: /tmp, /root, /var/lib/gpuprov and /work (made empty for the while if
this machine has none) are each host's own, the rest of the file system (/home, /opt, ...) is this machine's.

Why tools/ and not `gpuprov sandbox`: the sandbox is the test harness (moto, the fault proxy, the host
namespaces, the GPU shims), which lives in tests/ and is not part of an installed wheel; a command inside the
package would have to ship it or fail on every installed copy. It needs a clone and root (`make sandbox`).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_DIR = Path(os.environ.get("GPUPROV_TEST_SANDBOX_DIR") or f"/tmp/gpuprov-sandbox-{os.getuid()}")
SYSROOT = "/var/lib/gpuprov-shim/root"
SYSROOT_DIRS = ("", "/etc", "/opt", "/usr", "/usr/local", "/usr/local/bin", "/var", "/var/lib")
# each host has its own network namespace, so the exporters of `--metrics` run for real there, as in the tests
# (tests/conftest.py REAL_UNITS, tests/shims/lib/units.sh)
REAL_UNITS = "prometheus-node-exporter,gpuprov-gpu-metrics,nvidia-dcgm,nvidia-dcgm-exporter"
HOST_ENV = {"GPUPROV_SYSROOT": SYSROOT, "GPUPROV_RETRY_DELAY": "0", "GPUPROV_APT_LOCK_POLL": "1",
            "GPUPROV_SHIM_REAL_UNITS": REAL_UNITS}
DLAMI_PREFIX = "/sandbox/deeplearning"
DLAMI_DRIVER = "595.91.07"  # what data/images.yaml says the seeded DLAMI's release ships
LOGIN = "ubuntu"
HOST_GPUS = ("A100-80GB", "A100-80GB", "H100")  # the hosts you already have (.3, .4, .5 = gpu-box), 2 each
# ./code/train.py in the folder the README's examples run in (`sync ./code …`, `torchrun rack -- code/train.py`)
TRAIN_PY = "import os, sys\nprint(f\"rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')}: {sys.argv[1:]}\")\n"


class Sandbox:
    """The pieces, started and stopped together; `env` is what gpuprov needs to use them."""

    def __init__(self, workdir: Path, *, nodes: int = 10, net: int = 0, hosts_subnet: str = "10.1.2",
                 aws_subnet: str | None = None, prefix: str | None = None, alibaba_nodes: int = 0,
                 alibaba_subnet: str | None = None) -> None:
        self.workdir = workdir.resolve()
        self.nodes = nodes
        self.hosts_subnet = hosts_subnet
        self.aws_subnet = aws_subnet or f"10.243.{net}"
        self.alibaba_nodes = alibaba_nodes
        self.alibaba_subnet = alibaba_subnet or f"10.244.{net}"
        self.prefix = prefix or f"gps{net or ''}"
        self.net = net
        self.env: dict[str, str] = {}
        self._stack = contextlib.ExitStack()
        self._server: ThreadingHTTPServer | None = None

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self) -> Sandbox:
        from tests import indexsite
        from tests.aws.fixture import AwsEndpoint
        from tests.hosts.fixture import HostPool
        from tests.machine import shared_user

        if os.geteuid() != 0:
            raise SystemExit("sandbox: the SSH hosts live in network namespaces: run it as root (sudo make sandbox)")
        for subnet in (self.aws_subnet, self.hosts_subnet, *((self.alibaba_subnet,) if self.alibaba_nodes else ())):
            _refuse_a_subnet_in_use(subnet)
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True, mode=0o755)
        try:
            aws = self._stack.enter_context(AwsEndpoint(workdir=self.workdir / "aws"))
            aws.reset()
            aws.instant()  # a sandbox to learn on, not EC2's eventual consistency (the tests play that)
            self.aws = aws
            self.subnet_id = aws.subnet_for_hosts(f"{self.aws_subnet}.0/24", "us-east-1a")
            self.dlami = _seed_dlami(aws)
            _seed_spot_prices(aws)
            _seed_what_the_readme_assumes(aws)
            self._stack.enter_context(shared_user(LOGIN))
            self._stack.enter_context(mount_points(PRIVATE))
            shims = ROOT / "tests" / "shims"
            self.pool = self._stack.enter_context(HostPool(
                self.nodes, self.workdir / "nodes", shims_dir=shims, offset=3, prefix=f"{self.prefix}n",
                bridge=f"{self.prefix}nbr0", subnet=self.aws_subnet, host_env=HOST_ENV, mode="netns", private=PRIVATE))
            self.hosts = self._stack.enter_context(HostPool(
                3, self.workdir / "hosts", shims_dir=shims, offset=2, prefix=f"{self.prefix}h",
                bridge=f"{self.prefix}hbr0", subnet=self.hosts_subnet, host_env=HOST_ENV, sudo_users=(LOGIN,),
                mode="netns", private=PRIVATE))
            self._serve_instances()
            if self.alibaba_nodes:
                self._start_alibaba(shims)
            site = indexsite.build(self.workdir / "sources", newer=False)
            self.sources, _ = self._stack.enter_context(indexsite.serve(site))
            self._write_files()
            self._stack.callback(self._stop_server)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self._stack.close()

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- what each host stands for ----------------------------------------------------------------
    def _serve_instances(self) -> None:
        """GET /ADDRESS: the shim settings of the instance moto has at ADDRESS (its type's GPUs; a DLAMI's
        preinstalled driver), empty when none runs there."""
        sandbox = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = sandbox.settings_for(self.path.strip("/")).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((f"{self.aws_subnet}.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="sandbox-instances", daemon=True).start()
        for index in range(len(self.pool.hosts)):
            self.stand_for_instances(index)
        for pool in (self.pool, self.hosts):  # the fake root stands for a machine's /: its top folders are 755
            for host in pool.hosts:       # there (the steps run under umask 077, which would make them root's only)
                pool.exec_in(host, f"install -d -m 755 {' '.join(SYSROOT + d for d in SYSROOT_DIRS)}", check=True)
        for host, gpu in zip(self.hosts.hosts, HOST_GPUS, strict=True):
            self.hosts.exec_in(host, f"printf 'export GPUPROV_SHIM_GPU={gpu}\\nexport GPUPROV_SHIM_GPU_COUNT=2\\n' "
                                     "> /var/lib/gpuprov-shim/env", check=True)

    def stand_for_instances(self, index: int) -> None:
        """Pool host `index` is whatever instance moto has at its address (again: after a disk was copied onto
        it, say, whose shim settings were another host's)."""
        assert self._server is not None
        host = self.pool.hosts[index]
        url = f"http://{self.aws_subnet}.1:{self._server.server_address[1]}/{host.address}"
        self.pool.exec_in(host, f"echo 'export GPUPROV_SHIM_INSTANCE_URL={url}' > /var/lib/gpuprov-shim/env", check=True)

    def _start_alibaba(self, shims: Path) -> None:
        """The ECS imitation, and the hosts its instances stand at: the n-th instance it makes gets the n-th host's
        address (round the hosts again after the last), and that host's GPUs become its type's."""
        from tests.alibaba.server import Ecs, serve
        from tests.hosts.fixture import HostPool

        self.alibaba = self._stack.enter_context(HostPool(
            self.alibaba_nodes, self.workdir / "alibaba", shims_dir=shims, offset=3, prefix=f"{self.prefix}a",
            bridge=f"{self.prefix}abr0", subnet=self.alibaba_subnet, host_env=HOST_ENV, mode="netns",
            private=PRIVATE))
        for host in self.alibaba.hosts:
            self.alibaba.exec_in(host, f"install -d -m 755 {' '.join(SYSROOT + d for d in SYSROOT_DIRS)}", check=True)
        ecs = Ecs()
        made = iter(range(10**9))

        def stand_at(raw: dict[str, Any]) -> tuple[str, str]:
            n = next(made)
            host = self.alibaba.hosts[n % len(self.alibaba.hosts)]
            spec, gpus = ecs.types.get(str(raw.get("InstanceType")), ("", 0))[:2]
            gpu = str(spec).removeprefix("NVIDIA").strip()
            self.alibaba.exec_in(host, f"printf 'export GPUPROV_SHIM_GPU={gpu}\\nexport GPUPROV_SHIM_GPU_COUNT={gpus}\\n' "
                                       "> /var/lib/gpuprov-shim/env", check=True)
            return f"198.51.100.{n % 250 + 1}", host.address  # a documentation address: never reached

        ecs.address_for = stand_at
        self.ecs, self.ecs_url = self._stack.enter_context(serve(ecs))

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def settings_for(self, address: str) -> str:
        from gpuprov.plan import catalog

        try:
            ipaddress.ip_address(address)
        except ValueError:
            return ""
        found = [i for r in self.aws.ec2().describe_instances(Filters=[
            {"Name": "private-ip-address", "Values": [address]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])["Reservations"]
            for i in r["Instances"]]
        if not found:
            return ""
        instance = found[-1]
        kind = catalog.load().instance_type(instance["InstanceType"])
        lines = [f"export GPUPROV_SHIM_GPU={kind.gpu}", f"export GPUPROV_SHIM_GPU_COUNT={kind.gpus}"]
        efa = self._efa_interfaces(str(instance.get("ClientToken") or ""))
        if efa:
            lines.append(f"export GPUPROV_SHIM_EFA_DEVICES={efa}")
        if instance.get("ImageId") == self.dlami:
            lines.append(f"export GPUPROV_SHIM_DRIVER_PREINSTALLED={DLAMI_DRIVER}")
        return "\n".join(lines) + "\n"

    def _efa_interfaces(self, token: str) -> int:
        """The EFA interfaces the instance was asked for (moto keeps no interface types; the proxy's log keeps
        the request, found by its ClientToken)."""
        if not token:
            return 0
        asked = [e["form"] for e in self.aws.log("RunInstances") if (e.get("form") or {}).get("ClientToken") == token]
        return max((sum(1 for k, v in form.items() if k.endswith(".InterfaceType") and v in ("efa", "efa-only"))
                    for form in asked), default=0)

    # ---- gpuprov's side ---------------------------------------------------------------------------
    def _write_files(self) -> None:
        from tests import indexsite

        state = self.workdir / "state"
        keys = state / "keys" / "us-east-1"
        keys.mkdir(parents=True, mode=0o700)
        for suffix in ("", ".pub"):  # the nodes trust this key, as cloud-init would put it on an EC2 instance
            shutil.copy(f"{self.pool.key_path}{suffix}", keys / f"id_ed25519{suffix}")
        (keys / "id_ed25519").chmod(0o600)
        if self.alibaba_nodes:  # the ECS instances trust the key gpuprov imports there, as ECS puts it on them
            ali = state / "keys" / "cn-hangzhou"
            ali.mkdir(parents=True, mode=0o700)
            for suffix in ("", ".pub"):
                shutil.copy(f"{self.alibaba.key_path}{suffix}", ali / f"id_ed25519{suffix}")
            (ali / "id_ed25519").chmod(0o600)
        self.key = self.workdir / "id_ed25519"  # the hosts you already have: your own key for them
        shutil.copy(self.hosts.key_path, self.key)
        self.key.chmod(0o600)
        (state / "known_hosts").write_text("".join(h.known_hosts_line() + "\n" for h in self.hosts.hosts))
        (state / "known_hosts").chmod(0o600)
        h = [host.address for host in self.hosts.hosts]
        ssh_config = self.workdir / "ssh_config"
        ssh_config.write_text(f"# the sandbox's own ssh config (gpuprov's `ssh_config` key points here)\n"
                              f"Host gpu-box\n  HostName {h[2]}\n  User {LOGIN}\n  IdentityFile {self.key}\n"
                              f"Host bastion\n  HostName {h[0]}\n  User {LOGIN}\n  IdentityFile {self.key}\n"
                              f"Include {state / 'ssh_config'}\n")
        config = self.workdir / "config.toml"
        config.write_text(f"""# written by `make sandbox`; gpuprov reads it through GPUPROV_CONFIG
region = "us-east-1"
subnet = "{self.subnet_id}"
connect = "private"
ssh_user = "root"
os = "ubuntu-22.04"
python = "3.11"
ssh_cidr = "{self.aws_subnet}.1/32"
key = "{self.key}"
ssh_config = "{ssh_config}"
""" + ("""
# the shims stand for the origins: every node downloads from them, an Alibaba Cloud one too (a map named, even
# empty, replaces the internal mirror an Alibaba node would default to)
[sources]
""" if self.alibaba_nodes else ""))
        from tests.shimdata import pin_uv_stand_in

        pin_uv_stand_in(state / "facts")  # the hosts' uv is the shims' stand-in of its pinned release archive
        self.env = {**self.aws.env(), "GPUPROV_HOME": str(state), "GPUPROV_CONFIG": str(config),
                    "GPUPROV_TEST_DLAMI_SSM_PREFIX": DLAMI_PREFIX, "GPUPROV_TEST_POLL_SECONDS": "0.2",
                    "GPUPROV_TEST_REBOOT_POLL_SECONDS": "0.25",
                    **({"GPUPROV_ALIBABA_ENDPOINT": self.ecs_url, "ALIBABA_CLOUD_ACCESS_KEY_ID": "testing",
                        "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "testing", "ALIBABA_CLOUD_ECS_METADATA_DISABLED": "true"}
                       if self.alibaba_nodes else {})}

        self.work = self._write_work(h)  # the reader's folder; facts refresh reads the sandbox's sources
        self.env.update(indexsite.env(self.sources), SANDBOX_WORK=str(self.work))
        (self.workdir / "env.sh").write_text(self.exports())
        (self.workdir / "sandbox.json").write_text(json.dumps({
            "pid": os.getpid(), "env": self.env, "nodes": [x.address for x in self.pool.hosts], "hosts": h}, indent=1))

    def _write_work(self, hosts: list[str]) -> Path:
        """The folder the README's examples run in: what a reader brings along, made for the sandbox's hosts
        (the README's inventory, its key the sandbox's; ./code with a script to sync and torchrun)."""
        work = self.workdir / "work"
        (work / "code").mkdir(parents=True)
        (work / "hosts.yml").write_text(f"""# written by `make sandbox`: the README's inventory, for its hosts
defaults: {{user: {LOGIN}, key: {self.key}}}
hosts:
  - host: {hosts[0]}
    name: trainer-a
    gpu: A100-80GB        # checked against what the host reports before anything is installed
  - host: gpu-box         # an alias from the sandbox's ssh config
    proxy_jump: bastion
""")
        (work / "code" / "train.py").write_text(TRAIN_PY)
        return work

    def exports(self) -> str:
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(self.env.items()))


def _seed_dlami(aws: Any) -> str:
    """AWS's public DLAMI parameter, as images.yaml names it, under a prefix of the sandbox's own, naming an
    image of its own (an instance launched from it has the DLAMI's driver loaded)."""
    ami = str(aws.ec2().register_image(
        Name="Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20261006", Architecture="x86_64",
        RootDeviceName="/dev/sda1", VirtualizationType="hvm",
        BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 75, "VolumeType": "gp3"}}])["ImageId"])
    aws.client("ssm").put_parameter(Name=f"{DLAMI_PREFIX}/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
                                    Value=ami, Type="String", DataType="aws:ec2:image")
    return ami


# folders the README's examples write on a node (`sync ./code exp1:/work/code`): each host gets an empty one of its
# own, so nothing lands in this machine's
PRIVATE = ("/work",)


@contextlib.contextmanager
def mount_points(folders: tuple[str, ...]) -> Iterator[None]:
    """The folders each host mounts its own over: one this machine lacks is made (empty) for as long as the
    sandbox runs, and removed after."""
    made = [Path(f) for f in folders if not Path(f).exists()]
    for folder in made:
        folder.mkdir(mode=0o755)
    try:
        yield
    finally:
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()


# a spot price is this share of the on-demand list price, by zone (moto answers $0, which no market does);
# us-east-1a, where the sandbox's subnet is, the cheapest
SPOT_SHARE = (0.31, 0.36, 0.42, 0.38, 0.45, 0.40)


def _seed_spot_prices(aws: Any) -> None:
    """DescribeSpotPriceHistory answers a plausible price for every catalog type with a list price, in every
    zone: a fraction of on-demand, as the spot market's usually is for GPU types."""
    from gpuprov.plan.catalog import load

    zones = sorted(aws.zone_ids("us-east-1"))
    aws.set_spot_prices({(it.name, zone): round(it.price_usd_hour * SPOT_SHARE[i % len(SPOT_SHARE)], 4)
                         for it in load().instance_types if it.price_usd_hour
                         for i, zone in enumerate(zones)})


def _seed_what_the_readme_assumes(aws: Any) -> None:
    """What the README's examples take as made by the user beforehand: the instance profile `ckpt-writer` (an IAM
    admin's, for `up --instance-profile`) and the team's versioned bucket `acme-gpu-state`."""
    aws.client("iam").create_instance_profile(InstanceProfileName="ckpt-writer")
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="acme-gpu-state")
    s3.put_bucket_versioning(Bucket="acme-gpu-state", VersioningConfiguration={"Status": "Enabled"})


def _refuse_a_subnet_in_use(prefix: str) -> None:
    """A /24 this machine already routes (a LAN, a VPN) is not the sandbox's to shadow."""
    out = subprocess.run(["ip", "-4", "route", "show", "to", "match", f"{prefix}.3"], capture_output=True,
                         text=True).stdout
    taken = [line for line in out.splitlines() if line and not line.startswith("default")]
    if taken:
        raise SystemExit(f"sandbox: {prefix}.0/24 is routed here already ({taken[0].strip()}); pass another "
                         "--hosts-subnet (three octets, e.g. 10.99.2)")


# --- the command ----------------------------------------------------------------------------------


def _running(workdir: Path) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = json.loads((workdir / "sandbox.json").read_text())
    except (OSError, ValueError):
        return None
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(int(found["pid"]), 0)
        return found
    return None


def up(args: argparse.Namespace) -> None:
    if _running(args.dir):
        raise SystemExit(f"sandbox: one runs already ({args.dir}); `tools/sandbox.py down` stops it")
    print(f"starting the sandbox in {args.dir}: a local AWS endpoint (moto) and {args.nodes} + 3 SSH hosts "
          "with shimmed GPUs ...", file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    with Sandbox(args.dir, nodes=args.nodes, hosts_subnet=args.hosts_subnet, alibaba_nodes=args.alibaba_nodes) as sandbox:
        print(sandbox.exports(), end="", flush=True)
        print(f"\nthe sandbox runs (Ctrl-C, or `tools/sandbox.py down`, stops it and removes everything). In another "
              f"shell:\n  eval \"$(.venv/bin/python tools/sandbox.py env)\"   # or: . {args.dir}/env.sh\n"
              f"  cd \"$SANDBOX_WORK\"        # {sandbox.work}: hosts.yml (its hosts) and ./code, for the README\n"
              "  gpuprov up try --gpu T4   # then the README's commands, as printed, in order\n"
              f"facts refresh reads the public sources from a local stand-in ({sandbox.sources})\n"
              f"hosts you already have: {LOGIN}@{sandbox.hosts_subnet}.3, .4, .5 (gpu-box = .5, bastion = .3); "
              f"their key: {sandbox.key}"
              + (f"\nAlibaba Cloud: the ECS imitation at {sandbox.ecs_url} (`gpuprov up NAME --cloud alibaba --gpu T4 "
                 f"--subnet vsw-cn-hangzhou-h`; its instances stand at {sandbox.alibaba.hosts[0].address} ...)"
                 if args.alibaba_nodes else ""),
              file=sys.stderr, flush=True)
        while not stop.wait(0.5):
            pass
        print("\nstopping the sandbox ...", file=sys.stderr, flush=True)
    shutil.rmtree(args.dir, ignore_errors=True)
    for config in forget_includes(args.dir, homes()):
        print(f"removed the Include line gpuprov's `up` added to {config} for the sandbox's nodes", file=sys.stderr)
    print("sandbox stopped; nothing is left", file=sys.stderr)


def homes() -> list[Path]:
    """Where a gpuprov pointed at the sandbox may have added its Include: this user's home, and the home of
    the user who ran `sudo make sandbox` (whose other shell ran the README's commands)."""
    import pwd

    found = [Path.home()]
    with contextlib.suppress(KeyError):
        found.append(Path(pwd.getpwnam(os.environ.get("SUDO_USER") or "").pw_dir))
    return list(dict.fromkeys(found))


def forget_includes(workdir: Path, homes: list[Path]) -> list[Path]:
    """Take out of each home's ~/.ssh/config the line gpuprov added naming a file under the sandbox's folder
    (`up` adds `Include STATE/ssh_config` for its nodes' `ssh gpuprov-NAME`); the user's own lines stay."""
    from gpuprov.hosts.sshconfig import MARK

    changed = []
    for home in homes:
        config = home / ".ssh" / "config"
        try:
            text = config.read_text()
        except OSError:
            continue
        ours = (f"Include {workdir}/", f"Include {workdir.resolve()}/")
        kept = [line for line in text.splitlines(keepends=True) if not (line.startswith(ours) and MARK in line)]
        if len(kept) != len(text.splitlines()):
            config.write_text("".join(kept))
            changed.append(config)
    return changed


def env(args: argparse.Namespace) -> None:
    found = _running(args.dir)
    if found is None:
        raise SystemExit(f"sandbox: none runs in {args.dir}; start one with `sudo make sandbox`")
    print("".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(found["env"].items())), end="")


def down(args: argparse.Namespace) -> None:
    found = _running(args.dir)
    if found is None:
        print(f"sandbox: none runs in {args.dir}", file=sys.stderr)
        return
    os.kill(int(found["pid"]), signal.SIGTERM)
    for _ in range(600):
        if _running(args.dir) is None:
            print("sandbox stopped", file=sys.stderr)
            return
        time.sleep(0.1)
    raise SystemExit(f"sandbox: process {found['pid']} did not stop within 60 s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tools/sandbox.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"the sandbox's folder [{DEFAULT_DIR}]")
    sub = parser.add_subparsers(dest="what", required=True)
    start = sub.add_parser("up", help="start it and run until Ctrl-C (what `make sandbox` runs)")
    start.add_argument("--nodes", type=int, choices=range(1, 64), default=16, metavar="N",
                       help="SSH hosts standing for launched instances, 1 to 63 [16]")
    start.add_argument("--hosts-subnet", default="10.1.2", help="the hosts you already have: PREFIX.3-.5 [10.1.2]")
    start.add_argument("--alibaba-nodes", type=int, choices=range(0, 16), default=2, metavar="N",
                       help="SSH hosts standing for the ECS imitation's instances, 0 (no Alibaba Cloud) to 15 [2]")
    sub.add_parser("env", help="print the environment of the sandbox that runs, for eval")
    sub.add_parser("down", help="stop the sandbox that runs")
    args = parser.parse_args(argv)
    {"up": up, "env": env, "down": down}[args.what](args)


@contextlib.contextmanager
def running(workdir: Path, **kw: Any) -> Iterator[Sandbox]:
    """A sandbox for the length of a `with` block (tests/test_readme.py)."""
    with Sandbox(workdir, **kw) as sandbox:
        yield sandbox


if __name__ == "__main__":
    main()
