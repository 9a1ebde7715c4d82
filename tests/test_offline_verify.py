"""The air-gapped path end to end, as a user runs it (issue 39's "an offline bootstrap of a host with no route out
passes verify"): `gpuprov bundle --offline` on the connected machine from the stand-in origins, `gpuprov bootstrap
HOST --offline DIR` of a real sshd test host whose network namespace has no route to them, then `gpuprov check HOST`.

The host (one of the pool's) reaches the controller's bridge address alone, which its SSH link needs: its on-link
route to the test hosts' subnet is replaced by a route to that one address, and the stand-in origins are served on
another address of the bridge, which a host of the pool with its route fetches from and this one cannot. The shims
are told the host has no route out (GPUPROV_SHIM_OFFLINE=1), so none of them stands in for the internet either:
curl is the real one for every URL, `apt-get update` of a repository on the network fails as apt does, Ubuntu's
archive serves no package, and uv fails at any index. An offline step that reached out would fail the bootstrap.

What runs from the bundle and what is a shim:
- nvidia-driver: the bundle's cuda-keyring .deb (a real one, the test's signing key pinned as NVIDIA's) read with
  the real curl from file://, its key checked with the real gpg against the pinned fingerprints, unpacked under the
  sysroot by the dpkg shim with the real dpkg-deb; its list pointed at the bundle's copy; the apt shims read that
  copy as apt reads a flat repository (InRelease verified with the real gpgv, Packages.gz by its signed sha256,
  each .deb by the index's sha256 before it is "installed"; the candidates are the bundle index's packages). The
  install itself and the kernel module are the shims' (a real apt from a bundle: test_real_apt.py's chroot).
- kernel-headers: the host image has them (an air-gapped host must: the OS archive is out of its reach), written
  into the shims' package list.
- python-env: uv read out of the bundle's uv wheel by the host's real python3; that wheel's uv is the test shim.
  The host's own Python 3.x (no Python build installed from the bundle).
- pytorch: the uv shim installs torch from the bundle's wheels/ only (--no-index, the wheel found there), as the
  fake torch of tests/shims/pylib.
- verify and `check`: the nvidia-smi and torch shims, as every host test.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuprov.cli import main
from gpuprov.plan import offline
from tests.offlinerepo import REPO, Deb, Signer, keyring_deb, python_release, served, simple_index, wheel, write
from tests.shimrun import LOCAL_PYTHON
from tests.test_bootstrap_ssh import calls, reset
from tests.test_offline import pinned, signer  # noqa: F401  (fixtures)

HOST = 5  # the pool's host this test cuts off
TORCH = "2.15.0+cu132"  # the L4's pytorch plan: torch 2.15 for cu132
UV_SCRIPT = '#!/bin/sh\n# uv (gpuprov test shim): tests/shims/libexec/uv\nexec gpuprov-shim-uv "$@"\n'


def _origins(site: Path, key: Signer) -> None:
    """The stand-in origins of what the L4's pytorch plan downloads: NVIDIA's repository (R595's pinning package,
    two releases of nvidia-open, one dependency NVIDIA carries and one the OS does, Fabric Manager), the PyTorch wheel index's
    cu132 torch for this Python, PyPI's uv, and python-build-standalone's release."""
    version = "595.91.07-0ubuntu1"
    write(site / "repos" / REPO, [
        Deb("cuda-keyring", "1.1-1", keyring_deb(key.public), arch="all"),
        Deb("nvidia-driver-pinning-595", "1.0-1", b"pin", arch="all"),
        Deb("nvidia-open", "595.58.03-0ubuntu1", b"older"),
        Deb("nvidia-open", version, b"driver", depends=f"libnvidia-compute-595 (= {version}), libc6 (>= 2.34)"),
        Deb("libnvidia-compute-595", version, b"library"),
        Deb("nvidia-fabricmanager", "595.91.07-1", b"fm"),  # bundled for a host that turns out to have NVSwitch
    ], key)
    tag = f"cp{LOCAL_PYTHON.replace('.', '')}-cp{LOCAL_PYTHON.replace('.', '')}-manylinux_2_28_x86_64"
    simple_index(site / "whl" / "cu132", {"torch": [wheel("torch", TORCH, tag=tag, requires=("filelock",))],
                                          "filelock": [wheel("filelock", "3.20.0", tag="py3-none-any")]})
    simple_index(site / "simple", {"uv": [wheel("uv", "0.9.9", tag="py3-none-manylinux_2_17_x86_64",
                                                scripts={"uv": UV_SCRIPT})]})
    python_release(site / "pbs", LOCAL_PYTHON)


@contextlib.contextmanager
def _cut_off(pool, i: int, origin: str) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """Host i routes to the controller's bridge address alone; `origin` (another address) is put on the bridge for
    the stand-in origins. Both as they were after."""
    host, ns = pool[i].address, pool[i].name
    link, controller = f"{pool.subnet}.0/24", f"{pool.subnet}.1"

    def ip(*args: str, check: bool = True) -> None:
        subprocess.run(["ip", *args], check=check, capture_output=True)

    ip("addr", "add", f"{origin}/32", "dev", pool.bridge)
    try:
        ip("-n", ns, "route", "del", link)
        try:
            ip("-n", ns, "route", "add", controller, "dev", "eth0", "scope", "link")
            yield
        finally:
            ip("-n", ns, "route", "del", controller, check=False)
            ip("-n", ns, "route", "add", link, "dev", "eth0", "proto", "kernel", "scope", "link", "src", host)
    finally:
        ip("addr", "del", f"{origin}/32", "dev", pool.bridge, check=False)


def test_an_offline_bootstrap_of_a_host_with_no_route_out_passes_verify(
        host_pool, gp_home, pinned: Signer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        request: pytest.FixtureRequest) -> None:
    """bundle, bootstrap --offline and check, each through the CLI in this process (the test's key is pinned as
    NVIDIA's here, so the driver step rendered here checks it)."""
    pool = host_pool
    reset(pool, [HOST], GPUPROV_SHIM_GPU="L4", GPUPROV_SHIM_OFFLINE="1")
    request.addfinalizer(lambda: reset(pool, [HOST]))  # the next test of the pool finds a host with no bundle
    kernel = pool.exec_in(HOST, "uname -r", check=True).stdout.strip()
    pool.exec_in(HOST, f"echo 'linux-headers-{kernel} 1.0-1' >> /var/lib/gpuprov-shim/installed", check=True)
    _origins(tmp_path / "site", pinned)
    origin_address = f"{pool.subnet}.250"
    target = f"root@{pool[HOST].address}"
    ssh = ["-i", str(pool.key_path), "--accept-new-host-key", "--connect-timeout", "3"]
    plan = ["--gpu", "L4", "--os", "ubuntu-24.04", "-p", "pytorch", "--python", LOCAL_PYTHON]
    with _cut_off(pool, HOST, origin_address), served(tmp_path / "site", host=origin_address) as base:
        index = f"{base}/repos/{REPO}/InRelease"
        # the origins answer a host of the site with a route to them, and not this one
        assert pool.exec_in(HOST + 1, f"/usr/bin/curl -fsS -o /dev/null {index}").returncode == 0
        unreached = pool.exec_in(HOST, f"/usr/bin/curl -sS --max-time 3 -o /dev/null {index}; "
                                       f"ip route get {origin_address}")
        assert "curl: (7) Failed to connect" in unreached.stderr, unreached.stderr
        assert "Network is unreachable" in unreached.stderr, unreached.stderr  # no route, not a refusal

        monkeypatch.setenv("UV_PYTHON_INSTALL_MIRROR", f"{base}/pbs/")
        where = tmp_path / "sources.yml"
        where.write_text(yaml.safe_dump({"nvidia": f"{base}/repos", "torch": f"{base}/whl", "pypi": f"{base}/simple"}))
        made = CliRunner().invoke(main, ["bundle", "--offline", *plan, "--sources", str(where),
                                         "-o", str(tmp_path / "bundle")])
        assert made.exit_code == 0, made.output
        # what the host must have already, said where there is still a network
        assert "(not bundled): libc6, linux-headers for the host's running kernel (step kernel-headers)" in made.output

        done = CliRunner().invoke(main, ["bootstrap", target, *ssh, *plan[2:], "--reboot-timeout", "30",
                                         "--offline", str(tmp_path / "bundle"), "--json"])
        assert done.exit_code == 0, done.output
        host = json.loads(done.stdout)[0]
        assert host["status"] == "changed", host
        steps = {s["name"]: s["outcome"] for s in host["steps"]}
        assert steps["nvidia-driver"] == "reboot" and steps["pytorch"] == "changed" and steps["verify"] == "unchanged"

        checked = CliRunner().invoke(main, ["check", target, *ssh, "--json"])
    assert checked.exit_code == 0, checked.output
    report = json.loads(checked.stdout)[0]
    assert report["ok"], [c for c in report["report"]["checks"] if not c["ok"]]
    assert report["report"]["torch"]["version"] == TORCH and report["report"]["torch"]["cuda"] == "13.2"
    assert report["report"]["gpus"][0]["driver_version"] == "595.91.07"  # the bundle's, not the shims' own data

    # what the host read: the bundle, never the network
    made_calls = calls(pool, HOST)
    fetched = [c for c in made_calls if c.startswith("curl ")]
    assert fetched and all(f"file://{offline.OFFLINE_DIR}/" in c for c in fetched), fetched
    assert [c for c in made_calls if c.startswith("apt-get ") and " update" in c] == [
        "apt-get -q update -o Dir::Etc::SourceList=/var/lib/gpuprov-shim/root/etc/apt/sources.list.d/"
        "cuda-ubuntu2404-x86_64.list -o Dir::Etc::SourceParts=- -o APT::Get::List-Cleanup=0"]
