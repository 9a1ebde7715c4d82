"""An aarch64 host end to end over real SSH (issue 40): a GH200 test host whose shims say aarch64 (`uname -m`) and
whose sysroot holds Grace's cpuinfo and SoC id is bootstrapped from its facts alone: planned for aarch64, its
driver from NVIDIA's sbsa repository, rebooted and verified."""

from __future__ import annotations

import shlex

from tests.test_arm import GRACE_CPUINFO
from tests.test_bootstrap_ssh import bootstrap, reset

HOST = 5


def test_a_gh200_host_is_bootstrapped_for_aarch64_from_its_own_facts(host_pool, gp_home) -> None:  # type: ignore[no-untyped-def]
    pool = host_pool
    reset(pool, [HOST], GPUPROV_SHIM_GPU="GH200")
    root = "/var/lib/gpuprov-shim/root"  # the host's sysroot (conftest.HOST_ENV)
    pool.exec_in(HOST, f"mkdir -p {root}/proc {root}/sys/devices/soc0; printf %s {shlex.quote(GRACE_CPUINFO)} > "
                       f"{root}/proc/cpuinfo; echo jep106:036b:0241 > {root}/sys/devices/soc0/soc_id", check=True)
    code, hosts = bootstrap(pool, [HOST], "--playbook", "minimal")
    assert code == 0, hosts
    (host,) = hosts
    assert host["status"] == "changed", host
    steps = {s["name"]: s["outcome"] for s in host["steps"]}
    assert steps["nvidia-driver"] == "reboot" and "verify" in steps  # installed, rebooted, verified
    assert [c["name"] for c in host["report"]["checks"] if not c["ok"]] == []
    assert host["report"]["gpus"][0]["name"] == "NVIDIA GH200 480GB"
    assert pool.exec_in(HOST, "cat /var/lib/gpuprov-shim/nvidia-repo").stdout.strip() == "ubuntu2204/sbsa"
    assert pool.exec_in(HOST, "uname -m").stdout.strip() == "aarch64"
