"""Fake AWS for tests: moto_server (with validation on and Canonical Ubuntu images) behind the fault proxy.

    with AwsEndpoint() as aws:                 # or the pytest fixtures `aws_endpoint` (session) / `aws` (per test)
        aws.reset()                            # fresh moto + proxy, the images' SSM parameters seeded (moto_seeded.py)
        env = aws.env()                        # AWS_ENDPOINT_URL=<proxy>, creds, region, retries, GPUPROV_TEST_UBUNTU_SSM_PREFIX
        aws.faults([{"action": "RunInstances", "match": {"Placement.AvailabilityZone": "us-east-1a"},
                     "status": 500, "code": "InsufficientInstanceCapacity"}])
        aws.realism(fresh_lookups=3)           # the proxy plays EC2's eventual consistency (see "Kinds" below)
        aws.instant()                          # ... or not: moto's instant answers (until the next reset())
        aws.set_spot_prices({("g5.xlarge", "us-east-1a"): 0.45})
        aws.set_quota("L-34B43A08", 64)
        aws.contracts(page_size=2)             # EC2 contracts moto lacks (tests/aws/ec2_contracts.py): pages of 2
        aws.ec2("us-east-1").describe_instances()   # straight to moto, for assertions
        aws.log()                              # every request the tool made through the proxy
        aws.leftovers()                        # {"instances": [...], "security_groups": [...], ...}

In conftest.py:  ``from tests.aws.fixture import aws_endpoint, aws  # noqa: F401``

Kinds: every test starts "realistic" (reset() restores it): like EC2 (developer guide, "Eventual consistency in
the Amazon EC2 API"), resources created *through the proxy* are not there yet for a moment --
  * fresh ids: the first 2 (``fresh_lookups``) requests naming a new instance / security group / key pair / volume
    by id answer its NotFound error (InvalidInstanceID.NotFound, InvalidGroup.NotFound, ...; RunInstances naming a
    fresh group or key too), then requests pass;
  * tag lag: the first 1 (``tag_lag``) tag-filtered Describe that would show it leaves it out.
Resources the fixture makes straight in moto (subnet_for_hosts, aws.ec2() calls) are never fresh.
"instant" = moto's instant, consistent answers: ``aws.instant()`` in a test, or mark the test
``@pytest.mark.instant_aws`` (the ``aws`` fixture honours it). Use it only for tests about something else.
Log entries of realism answers: ``"rule": "fresh", "outcome": "fresh-notfound", "fresh": [ids]`` for a NotFound,
``"hidden": [ids]`` (outcome "forwarded") for a tag-filtered answer with items left out.
A rule with a ``code`` and no ``status`` gets EC2's status for that code (capacity 500, throttling 503, ...).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.aws import fault_proxy

HERE = Path(__file__).resolve().parent
PROXY_SCRIPT = HERE / "fault_proxy.py"
CANONICAL = "099720109477"
REGIONS = ("us-east-1", "us-west-2")
SSM_PREFIX = "/test/canonical/ubuntu/server"
ENDPOINT_ENV_CLEAR = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_REGION",
                      "AWS_CA_BUNDLE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")

# Ubuntu images: (release version, codename) x arch x volume flavour x serial. The newest serial is "current".
RELEASES = {"22.04": "jammy", "24.04": "noble"}
ARCHES = {"amd64": "x86_64", "arm64": "arm64"}
VOLUMES = {"ebs-gp3": "hvm-ssd-gp3", "ebs-gp2": "hvm-ssd"}
SERIALS = ("20260901", "20261101")  # older, current
CURRENT_SERIAL = SERIALS[-1]

QUOTA_NAMES = {
    "L-1216C47A": "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances",
    "L-34B43A08": "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests",
    "L-DB2E81BA": "Running On-Demand G and VT instances",
    "L-3819A6DF": "All G and VT Spot Instance Requests",
    "L-417A185B": "Running On-Demand P instances",
    "L-7212CCBC": "All P4, P3 and P2 Spot Instance Requests",
    "L-C4BD4855": "All P5 Spot Instance Requests",
    "L-0263D0A3": "EC2-VPC Elastic IPs",
}


def _ami_id(release: str, arch: str, vol: str, serial: str) -> str:
    # deterministic 17-hex-digit ids, e.g. ami-0a22040a0300... (stable across runs, unique per image)
    r = release.replace(".", "")
    return f"ami-0{r}{'a' if arch == 'amd64' else 'b'}{'3' if vol == 'ebs-gp3' else '2'}{serial}0"[:21].ljust(21, "0")


def ubuntu_images() -> list[dict[str, Any]]:
    """The image records written to MOTO_AMIS_PATH (they replace moto's canned images in every region)."""
    out = []
    for release, codename in RELEASES.items():
        for arch, march in ARCHES.items():
            for vol, flavour in VOLUMES.items():
                for serial in SERIALS:
                    name = f"ubuntu/images/{flavour}/ubuntu-{codename}-{release}-{arch}-server-{serial}"
                    out.append({
                        "ami_id": _ami_id(release, arch, vol, serial), "state": "available", "public": True,
                        "owner_id": CANONICAL, "image_location": f"{CANONICAL}/{name}", "sriov": "simple",
                        "root_device_type": "ebs", "root_device_name": "/dev/sda1",
                        "description": f"Canonical, Ubuntu, {release} LTS, {arch} {codename} image build on "
                                       f"{serial[:4]}-{serial[4:6]}-{serial[6:]}",
                        "image_type": "machine", "platform": None, "architecture": march, "name": name,
                        "virtualization_type": "hvm", "hypervisor": "xen", "boot_mode": "uefi-preferred",
                        "creation_date": f"{serial[:4]}-{serial[4:6]}-{serial[6:]}T00:00:00.000Z",
                    })
    return out


# The other OSes' public images (data/os.yaml `aws`), as their publishers name them; the SSM parameters under
# PUBLIC_SSM_ROOT, which stands for /aws/service (no one may write under /aws, moto included)
PUBLIC_SSM_ROOT = "/test"
OS_IMAGES = (  # (os, owner, name, creation date, SSM parameter under the root or None, AMI id)
    ("debian-12", "136693071363", "debian-12-amd64-20261110-2290", "2026-11-10", "/debian/release/12/latest/amd64",
     "ami-0de12a0000000000a"),
    ("amzn-2023", "137112412989", "al2023-ami-2023.9.20261104.0-kernel-6.1-x86_64", "2026-11-04",
     "/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64", "ami-0a12023000000000a"),
    # the arm64 images of the OSes whose publishers name an arm64 parameter beside the x86_64 one (issue 40)
    ("debian-12", "136693071363", "debian-12-arm64-20261110-2290", "2026-11-10", "/debian/release/12/latest/arm64",
     "ami-0de12b0000000000b"),
    ("amzn-2023", "137112412989", "al2023-ami-2023.9.20261104.0-kernel-6.1-arm64", "2026-11-04",
     "/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64", "ami-0a12023000000000b"),
    ("rocky-9", "792107900819", "Rocky-9-EC2-Base-9.5-20241118.0.x86_64", "2024-11-18", None, "ami-0ce9500000000000a"),
    ("rocky-9", "792107900819", "Rocky-9-EC2-Base-9.7-20261020.0.x86_64", "2026-10-20", None, "ami-0ce9700000000000a"),
    ("rocky-9", "792107900819", "Rocky-9-EC2-Base-9.7-20261020.0.aarch64", "2026-10-21", None, "ami-0ce9700000000000b"),
    ("rhel-9", "309956199498", "RHEL-9.7.0_HVM-20261015-x86_64-0-Hourly2-GP3", "2026-10-15", None,
     "ami-0e9700000000000aa"),
)


def _arm(name: str) -> bool:
    """An arm64 image by its name, as its publisher names it (…-arm64-…, ….aarch64)."""
    return bool(re.search(r"(?:^|[-.])(?:arm64|aarch64)(?:$|[-.])", name))


def os_images() -> list[dict[str, Any]]:
    return [{"ami_id": ami, "state": "available", "public": True, "owner_id": owner,
             "image_location": f"{owner}/{name}", "sriov": "simple", "root_device_type": "ebs",
             "root_device_name": "/dev/xvda", "description": name, "image_type": "machine", "platform": None,
             "architecture": "arm64" if _arm(name) else "x86_64", "name": name,
             "virtualization_type": "hvm", "hypervisor": "xen", "boot_mode": "uefi-preferred",
             "creation_date": f"{day}T00:00:00.000Z"} for _, owner, name, day, _, ami in OS_IMAGES]


def os_ami(os_name: str, arch: str = "x86_64") -> str:
    """The image `up --os` should pick: the parameter's, else the newest one of the publisher's of that architecture."""
    rows = [r for r in OS_IMAGES if r[0] == os_name and _arm(r[2]) == (arch == "arm64")]
    return max(rows, key=lambda r: r[3])[5]


def ubuntu_ami(release: str = "24.04", arch: str = "amd64", volume: str = "ebs-gp3", serial: str = CURRENT_SERIAL) -> str:
    """AMI id of a seeded image; ``release`` may be "22.04"/"24.04" or "jammy"/"noble"."""
    release = {v: k for k, v in RELEASES.items()}.get(release, release)
    return _ami_id(release, arch, volume, serial)


def ssm_name(release: str = "24.04", arch: str = "amd64", volume: str = "ebs-gp3", prefix: str = SSM_PREFIX) -> str:
    return f"{prefix}/{release}/stable/current/{arch}/hvm/{volume}/ami-id"


def ssm_parameters() -> list[list[str]]:
    """The SSM parameters every reset leaves in each region (moto_seeded.py puts them): Ubuntu's by release
    number and by codename, and the other OSes' public ones, each naming its image."""
    out = []
    for release, codename in RELEASES.items():
        for arch in ARCHES:
            for vol in VOLUMES:
                ami = ubuntu_ami(release, arch, vol)
                out += [[ssm_name(rel, arch, vol), ami] for rel in (release, codename)]
    out += [[PUBLIC_SSM_ROOT + parameter, ami] for _, _, _, _, parameter, ami in OS_IMAGES if parameter]
    return out


def moto_settings(workdir: Path) -> dict[str, str]:
    """moto's settings for this imitation (validation on, the images above in every region instead of moto's
    canned ones), its images file written into `workdir`: for moto_server's environment, or os.environ before the
    in-process mock starts (tests/aws/inprocess.py)."""
    amis = workdir / "amis.json"
    amis.write_text(json.dumps(ubuntu_images() + os_images(), indent=1))
    return {"MOTO_ENABLE_AMI_VALIDATION": "1", "MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION": "1",
            "MOTO_ENABLE_KEYPAIR_VALIDATION": "1", "MOTO_AMIS_PATH": str(amis)}


def tool_env(url: str, workdir: Path) -> dict[str, str]:
    """The AWS environment the tool runs with against an imitation at `url` (the proxy, or the in-process one's
    loopback address), whatever AWS settings the machine has: no profile or config file of the user's is read."""
    return {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_RETRY_MODE": "standard",
        "AWS_MAX_ATTEMPTS": "2",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(workdir / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(workdir / "no-aws-credentials"),
        "GPUPROV_TEST_UBUNTU_SSM_PREFIX": SSM_PREFIX,
        "GPUPROV_TEST_PUBLIC_SSM_ROOT": PUBLIC_SSM_ROOT,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(method: str, url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, data=b"" if method == "POST" else None, method=method),
                                timeout=timeout) as r:
        return r.read()


class AwsEndpoint:
    """moto_server + fault proxy, both subprocesses. ``url`` = proxy (give it to the tool), ``moto_url`` = moto."""

    def __init__(self, regions: tuple[str, ...] = REGIONS, workdir: str | Path | None = None, warm: bool = True) -> None:
        self.regions = tuple(regions)
        self.warm = warm
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="gpuprov-aws-"))
        self.url = ""
        self.moto_url = ""
        self.moto_proc: subprocess.Popen[bytes] | None = None
        self.proxy_proc: subprocess.Popen[bytes] | None = None
        self._zone_ids: dict[str, dict[str, str]] = {}
        self._vpcs: dict[tuple[str, str], str] = {}
        self._clients: dict[tuple[str, str, bool], Any] = {}
        self._session: Any = None
        self.startup_s = 0.0
        self.last_reset_s = 0.0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> AwsEndpoint:
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.moto_url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, **moto_settings(self.workdir))
        seed = self.workdir / "ssm-seed.json"
        seed.write_text(json.dumps({region: ssm_parameters() for region in self.regions}))
        cmd = [sys.executable, str(HERE / "moto_seeded.py"), str(seed)]  # reset() puts them back (moto_seeded.py)
        self._moto_log = open(self.workdir / "moto.log", "wb")  # noqa: SIM115 (closed in stop())
        try:
            self.moto_proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(port)], env=env,
                                              stdout=self._moto_log, stderr=subprocess.STDOUT)
            # the proxy does not need the upstream to be up: start both at once
            self.proxy_proc = subprocess.Popen([sys.executable, str(PROXY_SCRIPT), "0", self.moto_url],
                                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            line = self.proxy_proc.stdout.readline().decode()  # type: ignore[union-attr]
            if not line.startswith("fault_proxy ready "):
                raise RuntimeError(f"fault proxy did not start: {line!r}")
            self.url = line.split()[-1]
            self._wait_moto()
            fault_proxy.wait_ready(self.url)
            if self.warm:  # the first EC2 call per region takes ~1 s (lazy backend load); pay it once here
                for r in self.regions:
                    self.ec2(r).describe_availability_zones()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _wait_moto(self, timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while True:
            if self.moto_proc is not None and self.moto_proc.poll() is not None:
                raise RuntimeError(f"moto_server exited {self.moto_proc.returncode}: "
                                   f"{(self.workdir / 'moto.log').read_text()[-2000:]}")
            try:
                _http("GET", self.moto_url + "/moto-api/", timeout=1)
                return
            except OSError:
                if time.monotonic() > end:
                    raise TimeoutError(f"moto_server not answering on {self.moto_url}") from None
                time.sleep(0.03)

    def stop(self) -> None:
        for p in (self.proxy_proc, self.moto_proc):
            if p is None or p.poll() is not None:
                continue
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if self.proxy_proc is not None and self.proxy_proc.stdout:
            self.proxy_proc.stdout.close()
        if getattr(self, "_moto_log", None):
            self._moto_log.close()
        self.proxy_proc = self.moto_proc = None
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> AwsEndpoint:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Fresh moto state, no proxy rules/log, realistic kind (defaults), Ubuntu AMI parameters seeded in every region."""
        t0 = time.monotonic()
        _http("POST", self.moto_url + "/moto-api/reset")
        fault_proxy.forget_tokens(self.url)
        self.clear_faults()
        self._vpcs.clear()
        self.last_reset_s = time.monotonic() - t0

    def env(self) -> dict[str, str]:
        """Environment for the tool (subprocess or monkeypatched os.environ)."""
        return tool_env(self.url, self.workdir)

    def client(self, service: str, region: str = "us-east-1", via_proxy: bool = False, **kw: Any) -> Any:
        """boto3 client to moto (or to the proxy with ``via_proxy``); one attempt, no retries. Cached unless ``kw``."""
        import boto3
        from botocore.config import Config

        if self._session is None:  # one session: loading the EC2 model per client costs ~0.3 s
            self._session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing")
        key = (service, region, via_proxy)
        if not kw and key in self._clients:
            return self._clients[key]
        cached = not kw
        kw.setdefault("config", Config(retries={"mode": "standard", "total_max_attempts": 1}))
        c = self._session.client(service, region_name=region, endpoint_url=self.url if via_proxy else self.moto_url, **kw)
        if cached:
            self._clients[key] = c
        return c

    def ec2(self, region: str = "us-east-1") -> Any:
        """boto3 EC2 client straight to moto (bypasses the proxy: no faults, not logged)."""
        return self.client("ec2", region)

    # ------------------------------------------------------------------ faults
    def faults(self, rules: list[dict[str, Any]] | dict[str, Any]) -> list[int]:
        """Append fault rules (see fault_proxy's docstring); returns their ids."""
        return fault_proxy.add_rules(self.url, rules)

    def clear_faults(self) -> None:
        """Remove all rules and the request log (held requests get answered); back to realistic, no fresh ids."""
        fault_proxy.clear(self.url)

    def realism(self, kind: str = "realistic", fresh_lookups: int = 2, tag_lag: int = 1,
                token_lag: int = 1) -> dict[str, Any]:
        """How EC2-like the proxy is until the next reset(): "realistic" (eventual consistency for ids created
        through the proxy: ``fresh_lookups`` NotFound answers per fresh id, ``tag_lag`` tag-filtered Describes
        without it, ``token_lag`` client-token-filtered DescribeInstances without a launch) or "instant" (moto as
        is). Budgets apply to resources created after the call. Returns the settings."""
        return fault_proxy.set_kind(self.url, kind=kind, fresh_lookups=fresh_lookups, tag_lag=tag_lag,
                                    token_lag=token_lag)

    def instant(self) -> dict[str, Any]:
        """moto's instant answers: no fresh-id NotFound, no tag lag (until the next reset())."""
        return self.realism("instant")

    def contracts(self, **settings: Any) -> dict[str, Any]:
        """EC2 contracts the proxy keeps (tests/aws/ec2_contracts.py), until the next reset(): ``page_size=N``
        answers the paginated Describe calls in pages of N, ``deregistered_listed``, ``address_limit``. Returns
        the settings and what the proxy learnt (interfaces per instance, fresh profiles, deregistered images)."""
        return fault_proxy.set_contracts(self.url, **settings) if settings else fault_proxy.get_contracts(self.url)

    def capacity(self, **ask: Any) -> dict[str, Any]:
        """Capacity Reservations and Capacity Block offerings the proxy keeps (tests/aws/ec2_capacity.py), until the
        next reset(): ``reservations=[…]``, ``offerings=[…]``, ``advance=SECONDS`` (its clock); returns them all."""
        return fault_proxy.capacity(self.url, ask or None)

    def realism_state(self) -> dict[str, Any]:
        """{"kind", "fresh_lookups", "tag_lag", "known": [{"region", "id", "kind", "fresh", "lag"}...]}"""
        return fault_proxy.get_state(self.url)["realism"]

    def rules(self) -> list[dict[str, Any]]:
        return fault_proxy.get_state(self.url)["rules"]

    def log(self, action: str | None = None) -> list[dict[str, Any]]:
        """Proxied requests in order: {"action", "target", "form", "json", "status", "region", "rule", "held",
        "outcome", "fresh", "hidden", ...} (see fault_proxy's docstring)."""
        entries = fault_proxy.get_state(self.url)["log"]
        return [e for e in entries if action is None or e["action"] == action]

    def release(self) -> int:
        """Answer every held request; returns how many were waiting."""
        return fault_proxy.release(self.url)

    def interrupt(self, instance_id: str, region: str = "us-east-1") -> str:
        """EC2 interrupts a spot instance: a persistent one stops, a one-time one terminates (ec2_spot.py)."""
        return fault_proxy.interrupt(self.url, instance_id, region)

    def wait_held(self, n: int = 1, timeout: float = 10.0) -> None:
        """Block until at least ``n`` requests are being held."""
        end = time.monotonic() + timeout
        while fault_proxy.get_state(self.url)["holding"] < n:
            if time.monotonic() > end:
                raise TimeoutError(f"fewer than {n} held requests after {timeout} s")
            time.sleep(0.02)

    def zone_ids(self, region: str) -> dict[str, str]:
        if region not in self._zone_ids:
            azs = self.ec2(region).describe_availability_zones()["AvailabilityZones"]
            self._zone_ids[region] = {z["ZoneName"]: z["ZoneId"] for z in azs}
        return self._zone_ids[region]

    def set_spot_prices(self, prices: dict[tuple[str, str], float], region: str = "us-east-1") -> None:
        """Canned DescribeSpotPriceHistory for ``region``: one current "Linux/UNIX" row per (instance_type, az).

        The proxy filters the rows by the request's InstanceTypes / ProductDescriptions / AvailabilityZone / Filters.
        Calling it again for the same region replaces the table.
        """
        zid = self.zone_ids(region)
        rows = [{"instance_type": it, "az": az, "price": float(p), "product": "Linux/UNIX", "az_id": zid.get(az)}
                for (it, az), p in prices.items()]
        self.faults({"name": f"spot-prices:{region}", "action": "DescribeSpotPriceHistory", "region": region,
                     "spot_prices": rows})

    def set_quota(self, code: str, value: float, service: str = "ec2", region: str | None = None) -> None:
        """Canned service-quotas GetServiceQuota answer for (service, code) (all regions unless ``region``)."""
        quota = {"ServiceCode": service, "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                 "QuotaArn": f"arn:aws:servicequotas:{region or 'us-east-1'}:123456789012:{service}/{code}",
                 "QuotaCode": code, "QuotaName": QUOTA_NAMES.get(code, code), "Value": float(value), "Unit": "None",
                 "Adjustable": True, "GlobalQuota": False, "QuotaAppliedAtLevel": "ACCOUNT"}
        rule: dict[str, Any] = {"name": f"quota:{service}:{code}:{region}", "target": "ServiceQuotasV20190624.GetServiceQuota",
                                "match": {"ServiceCode": service, "QuotaCode": code}, "body": json.dumps({"Quota": quota})}
        if region:
            rule["region"] = region
        self.faults(rule)

    # ------------------------------------------------------------------ resources
    def subnet_for_hosts(self, cidr: str = "10.220.0.0/24", az: str = "us-east-1a") -> str:
        """VPC (the /16 around ``cidr``) + subnet without public IPs; instances get .4, .5, ... in launch order."""
        region = az[:-1]
        ec2 = self.ec2(region)
        a, b = cidr.split(".")[:2]
        vpc_cidr = f"{a}.{b}.0.0/16"
        vpc = self._vpcs.get((region, vpc_cidr))
        if vpc is None:
            vpc = ec2.create_vpc(CidrBlock=vpc_cidr)["Vpc"]["VpcId"]
            self._vpcs[(region, vpc_cidr)] = vpc
        sub = ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=az)["Subnet"]["SubnetId"]
        return sub

    def leftovers(self, tag_key: str = "gpuprov:node", regions: tuple[str, ...] | None = None) -> dict[str, list[str]]:
        """Every live resource in moto carrying ``tag_key``, by kind (ids; key pairs by name), all test regions."""
        out: dict[str, list[str]] = {"instances": [], "security_groups": [], "key_pairs": [], "volumes": [],
                                     "spot_requests": [], "launch_templates": [], "placement_groups": [],
                                     "addresses": []}
        for region in regions or self.regions:
            for kind, found in tagged_in_moto(self.ec2(region), tag_key).items():
                out[kind] += found
            # moto makes no spot request for RunInstances: the proxy keeps them (tests/aws/ec2_spot.py); a disabled one
            # (its instance stopped) is as live as an open or active one: it would start its instance again
            out["spot_requests"] += [r["id"] for r in fault_proxy.spot_requests(self.url) if r["region"] == region
                                     and tag_key in r["tags"] and r["state"] in ("open", "active", "disabled")]
            # moto has no placement groups: the proxy keeps them (tests/aws/ec2_cluster.py), read without a log entry
            out["placement_groups"] += [g["name"] for g in fault_proxy.placement_groups(self.url)
                                        if g["region"] == region and tag_key in g["tags"]]
        return out


def tagged_in_moto(ec2: Any, tag_key: str = "gpuprov:node") -> dict[str, list[str]]:
    """The live resources moto itself keeps that carry `tag_key`, by kind (ids; key pairs by name), in `ec2`'s
    region: what `leftovers` reads besides the proxy's own spot requests and placement groups."""
    f = [{"Name": "tag-key", "Values": [tag_key]}]
    return {
        "instances": [i["InstanceId"] for res in ec2.describe_instances(Filters=f)["Reservations"]
                      for i in res["Instances"] if i["State"]["Name"] != "terminated"],
        "security_groups": [g["GroupId"] for g in ec2.describe_security_groups(Filters=f)["SecurityGroups"]],
        "key_pairs": [k["KeyName"] for k in ec2.describe_key_pairs(Filters=f)["KeyPairs"]],
        "volumes": [v["VolumeId"] for v in ec2.describe_volumes(Filters=f)["Volumes"]],
        "launch_templates": [t["LaunchTemplateId"] for t in ec2.describe_launch_templates(Filters=f)["LaunchTemplates"]],
        "addresses": [a["AllocationId"] for a in ec2.describe_addresses(Filters=f)["Addresses"]],
    }


def use_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """os.environ as `env` sets it, without the AWS settings of the machine's own that would take precedence
    (a profile, a session token, a service's own endpoint)."""
    for k in ENDPOINT_ENV_CLEAR:
        monkeypatch.delenv(k, raising=False)
    for k in list(os.environ):
        if k.startswith("AWS_ENDPOINT_URL_"):
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


# ---------------------------------------------------------------------- pytest fixtures
_SHARED: list[AwsEndpoint] = []  # one endpoint per process even if several conftests import the fixture


@pytest.fixture(scope="session")
def aws_endpoint() -> Iterator[AwsEndpoint]:
    """moto_server + fault proxy for the whole session (started once per process)."""
    if _SHARED:
        yield _SHARED[0]
        return
    ep = AwsEndpoint()
    ep.start()
    _SHARED.append(ep)
    try:
        yield ep
    finally:
        _SHARED.clear()
        ep.stop()


@pytest.fixture
def aws(aws_endpoint: AwsEndpoint, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> AwsEndpoint:
    """Fresh fake AWS per test, realistic kind (instant if the test is marked ``instant_aws``);
    os.environ points boto3 (and the tool) at the proxy."""
    aws_endpoint.reset()
    if request.node.get_closest_marker("instant_aws") is not None:
        aws_endpoint.instant()
    use_env(monkeypatch, aws_endpoint.env())
    return aws_endpoint
