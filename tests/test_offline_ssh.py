"""`bootstrap --offline DIR` sends the bundle to a real sshd host (the pool's) before its steps: over SFTP, only the
files the host lacks or holds changed, and the host's copy read back against the manifest.

What a user would notice: a rerun sends nothing it sent before (a cut transfer resumes); a file damaged on the host
is sent again, and only it; the host's /var/lib/gpuprov/offline ends holding the bundle file for file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from gpuprov.hosts.offline import push
from gpuprov.hosts.remote import HostSettings, Remote
from gpuprov.plan import offline
from gpuprov.plan.inventory import Target


def _bundle(folder: Path) -> offline.Manifest:
    files = {"nvidia/ubuntu2404/x86_64/InRelease": b"signed index", "nvidia/ubuntu2404/x86_64/a_1_amd64.deb": b"a" * 70_000,
             "wheels/torch-2.15.0+cu132-cp312-cp312-manylinux_2_28_x86_64.whl": b"wheel", "installers/uv-install.sh": b"uv"}
    items = []
    for path, body in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(body)
        items.append(offline.Item(kind="index", name=Path(path).name, path=path, size=len(body), source="test",
                                  sha256=hashlib.sha256(body).hexdigest()))
    manifest = offline.Manifest(plan=offline.Served(os="ubuntu-24.04", arch="x86_64", gpu="L4", playbook="minimal",
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
