"""`bootstrap --offline DIR` sends the bundle to a real sshd host (the pool's) before its steps: over SFTP, only the
files the host lacks or holds changed, and the host's copy read back against the manifest.

What a user would notice: a rerun sends nothing it sent before (a cut transfer resumes); a file damaged on the host
is sent again, and only it; the host's /var/lib/gpuprov/offline ends holding the bundle file for file; through the
command, a host whose plan the bundle serves gets it and its steps run, and one whose plan it does not (another OS)
fails at its plan, naming why, with nothing sent.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from gpuprov.hosts.offline import push
from gpuprov.hosts.remote import HostSettings, Remote
from gpuprov.plan import offline
from gpuprov.plan.inventory import Target
from tests.test_bootstrap_ssh import gpuprov, reset


def _bundle(folder: Path, os_name: str = "ubuntu-24.04", playbook: str = "minimal") -> offline.Manifest:
    files = {"nvidia/ubuntu2404/x86_64/InRelease": b"signed index", "nvidia/ubuntu2404/x86_64/a_1_amd64.deb": b"a" * 70_000,
             "wheels/torch-2.15.0+cu132-cp312-cp312-manylinux_2_28_x86_64.whl": b"wheel", "installers/uv-install.sh": b"uv"}
    items = []
    for path, body in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(body)
        items.append(offline.Item(kind="index", name=Path(path).name, path=path, size=len(body), source="test",
                                  sha256=hashlib.sha256(body).hexdigest()))
    manifest = offline.Manifest(plan=offline.Served(os=os_name, arch="x86_64", gpu="L4", playbook=playbook,
                                                    python=None, family="apt", repo="nvidia/ubuntu2404/x86_64"),
                                items=tuple(items))
    (folder / offline.MANIFEST).write_text(manifest.model_dump_json())
    return manifest


def test_the_bundle_is_sent_once_resumed_file_by_file_and_read_back(host_pool, gp_home, tmp_path: Path) -> None:
    pool = host_pool
    manifest = _bundle(tmp_path / "bundle")
    total = sum(i.size for i in manifest.items)
    remote = Remote(Target(host=pool[0].address, user="root", port=pool[0].port, key=str(pool.key_path)),
                    HostSettings(known_hosts=tmp_path / "known_hosts", accept_new_host_key=True))
    remote.open()
    notes: list[str] = []
    try:
        assert push(remote, tmp_path / "bundle", manifest, notes.append) == total
        assert push(remote, tmp_path / "bundle", manifest, notes.append) == 0  # nothing sent twice
        damaged = "nvidia/ubuntu2404/x86_64/a_1_amd64.deb"
        pool.exec_in(0, f"printf x >> {offline.OFFLINE_DIR}/{damaged}")
        notes.clear()
        assert push(remote, tmp_path / "bundle", manifest, notes.append) == 70_000
        assert [n for n in notes if "sending" in n] == [f"offline: sending {damaged} (70000 bytes)"]
    finally:
        remote.close()
        held = pool.exec_in(0, f"cd {offline.OFFLINE_DIR} && sha256sum {' '.join(i.path for i in manifest.items)}; "
                               f"rm -rf {offline.OFFLINE_DIR}").stdout
    assert {line.split()[1]: line.split()[0] for line in held.splitlines()} == {i.path: i.sha256 for i in manifest.items}


def test_bootstrap_offline_sends_the_bundle_before_the_steps_and_refuses_a_host_it_does_not_serve(
        host_pool, gp_home, tmp_path: Path) -> None:
    """One run over two hosts: the one whose plan the bundle serves gets it and its steps; the other (its inventory
    says another OS) fails at its plan, naming why, with nothing sent to it."""
    pool = host_pool
    reset(pool, [0, 1])
    playbook = tmp_path / "bare.yml"  # no GPU stack, no env: what the bundle serves is its OS and CPU
    playbook.write_text("name: bare\nstack: none\nenv: null\n")
    manifest = _bundle(tmp_path / "bundle", os_name="ubuntu-22.04", playbook="bare")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(f"defaults: {{user: root, key: {pool.key_path}}}\nhosts:\n"
                         f"  - {{host: {pool[0].address}, port: {pool[0].port}, name: served}}\n"
                         f"  - {{host: {pool[1].address}, port: {pool[1].port}, name: other, os: ubuntu-24.04}}\n")
    result = gpuprov("bootstrap", "--inventory", str(inventory), "--accept-new-host-key", "--os", "ubuntu-22.04",
                     "--connect-timeout", "3", "-p", str(playbook), "--offline", str(tmp_path / "bundle"), "--json")
    served, other = json.loads(result.stdout)
    assert result.returncode == 1 and served["status"] in ("ok", "changed"), result.stdout + result.stderr
    assert other["failed_step"] == "plan", other
    assert "the bundle is for ubuntu-22.04 x86_64 hosts, the plan for ubuntu-24.04 x86_64" in other["error"]
    assert pool.exec_in(1, f"test -e {offline.OFFLINE_DIR}").returncode != 0  # nothing was sent there
    held = pool.exec_in(0, f"cd {offline.OFFLINE_DIR} && sha256sum {' '.join(i.path for i in manifest.items)}; "
                           f"rm -rf {offline.OFFLINE_DIR}").stdout
    assert {line.split()[1]: line.split()[0] for line in held.splitlines()} == {i.path: i.sha256 for i in manifest.items}


def test_a_login_that_is_not_root_sends_the_bundle_into_place_as_root(host_pool, gp_home, tmp_path: Path) -> None:
    """`--ssh-user` not root, with sudo (as `ubuntu` on EC2): the bundle goes over SFTP into the login's home, then
    into /var/lib/gpuprov/offline with sudo, owned by root (the login cannot change what is installed from it) and
    no second copy left in the home; a rerun reads what is in place and sends nothing."""
    from tests.conftest import SUDO_USER

    pool = host_pool
    manifest = _bundle(tmp_path / "bundle")
    pool.exec_in(2, f"rm -rf {offline.OFFLINE_DIR} ~{SUDO_USER}/.gpuprov-offline", check=True)
    remote = Remote(Target(host=pool[2].address, user=SUDO_USER, port=pool[2].port, key=str(pool.key_path)),
                    HostSettings(known_hosts=tmp_path / "known_hosts", accept_new_host_key=True))
    remote.open()
    try:
        assert push(remote, tmp_path / "bundle", manifest, lambda _: None) == sum(i.size for i in manifest.items)
        assert push(remote, tmp_path / "bundle", manifest, lambda _: None) == 0
    finally:
        remote.close()
        owners = pool.exec_in(2, f"find {offline.OFFLINE_DIR} -printf '%u %p\\n'; ls -A ~{SUDO_USER}").stdout
        held = pool.exec_in(2, f"cd {offline.OFFLINE_DIR} && sha256sum {' '.join(i.path for i in manifest.items)}; "
                               f"rm -rf {offline.OFFLINE_DIR} ~{SUDO_USER}/.gpuprov-offline").stdout
    assert {line.split()[1]: line.split()[0] for line in held.splitlines()} == {i.path: i.sha256 for i in manifest.items}
    listed = [line.partition(" ") for line in owners.splitlines()]
    in_place = [who for who, _, path in listed if path.startswith(offline.OFFLINE_DIR)]
    assert len(in_place) > len(manifest.items) and set(in_place) == {"root"}, owners
    assert ".gpuprov-offline" not in owners  # the login's home holds no second copy
