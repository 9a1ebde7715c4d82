"""The sources map (plan/sources.py, issue 39 §1): presets as shipped data, precedence flag > playbook > config >
origin key by key, a bad value blamed on where it came from, `plan` naming each step's source, and no rendered
script holding a host that is not in the map, for every shipped playbook on every OS."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov.errors import UserInputError
from gpuprov.plan import render, sources
from gpuprov.plan.compat import StackConflict
from gpuprov.plan.plan import NodeRequest, make_host_plan, make_plan
from gpuprov.plan.spec import load_sources, shipped_playbooks
from gpuprov.plan.stack import SUPPORTED_OS, StackPins
from tests.test_config import plan, run

SHELLCHECK = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
# every key on a host of its own, so a script's URL says which key it came from
MIRROR = sources.Sources(**{k: f"https://{k.replace('_', '-')}.mirror.test/base" for k in sources.KEYS})
# what a rendered step may name besides the map: EC2's metadata address (guards)
NOT_DOWNLOADS = {"169.254.169.254"}
# what lib.sh names in every step behind MIRROR: pip's index, Ubuntu's archive (read before apt's first update)
IN_EVERY_STEP = {"pypi.mirror.test", "ubuntu.mirror.test", "ubuntu-ports.mirror.test"}


def _hosts(text: str) -> set[str]:
    # a repository file's origin, named only to be swapped for its mirror, is no download
    text = "\n".join(line for line in text.splitlines() if "gp_rebase_list " not in line)
    return {m for m in re.findall(r"https?://([A-Za-z0-9.-]+)", text)} - NOT_DOWNLOADS


def test_every_preset_validates_and_says_where_each_url_was_confirmed() -> None:
    shipped = sources.presets()
    assert {"cn-aliyun", "cn-aliyun-vpc", "cn-tuna", "cn-ustc"} <= set(shipped)
    for name, preset in shipped.items():
        named = {k for k in sources.KEYS if getattr(preset.urls, k)}
        assert named and named == set(preset.verified), name
        assert all(note.startswith(("verified:", "unverified:")) for note in preset.verified.values()), name


def test_layers_set_only_their_keys_and_the_highest_wins() -> None:
    config = sources.Sources(pypi="https://config.test/simple", docker="https://config.test/docker")
    playbook = sources.Sources(pypi="https://playbook.test/simple/")
    flag = sources.Sources(torch="https://flag.test/whl")
    got = sources.effective((config, "config"), (playbook, "pb.yml:3: sources"), (flag, "--sources f.yml"))
    assert got.pypi == "https://playbook.test/simple"  # a trailing slash is dropped
    assert got.origins["pypi"] == "pb.yml:3: sources" and got.docker == "https://config.test/docker"
    assert got.torch == "https://flag.test/whl" and got.origins["nvidia"] == "default"
    assert got.rebase("https://download.pytorch.org/whl/cu128") == "https://flag.test/whl/cu128"
    assert set(got.mirrored) == {"pypi", "docker", "torch"}


@pytest.mark.parametrize("text, where", [
    ("pypi: ftp://x.test/simple\n", "s.yml:1"),
    ("pypi: https://x.test/simple\nnvida: https://y.test\n", "s.yml:2"),
    ("torch: \"https://x.test/whl; rm -rf /\"\n", "s.yml:1"),
])
def test_a_bad_sources_file_is_blamed_on_its_line(tmp_path: Path, text: str, where: str) -> None:
    (tmp_path / "s.yml").write_text(text)
    with pytest.raises(UserInputError) as exc:
        load_sources(str(tmp_path / "s.yml"))
    assert exc.value.field == "--sources" and where in exc.value.problem


def test_through_the_cli_flag_over_playbook_over_config(tmp_path: Path) -> None:
    conf = tmp_path / "xdg" / "gpuprov" / "config.toml"
    conf.parent.mkdir(parents=True)
    conf.write_text('[sources]\npypi = "https://config.test/simple"\nuv = "https://config.test/uv.sh"\n')
    pb = tmp_path / "pb.yml"
    pb.write_text("name: pb\nenv:\n  packages: [numpy]\nsources:\n  uv: https://playbook.test/uv.sh\n")
    got = {(r["step"], r["key"]): (r["url"], r["from"]) for r in plan(tmp_path, "--gpu", "L4", "-p", str(pb),
                                                                      "--sources", "cn-tuna")["sources"]}
    assert got[("packages", "pypi")] == ("https://pypi.tuna.tsinghua.edu.cn/simple", "--sources cn-tuna")
    assert got[("python-env", "uv")] == ("https://playbook.test/uv.sh", f"{pb}:4: sources")
    assert got[("pytorch", "torch")][1] == "default"
    assert got[("nvidia-driver", "nvidia")] == ("https://developer.download.nvidia.com/compute/cuda/repos", "default")
    shown = run("plan", "--gpu", "L4", "-p", str(pb), tmp=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"packages\s+pypi\s+https://config\.test/simple", shown.stdout) and "[sources]" in shown.stdout
    conf.write_text('[sources]\npypi = "pypi.org"\n')
    bad = run("plan", "--gpu", "L4", tmp=tmp_path)
    assert bad.returncode == 2 and "config.toml: sources.pypi" in bad.stderr and "Traceback" not in bad.stderr
    conf.unlink()
    bad = run("plan", "--gpu", "L4", "--sources", "cn-nowhere", tmp=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --sources: 'cn-nowhere' is neither a preset")


def _mirrored_bundles() -> dict[str, render.Bundle]:
    shared = render.environment()
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render, "environment", lambda: shared)
        for os_name in SUPPORTED_OS:
            for pb in shipped_playbooks():
                for gpu in ("H100:8", "L4"):
                    try:
                        p = make_plan(NodeRequest(gpu=gpu, os=os_name, playbook=pb, docker=True, jupyter=True, sources=MIRROR))
                    except (StackConflict, UserInputError):
                        continue
                    out[f"{gpu}/{os_name}/{pb}"] = p.bundle()
            conda = make_host_plan("L4", "cuda-dev", os_name, StackPins(), sources_flag=(MIRROR, "--sources m"))
            out[f"host/{os_name}"] = conda.bundle()
    return out


def test_no_rendered_script_names_a_host_outside_the_map(tmp_path: Path) -> None:
    bundles = _mirrored_bundles()
    allowed = sources.effective((MIRROR, "--sources")).hosts()
    seen: set[str] = set()
    for key, bundle in bundles.items():
        for script in bundle.scripts:
            hosts = _hosts(script.text)
            assert hosts <= allowed, (key, script.name, hosts - allowed)
            seen |= hosts
    # every key is fetched by some step (no shipped playbook takes conda or data: entries: Miniforge's, the conda
    # channels' and the AWS CLI's are test_a_conda_env_reads_its_channels_from_the_map's and
    # test_behind_a_mirror_the_aws_cli_is_the_pinned_release_from_the_map's); the repository files a mirror copies are
    # read from it
    assert seen == allowed - {"miniforge.mirror.test", "conda.mirror.test", "awscli.mirror.test"}
    assert any("gp_rebase_list \"$list\"" in s.text for b in bundles.values() for s in b.scripts)
    # the mirrored renders are shellcheck-clean: the steps that download, once per package family and Amazon Linux
    # (test_templates checks the rest, which a mirror leaves as they are)
    assert SHELLCHECK
    unique = {s.sha256: s for key, b in bundles.items() for s in b.scripts
              if s.name in sources.STEP_KEYS and key.split("/")[1] in ("ubuntu-24.04", "rocky-9")}
    paths = []
    for i, s in enumerate(unique.values()):
        paths.append(tmp_path / f"{i}-{s.filename}")
        paths[-1].write_text(s.text)
    result = subprocess.run([SHELLCHECK, "-S", "warning", "-f", "gcc", *map(str, paths)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[:4000]


def test_with_no_map_set_the_scripts_are_the_origins_as_before() -> None:
    default = make_plan(NodeRequest(gpu="L4", docker=True)).bundle()
    hosts = set().union(*(_hosts(s.text) for s in default.scripts))
    assert hosts <= sources.ORIGIN.hosts()
    assert not any("gp_rebase_list" in s.text or "PIP_INDEX_URL" in s.text for s in default.scripts)


def _function(script: str, name: str) -> str:
    start = script.index(f"{name}() {{")
    return script[start:script.index("\n}\n", start) + 3]


def test_a_mirror_that_serves_another_signing_key_is_refused_naming_it(tmp_path: Path) -> None:
    """gp_pinned_key with the real gpg: NVIDIA's pinned fingerprint refuses a key a mirror made, naming the source."""
    gpg = shutil.which("gpg")
    assert gpg, "gpg is not installed"
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {"GNUPGHOME": str(home), "PATH": "/usr/bin:/bin"}
    subprocess.run([gpg, "--batch", "--passphrase", "", "--quick-gen-key", "mirror <m@mirror.test>", "ed25519",
                    "sign", "never"], env=env, check=True, capture_output=True)
    (tmp_path / "key.asc").write_bytes(subprocess.run([gpg, "--armor", "--export"], env=env, check=True,
                                                      capture_output=True).stdout)
    listed = subprocess.run([gpg, "--with-colons", "--list-keys"], env=env, check=True, capture_output=True, text=True)
    own = next(line.split(":")[9] for line in listed.stdout.splitlines() if line.startswith("fpr:"))
    driver = next(s.text for s in make_plan(NodeRequest(gpu="L4", sources=MIRROR)).bundle().scripts
                  if s.name == "nvidia-driver")
    nvidia = " ".join(sources.pinned_keys()["nvidia"])
    assert f'gp_pinned_key "$key" "$keyring_url" {nvidia}' in driver
    lib = 'gp_die() { echo "DIED: $*"; exit 1; }\n' + _function(driver, "gp_pinned_key")

    def check(*fingerprints: str) -> subprocess.CompletedProcess[str]:
        call = f'gp_pinned_key {tmp_path / "key.asc"} https://nvidia.mirror.test/base/key.deb {" ".join(fingerprints)}'
        return subprocess.run(["bash", "-c", lib + call], env=env, capture_output=True, text=True)

    refused = check(*sources.pinned_keys()["nvidia"])
    assert refused.returncode == 1
    assert f"DIED: https://nvidia.mirror.test/base/key.deb served the signing key {own}, not the origin's" in refused.stdout
    assert check(own, *sources.pinned_keys()["nvidia"]).returncode == 0


def test_a_changed_installer_is_refused_naming_the_source(tmp_path: Path) -> None:
    """Miniforge comes pinned by release and sha256: the python-env step downloads that release from the map's
    `miniforge`, and a file of another sha256 is refused, naming where it came from, and never run."""
    pb = tmp_path / "conda.yml"
    pb.write_text("name: conda\nenv:\n  manager: conda\n")
    step = next(s.text for s in make_plan(NodeRequest(gpu="L4", playbook=str(pb), sources=MIRROR)).bundle().scripts
                if s.name == "python-env")
    pinned = sources.installers()["miniforge"]
    assert f'url="https://miniforge.mirror.test/base/{pinned.version}/$installer"' in step
    assert f"x86_64) want_sha={pinned.sha256['x86_64']} ;;" in step
    (tmp_path / "installer.sh").write_text("echo a mirror's own installer\n")
    lib = 'gp_die() { echo "DIED: $*"; exit 1; }\n' + _function(step, "gp_sha256")
    source = f"https://miniforge.mirror.test/base/{pinned.version}/Miniforge3-{pinned.version}-Linux-x86_64.sh"
    refused = subprocess.run(["bash", "-c", lib + f'gp_sha256 {tmp_path / "installer.sh"} {source} '
                              f'{pinned.sha256["x86_64"]}'], capture_output=True, text=True)
    assert refused.returncode == 1
    assert f"DIED: {source} served a file of sha256 " in refused.stdout
    assert f"not the pinned {pinned.sha256['x86_64']}: refused, not run" in refused.stdout


def test_a_node_replanned_after_up_keeps_the_sources_up_was_given() -> None:
    """start and a resize plan a node again from its record: the --sources given to `up` still decides, as the plan
    recorded each step's source."""
    from gpuprov.cloud.stopstart import _sources_flag

    recorded = make_plan(NodeRequest(gpu="L4", sources=sources.Sources(torch="https://t.test/whl"),
                                     sources_from="--sources t.yml")).summary()
    again = _sources_flag(recorded)
    assert again["sources"] == sources.Sources(torch="https://t.test/whl")
    assert _sources_flag(make_plan(NodeRequest(gpu="L4")).summary()) == {}


def test_a_repository_file_that_names_the_origin_is_read_from_the_mirror(tmp_path: Path) -> None:
    driver = next(s.text for s in make_plan(NodeRequest(gpu="L4", sources=MIRROR)).bundle().scripts
                  if s.name == "nvidia-driver")
    lib = "gp_log() { :; }\n" + _function(driver, "gp_rebase_list")
    listed = tmp_path / "cuda-ubuntu2404-x86_64.list"
    origin = sources.DEFAULTS.nvidia
    listed.write_text(f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {origin}/ubuntu2404/x86_64/ /\n")
    run = subprocess.run(["bash", "-c", lib + f'gp_rebase_list {listed} {origin} {MIRROR.nvidia}; echo "$GP_CHANGED"'],
                         capture_output=True, text=True, check=True)
    assert listed.read_text() == ("deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
                                  f"{MIRROR.nvidia}/ubuntu2404/x86_64/ /\n")
    assert run.stdout == "1\n"


def test_a_conda_env_reads_its_channels_from_the_map(tmp_path: Path) -> None:
    pb = tmp_path / "conda.yml"
    pb.write_text("name: conda\nenv:\n  manager: conda\n")
    step = next(s.text for s in make_plan(NodeRequest(gpu="L4", playbook=str(pb), sources=MIRROR)).bundle().scripts
                if s.name == "python-env")
    assert "--override-channels -c https://conda.mirror.test/base/conda-forge" in step
    assert _hosts(step) - IN_EVERY_STEP == {"miniforge.mirror.test", "conda.mirror.test"}
    origin = next(s.text for s in make_plan(NodeRequest(gpu="L4", playbook=str(pb))).bundle().scripts
                  if s.name == "python-env")
    assert "--override-channels" not in origin  # Miniforge's own channels, as before
    shown = {(r["step"], r["key"]) for r in make_plan(NodeRequest(gpu="L4", playbook=str(pb))).step_sources()}
    assert {("python-env", "miniforge"), ("python-env", "conda")} <= shown and ("python-env", "uv") not in shown


# EPEL 9's epel.repo as epel-release lays it down (its first and testing sections; the debug and source ones alike)
EPEL_REPO = """[epel]
name=Extra Packages for Enterprise Linux $releasever - $basearch
# It is much more secure to use the metalink, but if you wish to use a local mirror
# place its address here.
#baseurl=https://download.example/pub/epel/$releasever/Everything/$basearch/
metalink=https://mirrors.fedoraproject.org/metalink?repo=epel-$releasever&arch=$basearch&infra=$infra&content=$contentdir
enabled=1
gpgcheck=1
gpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-EPEL-$releasever

[epel-debuginfo]
#baseurl=https://download.example/pub/epel/$releasever/Everything/$basearch/debug/
metalink=https://mirrors.fedoraproject.org/metalink?repo=epel-debug-$releasever&arch=$basearch
enabled=0
"""


def test_epel_is_read_from_the_map_and_its_release_package_checked_against_epels_key(tmp_path: Path) -> None:
    """On Rocky the driver step's EPEL repository files are pointed at the map's `epel` (Fedora's layout under it);
    on RHEL the release package comes from there too, installed only signed by EPEL's pinned key."""
    scripts = {os_name: next(s.text for s in make_plan(NodeRequest(gpu="L4", os=os_name, sources=MIRROR)).bundle()
                             .scripts if s.name == "nvidia-driver") for os_name in ("rocky-9", "rhel-9")}
    epel = sources.pinned_keys()["epel"]
    assert "gp_dnf_install epel-release" in scripts["rocky-9"] and "RPM-GPG-KEY-EPEL" not in scripts["rocky-9"]
    rhel = scripts["rhel-9"]
    assert 'epel_key_url="https://epel.mirror.test/base/RPM-GPG-KEY-EPEL-$(rpm -E %rhel)"' in rhel
    assert f'gp_pinned_key "$epel_key.gpuprov-tmp" "$epel_key_url" {" ".join(epel)}' in rhel
    assert ("gp_dnf_install --setopt=localpkg_gpgcheck=1 https://epel.mirror.test/base/epel-release-latest-9.noarch.rpm"
            in rhel)
    repo = tmp_path / "epel.repo"
    repo.write_text(EPEL_REPO)
    lib = "gp_log() { echo \"LOG: $*\"; }\n" + _function(scripts["rocky-9"], "gp_repo_baseurl")
    call = f'gp_repo_baseurl {repo} https://epel.mirror.test/base; echo "changed=${{GP_CHANGED:-0}}"'
    first = subprocess.run(["bash", "-c", lib + call], capture_output=True, text=True, check=True)
    text = repo.read_text()
    assert "baseurl=https://epel.mirror.test/base/$releasever/Everything/$basearch/\n" in text
    assert "baseurl=https://epel.mirror.test/base/$releasever/Everything/$basearch/debug/\n" in text
    assert "\nmetalink=" not in text and "#metalink=https://mirrors.fedoraproject.org/" in text
    assert "gpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-EPEL-$releasever" in text  # EPEL's key, as it was
    assert first.stdout.endswith("changed=1\n")
    again = subprocess.run(["bash", "-c", lib + call], capture_output=True, text=True, check=True)
    assert again.stdout == "changed=0\n" and repo.read_text() == text
    shown = {(r["step"], r["key"]) for r in make_plan(NodeRequest(gpu="L4", os="rocky-9")).step_sources()}
    assert ("nvidia-driver", "epel") in shown
    shown = {(r["step"], r["key"]) for r in make_plan(NodeRequest(gpu="L4", os="ubuntu-24.04")).step_sources()}
    assert ("nvidia-driver", "epel") not in shown


def test_behind_a_mirror_the_aws_cli_is_the_pinned_release_from_the_map(tmp_path: Path) -> None:
    """The data steps' AWS CLI: the snap store at the origin (as before), the pinned release from the map's `awscli`
    behind a mirror; a file of another sha256 is refused, naming the source, and never run."""
    pb = tmp_path / "data.yml"
    pb.write_text("name: data\nstack: none\nenv: null\ndata:\n  - from: s3://my-data/datasets/x\n    to: /data/x\n"
                  "  - from: /work/ckpt\n    to: s3://my-ckpt/run1\n    when: stop\n")
    mirrored = make_plan(NodeRequest(gpu="L4", playbook=str(pb), sources=MIRROR))
    fetch = next(s.text for s in mirrored.bundle().scripts if s.name == "data-fetch")
    pinned = sources.installers()["awscli"]
    assert _hosts(fetch) - IN_EVERY_STEP == {"awscli.mirror.test"}
    assert f'url="https://awscli.mirror.test/base/awscli-exe-linux-$(uname -m)-{pinned.version}.zip"' in fetch
    assert {("data-fetch", "awscli"), ("data-save", "awscli")} <= {(r["step"], r["key"]) for r in mirrored.step_sources()}
    origin = make_plan(NodeRequest(gpu="L4", playbook=str(pb)))
    assert "awscli-exe" not in next(s.text for s in origin.bundle().scripts if s.name == "data-fetch")
    assert not [r for r in origin.step_sources() if r["key"] == "awscli"]  # the snap store, not the map
    # the host: no aws anywhere, and a mirror serving its own zip
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "curl").write_text('#!/bin/sh\nwhile [ "$1" != -o ]; do shift; done\necho not-aws > "$2"\n')
    (bin_dir / "curl").chmod(0o755)
    lib = ('gp_die() { echo "DIED: $*"; exit 1; }\ngp_log() { :; }\ngp_retry() { shift; "$@"; }\n'
           + _function(fetch, "gp_need_aws") + "gp_need_aws\n")
    run = subprocess.run(["bash", "-c", lib], capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    arch = subprocess.run(["uname", "-m"], capture_output=True, text=True, check=True).stdout.strip()
    source = f"https://awscli.mirror.test/base/awscli-exe-linux-{arch}-{pinned.version}.zip"
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"DIED: {source} served a file of sha256 " in run.stdout
    assert f"not the pinned {pinned.sha256[arch]}: refused, not run" in run.stdout


def test_uv_is_its_pinned_release_and_a_changed_archive_is_refused(tmp_path: Path) -> None:
    """uv comes as its release archive from the map's `uv`, pinned by sha256 (data/sources.yaml; the tests' facts
    folder pins the test hosts' stand-in the way a newer release would be: installers.yaml); a file of another sha256
    is refused, naming the source, and never unpacked."""
    step = next(s.text for s in make_plan(NodeRequest(gpu="L4", sources=MIRROR)).bundle().scripts
                if s.name == "python-env")
    pinned = sources.installers()["uv"]
    assert f'url="https://uv.mirror.test/base/{pinned.version}/$uv_release.tar.gz"' in step
    assert f"aarch64) want_sha={pinned.sha256['aarch64']} ;;" in step
    assert step.index('gp_sha256 "$tmp/$uv_release.tar.gz" "$url" "$want_sha"') < step.index("tar -xzf")
    shipped = sources._shipped_installers()["uv"]
    assert shipped.version == pinned.version and set(shipped.sha256) == {"x86_64", "aarch64"}
    (tmp_path / "uv.tar.gz").write_bytes(b"a mirror's own uv\n")
    lib = 'gp_die() { echo "DIED: $*"; exit 1; }\n' + _function(step, "gp_sha256")
    source = f"https://uv.mirror.test/base/{pinned.version}/uv-x86_64-unknown-linux-musl.tar.gz"
    refused = subprocess.run(["bash", "-c", lib + f'gp_sha256 {tmp_path / "uv.tar.gz"} {source} '
                              f'{shipped.sha256["x86_64"]}'], capture_output=True, text=True)
    assert refused.returncode == 1
    assert f"DIED: {source} served a file of sha256 " in refused.stdout
    assert f"not the pinned {shipped.sha256['x86_64']}: refused, not run" in refused.stdout


def test_a_bad_installers_overlay_is_blamed_on_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPROV_FACTS_DIR", str(tmp_path))
    assert sources.installers() == sources._shipped_installers()  # none: the shipped pins
    (tmp_path / "installers.yaml").write_text("uv:\n  version: 0.13.0\n  sha256: {x86_64: nothex}\n  source: me\n")
    with pytest.raises(UserInputError) as exc:
        sources.installers()
    assert exc.value.field == f"{tmp_path / 'installers.yaml'}: uv.sha256.x86_64"
    (tmp_path / "installers.yaml").write_text("pip: {}\n")
    with pytest.raises(UserInputError, match="pip is not a pinned installer"):
        sources.installers()


UBUNTU_2404 = """Types: deb
URIs: http://us-east-1.ec2.archive.ubuntu.com/ubuntu/
Suites: noble noble-updates noble-backports
Components: main restricted universe multiverse
Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg

Types: deb
URIs: http://security.ubuntu.com/ubuntu/
Suites: noble-security
Components: main restricted universe multiverse
Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg
"""
UBUNTU_2204_ARM = "deb http://ports.ubuntu.com/ubuntu-ports/ jammy main restricted\n"
ROCKY_REPO = """[baseos]
name=Rocky Linux $releasever - BaseOS
mirrorlist=https://mirrors.rockylinux.org/mirrorlist?arch=$basearch&repo=BaseOS-$releasever$rltype
#baseurl=http://dl.rockylinux.org/$contentdir/$releasever/BaseOS/$basearch/os/
gpgcheck=1
gpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-Rocky-9
"""


def test_the_os_archive_is_read_from_the_map_only_when_set(tmp_path: Path) -> None:
    """Ubuntu's archive (EC2's regional copy and security alike, the deb822 and one-line files) and Rocky's own
    repositories are read from the map's ubuntu, ubuntu_ports and rocky; left as the image has them when unset."""
    ubuntu = next(s.text for s in make_plan(NodeRequest(gpu="L4", os="ubuntu-24.04", sources=MIRROR)).bundle().scripts
                  if s.name == "nvidia-driver")
    root = tmp_path / "root"
    (root / "etc/apt/sources.list.d").mkdir(parents=True)
    (root / "etc/apt/sources.list.d/ubuntu.sources").write_text(UBUNTU_2404)
    (root / "etc/apt/sources.list").write_text(UBUNTU_2204_ARM)
    (root / "etc/apt/sources.list.d/cuda.list").write_text("deb https://nvidia.mirror.test/base/ubuntu2404/x86_64/ /\n")
    lib = "gp_log() { :; }\n" + _function(ubuntu, "gp_os_archive")
    run = subprocess.run(["bash", "-c", lib + f'GP_ROOT={root}; gp_os_archive; echo "changed=${{GP_CHANGED:-0}}"'],
                         capture_output=True, text=True, check=True)
    assert run.stdout == "changed=1\n"
    text = (root / "etc/apt/sources.list.d/ubuntu.sources").read_text()
    assert text == UBUNTU_2404.replace("http://us-east-1.ec2.archive.ubuntu.com/ubuntu/", "https://ubuntu.mirror.test/base/") \
        .replace("http://security.ubuntu.com/ubuntu/", "https://ubuntu.mirror.test/base/")  # Ubuntu's keyring kept
    assert (root / "etc/apt/sources.list").read_text() == "deb https://ubuntu-ports.mirror.test/base/ jammy main restricted\n"
    assert "nvidia.mirror.test" in (root / "etc/apt/sources.list.d/cuda.list").read_text()  # not Ubuntu's: left
    again = subprocess.run(["bash", "-c", lib + f'GP_ROOT={root}; gp_os_archive; echo "changed=${{GP_CHANGED:-0}}"'],
                           capture_output=True, text=True, check=True)
    assert again.stdout == "changed=0\n"
    assert ubuntu.index("  gp_os_archive\n") < ubuntu.index("gp_retry 5 gp_locked apt-get -q update")
    rocky = next(s.text for s in make_plan(NodeRequest(gpu="L4", os="rocky-9", sources=MIRROR)).bundle().scripts
                 if s.name == "kernel-headers")
    assert 'for repo_file in "${GP_ROOT}"/etc/yum.repos.d/[Rr]ocky*.repo; do\n  gp_repo_baseurl "$repo_file" ' \
           "https://rocky.mirror.test/base\n" in rocky
    repo = tmp_path / "rocky.repo"
    repo.write_text(ROCKY_REPO)
    lib = "gp_log() { :; }\n" + _function(rocky, "gp_repo_baseurl")
    subprocess.run(["bash", "-c", lib + f"gp_repo_baseurl {repo} https://rocky.mirror.test/base"], check=True)
    assert "baseurl=https://rocky.mirror.test/base/$releasever/BaseOS/$basearch/os/\n" in repo.read_text()
    assert "\n#mirrorlist=" in repo.read_text() and "gpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-Rocky-9" in repo.read_text()
    # shown where they apply, and only when set
    rows = {(r["step"], r["key"]) for r in make_plan(NodeRequest(gpu="L4", os="rocky-9", sources=MIRROR)).step_sources()}
    assert ("kernel-headers", "rocky") in rows and not {k for _, k in rows} & {"ubuntu", "ubuntu_ports"}
    rows = {(r["step"], r["key"]) for r in make_plan(NodeRequest(gpu="L4", os="ubuntu-24.04", sources=MIRROR)).step_sources()}
    assert ("nvidia-driver", "ubuntu") in rows and not {k for _, k in rows} & {"rocky", "ubuntu_ports"}
    plain = make_plan(NodeRequest(gpu="L4", os="ubuntu-24.04")).bundle().scripts
    assert not any("gp_os_archive" in s.text for s in plain)
    assert not {k for r in make_plan(NodeRequest(gpu="L4")).step_sources() for k in [r["key"]]} & set(sources.OS_KEYS)
