"""Issue 25's docker step on the real sshd test hosts, against shims of docker, nvidia-ctk, groupadd and usermod that
refuse what the real ones refuse (tests/shims/bin): `docker run --gpus` fails while the daemon's config, as it read
it at its last start, has no nvidia runtime. One bootstrap of two hosts (the shipped `containers` playbook, which
pins its image by digest), asserting what a user sees:

- a fresh Ubuntu host gets docker.io and NVIDIA's toolkit from its repository, the nvidia runtime in daemon.json (as
  nvidia-ctk writes it), the daemon restarted once for it, the login user in the docker group, the CDI spec; verify
  runs `nvidia-smi -L` in the pinned image with --gpus all; a rerun changes nothing and restarts nothing;
- a host set up as a Deep Learning AMI is (docker-ce, the toolkit, the runtime configured, a CDI spec): the step
  reports unchanged, installs nothing and never restarts the daemon;
- a daemon.json that lost the runtime: `docker run --gpus` fails as the real one does, and the next bootstrap puts
  the runtime back and restarts the daemon once.
"""

from __future__ import annotations

import json
import shlex

import pytest

from gpuprov.plan.spec import load_playbook
from tests.conftest import HOST_ENV, SUDO_USER
from tests.test_bootstrap_ssh import by_step, calls, gpuprov, reset

IMAGE = load_playbook("containers").container_image or ""
UBUNTU = 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n'
RUNTIME = {"args": [], "path": "nvidia-container-runtime"}
FRESH, DLAMI = 3, 4
ROOT = HOST_ENV["GPUPROV_SYSROOT"]


def _sh(pool, i, command: str) -> str:
    return pool.exec_in(i, command, check=True, env=HOST_ENV).stdout


def _dlami(pool, i) -> None:
    """What a Deep Learning AMI ships: Docker's docker-ce and NVIDIA's toolkit installed, the nvidia runtime in
    daemon.json, a CDI spec, the daemon enabled, the login user in the docker group (unverified for real DLAMIs:
    whether their daemon.json names the runtime and their user is in the group was not read; issue 25 says they ship
    Docker and the toolkit)."""
    conf = json.dumps({"runtimes": {"nvidia": RUNTIME}}, indent=4, sort_keys=True)
    spec = 'cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: "0"\n- name: all\n'
    pkgs = "".join(f"{p} {v}\\n" for p, v in (("docker-ce", "5:28.5.1-1~ubuntu.24.04~noble"),
                                                 ("nvidia-container-toolkit", "1.20.1-1"),
                                                 ("nvidia-container-toolkit-base", "1.20.1-1"),
                                                 ("libnvidia-container-tools", "1.20.1-1"),
                                                 ("libnvidia-container1", "1.20.1-1")))
    _sh(pool, i, f"mkdir -p {ROOT}/etc/docker {ROOT}/var/run/cdi /var/lib/gpuprov-shim/enabled && "
                 f"printf %s {shlex.quote(conf)} > {ROOT}/etc/docker/daemon.json && "
                 f"printf %s {shlex.quote(spec)} > {ROOT}/var/run/cdi/nvidia.yaml && "
                 f"printf '{pkgs}' >> /var/lib/gpuprov-shim/installed && touch /var/lib/gpuprov-shim/enabled/docker && "
                 f"printf 'docker:x:988:{SUDO_USER}\n' >> {ROOT}/etc/group")


def _bootstrap(pool, hosts, *extra: str) -> tuple[int, list[dict], str]:
    targets = [f"{SUDO_USER}@{pool[i].address}" for i in hosts]
    result = gpuprov("bootstrap", *targets, "-i", str(pool.key_path), "--accept-new-host-key", "-p", "containers",
                     "--keep-driver", "--connect-timeout", "3", "--json", *extra)
    try:
        return result.returncode, json.loads(result.stdout), result.stderr
    except json.JSONDecodeError:
        pytest.fail(f"bootstrap printed no JSON (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")


def _starts(pool, i) -> int:
    return len(_sh(pool, i, "cat /var/lib/gpuprov-shim/docker-starts 2>/dev/null || true").split())


def _runs(pool, i) -> list[str]:
    return [c for c in calls(pool, i) if c.startswith("docker run")]


def test_docker_step_fresh_and_dlami_and_a_lost_runtime(host_pool, gp_home):
    pool = host_pool
    hosts = [FRESH, DLAMI]
    reset(pool, hosts, GPUPROV_SHIM_GPU="L4", GPUPROV_SHIM_GPU_COUNT="2",
          GPUPROV_SHIM_DRIVER_PREINSTALLED="595.91.07")
    for i in hosts:
        _sh(pool, i, f"install -d -m 0755 {ROOT}/etc && printf %s {shlex.quote(UBUNTU)} > {ROOT}/etc/os-release")
    _dlami(pool, DLAMI)

    code, out, err = _bootstrap(pool, hosts)
    assert code == 0, json.dumps(out, indent=1) + err
    fresh, dlami = out
    assert by_step(fresh) == {"docker": "changed", "verify": "unchanged"}
    assert by_step(dlami) == {"docker": "unchanged", "verify": "unchanged"}
    # the fresh host: engine and toolkit installed from the repositories, the runtime as nvidia-ctk writes it
    installed = calls(pool, FRESH)
    assert any(c.startswith("apt-get") and " install " in f" {c} " and "docker.io" in c for c in installed)
    assert any(c.startswith("apt-get") and "nvidia-container-toolkit" in c for c in installed)
    conf = json.loads(_sh(pool, FRESH, f"cat {ROOT}/etc/docker/daemon.json"))
    assert conf == {"runtimes": {"nvidia": RUNTIME}}
    assert _starts(pool, FRESH) == 2  # docker.io's postinst started it, the step restarted it for the runtime
    group = _sh(pool, FRESH, f"grep '^docker:' {ROOT}/etc/group")
    assert group.strip().split(":")[3].split(",") == [SUDO_USER]
    assert "nvidia.com/gpu=all" in _sh(pool, FRESH, "nvidia-ctk cdi list")
    # verify ran nvidia-smi -L in the pinned image with every GPU
    assert _runs(pool, FRESH) == [f"docker run --rm --gpus all {IMAGE} nvidia-smi -L"]
    # the DLAMI: nothing installed, the daemon never restarted
    assert not [c for c in calls(pool, DLAMI) if c.startswith(("apt-get install", "apt-get -o", "nvidia-ctk runtime"))]
    assert _starts(pool, DLAMI) == 0 and len(_runs(pool, DLAMI)) == 1

    # a rerun changes nothing and restarts nothing: the markers skip the step, and the step itself, run again
    # (--force), finds nothing to do
    code, again, err = _bootstrap(pool, hosts)
    assert code == 0 and [h["status"] for h in again] == ["ok", "ok"], json.dumps(again, indent=1) + err
    code, forced, err = _bootstrap(pool, hosts, "--force")
    assert code == 0 and [by_step(h)["docker"] for h in forced] == ["unchanged", "unchanged"], json.dumps(forced) + err
    assert _starts(pool, FRESH) == 2 and _starts(pool, DLAMI) == 0

    # the runtime lost from daemon.json and the daemon restarted on it: --gpus fails as the real docker does ...
    _sh(pool, FRESH, f"printf '{{}}' > {ROOT}/etc/docker/daemon.json && systemctl restart docker")
    lost = pool.exec_in(FRESH, f"docker run --rm --gpus all {IMAGE} nvidia-smi -L", env=HOST_ENV)
    assert lost.returncode == 125
    assert 'could not select device driver "" with capabilities: [[gpu]]' in lost.stderr
    # ... and the next bootstrap (its marker says done: --force) puts it back, restarting the daemon once
    starts = _starts(pool, FRESH)
    code, fixed, err = _bootstrap(pool, [FRESH], "--force")
    assert code == 0 and by_step(fixed[0])["docker"] == "changed", json.dumps(fixed) + err
    assert _starts(pool, FRESH) == starts + 1
