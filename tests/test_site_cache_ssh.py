"""`bootstrap --cache-host` on real SSH hosts (issue 39 §3): gpuprov starts apt-cacher-ng on one host of the site,
the bootstrapped hosts' downloads come from upstream once through it, and nothing of it is left after. The byte
counts at 1, 8 and 32 hosts are bench/site_cache.py's."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from tests import indexsite
from tests.conftest import skip_or_fail
from tests.test_bootstrap_ssh import addrs, bootstrap, reset

WHEEL = "whl/cu130/gpuprov_probe-1.0-py3-none-any.whl"
UPSTREAM_PORT = 8780  # on the test net's own bridge address


def test_two_hosts_fetch_a_wheel_through_the_cache_host_which_takes_it_upstream_once_and_is_gone_after(
        host_pool, gp_home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not shutil.which("apt-cacher-ng", path="/usr/sbin:/usr/bin"):
        skip_or_fail("needs apt-cacher-ng (tools/sysdeps.sh installs it)")
    pool = host_pool
    reset(pool, [0, 1, 2])
    site = indexsite.build(tmp_path / "site")
    (site / WHEEL).parent.mkdir(parents=True, exist_ok=True)
    (site / WHEEL).write_bytes(b"PK\x05\x06" + bytes(18) + b"gpuprov" * 20_000)
    cache = pool[0].address
    # each host's step reads the wheel through the map the plan gave it: the torch key, on the cache host
    playbook = tmp_path / "fetch.yml"
    playbook.write_text(
        "name: fetch\ndescription: one wheel through the site cache\nstack: none\nenv: null\nsteps:\n"
        "  - name: fetch\n"
        f"    run: curl -sSf -o /tmp/probe.whl http://{cache}:3142/{WHEEL} && echo fetched\n")
    # a port below 32768: apt-cacher-ng 3.7.4 connects to another port for an upstream's above it
    with indexsite.serve(site, host=f"{pool.subnet}.1", port=UPSTREAM_PORT) as (base, requests):
        monkeypatch.setenv("GPUPROV_CONFIG", str(tmp_path / "config.toml"))
        (tmp_path / "config.toml").write_text(f'[sources]\ntorch = "{base}/whl"\n')
        for i in (1, 2):  # the hosts' curl is a shim without network; the cache's URLs go to the real one
            pool.exec_in(i, f"echo 'export GPUPROV_SHIM_CURL_PASSTHROUGH=http://{cache}:3142/' "
                            "> /var/lib/gpuprov-shim/env", check=True)
        try:
            # one host after the other: the second finds the wheel whole in the cache
            code, hosts = bootstrap(pool, [1, 2], "-p", str(playbook), "--cache-host", addrs(pool, [0])[0],
                                    "--parallel", "1")
        finally:
            for i in (1, 2):
                pool.exec_in(i, "rm -f /var/lib/gpuprov-shim/env", check=True)
    assert code == 0, [(h["error"], h["steps"]) for h in hosts]
    assert [p for p, _ in requests].count(f"/{WHEEL}") == 1
    digest = hashlib.sha256((site / WHEEL).read_bytes()).hexdigest()
    for i in (1, 2):
        assert pool.exec_in(i, "sha256sum /tmp/probe.whl", check=True).stdout.split()[0] == digest
    # nothing left on the cache host: its folder, and anything listening on the port
    left = pool.exec_in(0, "ls /var/lib/gpuprov; (exec 3<>/dev/tcp/127.0.0.1/3142) 2>/dev/null && echo listening")
    assert "site-cache" not in left.stdout and "listening" not in left.stdout


@pytest.mark.instant_aws  # EC2's lag is the lifecycle tests' part
def test_up_bootstraps_the_launched_node_through_a_cache_host_and_removes_the_cache_after(
        aws, env, aws_hosts, gp_home, tmp_path: Path) -> None:
    """`up --cache-host` against the EC2 imitation: the node launched onto aws_hosts[0] reads through the proxy
    gpuprov runs on aws_hosts[1] (a host of the site the launch does not touch), as `bootstrap --cache-host`."""
    from tests.aws.cli import gp, launch_site, up_args

    if not shutil.which("apt-cacher-ng", path="/usr/sbin:/usr/bin"):
        skip_or_fail("needs apt-cacher-ng (tools/sysdeps.sh installs it)")
    pool = aws_hosts
    subnet = launch_site(aws, pool, gp_home)  # the node lands on pool[0]
    pool.exec_in(1, "rm -rf /var/lib/gpuprov/*", check=True)
    cache = pool[1].address
    home = Path(env["HOME"]) / ".ssh"  # the cache host as the user's own ssh setup reaches it
    home.mkdir(exist_ok=True)
    (home / "config").write_text(f"Host {cache}\n  User root\n  IdentityFile {pool.key_path}\n")
    (home / "known_hosts").write_text(pool[1].known_hosts_line() + "\n")
    site = indexsite.build(tmp_path / "site")
    (site / WHEEL).parent.mkdir(parents=True, exist_ok=True)
    (site / WHEEL).write_bytes(b"PK\x05\x06" + bytes(18) + b"gpuprov" * 20_000)
    playbook = tmp_path / "fetch.yml"
    playbook.write_text(
        "name: fetch\ndescription: one wheel through the site cache\nstack: none\nenv: null\nsteps:\n"
        "  - name: fetch\n"
        f"    run: curl -sSf -o /tmp/probe.whl http://{cache}:3142/{WHEEL} && echo fetched\n")
    pool.exec_in(0, f"echo 'export GPUPROV_SHIM_CURL_PASSTHROUGH=http://{cache}:3142/' >> /var/lib/gpuprov-shim/env",
                 check=True)
    (tmp_path / "config.toml").write_text(f'[sources]\ntorch = "http://{pool.subnet}.1:{UPSTREAM_PORT}/whl"\n')
    with indexsite.serve(site, host=f"{pool.subnet}.1", port=UPSTREAM_PORT) as (_base, requests):
        result = gp({**env, "GPUPROV_CONFIG": str(tmp_path / "config.toml")},
                    *up_args("cached", "--gpu", "T4", "--connect", "private", "--ssh-user", "root", "--os",
                             "ubuntu-22.04", "--subnet", subnet, "-p", str(playbook), "--cache-host", cache),
                    timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"cache http://{cache}:3142 on {cache}" in result.stderr
    assert [p for p, _ in requests].count(f"/{WHEEL}") == 1
    digest = hashlib.sha256((site / WHEEL).read_bytes()).hexdigest()
    assert pool.exec_in(0, "sha256sum /tmp/probe.whl", check=True).stdout.split()[0] == digest
    left = pool.exec_in(1, "ls /var/lib/gpuprov; (exec 3<>/dev/tcp/127.0.0.1/3142) 2>/dev/null && echo listening")
    assert "site-cache" not in left.stdout and "listening" not in left.stdout
