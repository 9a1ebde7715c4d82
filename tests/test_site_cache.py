"""One download per site (issue 39 §3): the proxy's configuration and the map the hosts get through it
(plan/site_cache.py), pure; the proxy itself is run by bench/site_cache.py and test_site_cache_ssh.py."""

from __future__ import annotations

import re

from gpuprov.plan import sources
from gpuprov.plan.plan import make_host_plan
from gpuprov.plan.site_cache import SiteCache
from gpuprov.plan.stack import StackPins

CACHE = SiteCache("10.9.0.2")


def test_each_key_is_mounted_at_its_own_path_so_the_torch_indexs_absolute_links_stay_on_the_proxy() -> None:
    mounts = {m.key: m for m in CACHE.mounts(sources.ORIGIN)}
    assert mounts["torch"].path == "/whl" and mounts["torch"].backend == "https://download.pytorch.org/whl"
    assert mounts["torch"].url == "http://10.9.0.2:3142/whl"
    assert mounts["uv"].url == "http://10.9.0.2:3142/astral-sh/uv/releases/download"  # uv's pinned releases
    assert not set(sources.OS_KEYS) & set(mounts)  # the host's own OS archive only when the map sets it
    assert mounts["nvidia"].url == "http://10.9.0.2:3142/compute/cuda/repos"
    config = CACHE.config(sources.ORIGIN)
    assert "Remap-gp_torch: /whl ; https://download.pytorch.org/whl\n" in config
    keep = re.search(r"^PfilePatternEx: (.*)$", config, re.M)
    assert keep and re.search(keep.group(1), "/whl/cu128/torch-2.9.0%2Bcu128-cp312-cp312-manylinux_2_28_x86_64.whl")
    assert re.search(keep.group(1), "/astral-sh/uv/releases/download/0.12.21/uv-x86_64-unknown-linux-musl.tar.gz")


def test_a_key_without_a_path_or_inside_another_keys_mount_gets_one_of_its_own() -> None:
    layer = sources.Sources(pypi="https://mirror.test", torch="https://mirror.test/simple/torch-wheels",
                            docker="https://other.test/simple")
    got = {m.key: m for m in CACHE.mounts(sources.effective((layer, "--sources s.yml")))}
    assert got["pypi"].path == "/gpuprov-pypi" and got["pypi"].backend == "https://mirror.test"
    assert got["torch"].path == "/simple/torch-wheels"
    assert got["docker"].path == "/gpuprov-docker/simple"
    paths = [m.path for m in got.values()]
    assert len(set(paths)) == len(paths)


def test_the_plan_through_the_cache_fetches_every_key_from_it_and_says_so() -> None:
    upstream = sources.effective((sources.presets()["cn-tuna"].urls, "--sources cn-tuna"))
    layer = CACHE.layer(upstream)
    plan = make_host_plan("L4", "pytorch", "ubuntu-24.04", StackPins(), sources_flag=layer)
    assert set(plan.sources.mirrored) == set(sources.KEYS)
    rows = plan.step_sources()
    assert rows and all(r["url"].startswith("http://10.9.0.2:3142/") for r in rows)
    assert {r["from"] for r in rows} == {"--cache-host 10.9.0.2"}
    # the mirror keeps its own place behind the proxy: pypi from TUNA, torch from its origin
    assert "Remap-gp_pypi: /simple ; https://pypi.tuna.tsinghua.edu.cn/simple" in CACHE.config(upstream)
    # pip is told to trust the proxy's plain http, and the torch wheel's index is on it
    assert plan.sources.plain_http_hosts == ("10.9.0.2",)
    assert plan.stack and plan.stack.torch and plan.stack.torch.index_url.startswith("http://10.9.0.2:3142/whl/")


def test_a_cache_host_that_a_driver_install_would_reboot_is_refused_before_anything_is_done(tmp_path) -> None:
    from click.testing import CliRunner

    from gpuprov.cli import main

    args = ["bootstrap", "10.9.0.2", "10.9.0.3", "--cache-host", "10.9.0.2", "--gpu", "L4"]
    result = CliRunner().invoke(main, args, env={"GPUPROV_HOME": str(tmp_path)})
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: --cache-host: 10.9.0.2 is bootstrapped too, and its driver install ")
    kept = CliRunner().invoke(main, ["bootstrap", "10.9.0.3", "--keep-cache"], env={"GPUPROV_HOME": str(tmp_path)})
    assert kept.exit_code == 2 and "--keep-cache needs --cache-host HOST" in kept.output


def test_bootstrap_plans_every_host_with_the_caches_map_and_stops_the_cache_after(tmp_path, monkeypatch) -> None:
    """The CLI's wiring, the SSH parts stood in for (tests/test_site_cache_ssh.py runs them for real): the hosts'
    planner gets the cache's layer of the map, and the cache is stopped when the bootstrap ends."""
    from click.testing import CliRunner

    from gpuprov.cli import main
    from gpuprov.hosts import bootstrap as engine
    from gpuprov.hosts import site_cache as hosts_cache

    seen: dict[str, object] = {}

    def start(target, settings, upstream, port):
        seen["upstream"] = upstream
        return hosts_cache.Running(target, CACHE, None, CACHE.layer(upstream))

    def run(targets, settings, plan_for, options, reporter=None):
        seen["planned_with"] = plan_for.sources
        return []

    monkeypatch.setattr(hosts_cache, "start", start)
    monkeypatch.setattr(hosts_cache, "stop", lambda running, keep=False: seen.setdefault("stopped", keep))
    monkeypatch.setattr(engine, "bootstrap", run)
    result = CliRunner().invoke(main, ["bootstrap", "10.9.0.3", "--cache-host", "10.9.0.2", "--sources", "cn-tuna",
                                       "--json"], env={"GPUPROV_HOME": str(tmp_path)})
    assert result.exit_code == 0, result.output
    upstream = seen["upstream"]
    assert isinstance(upstream, sources.Effective) and upstream.pypi == "https://pypi.tuna.tsinghua.edu.cn/simple"
    assert seen["planned_with"] == CACHE.layer(upstream) and seen["stopped"] is False


def _stand_in_cache(monkeypatch, seen: dict[str, object]) -> None:
    """hosts/site_cache.py's start and stop, stood in for (test_site_cache_ssh.py and test_aws_cluster.py run them
    for real), recording what they were given."""
    from gpuprov.hosts import site_cache as hosts_cache

    def start(target, settings, upstream, port):
        seen.update(cache_at=target.host, upstream=upstream, port=port)
        return hosts_cache.Running(target, CACHE, None, CACHE.layer(upstream))

    monkeypatch.setattr(hosts_cache, "start", start)
    monkeypatch.setattr(hosts_cache, "stop", lambda running, keep=False: seen.setdefault("stopped", keep))


def test_up_nodes_bootstraps_every_node_through_the_cache_and_stops_it_when_up_ends(fake_cloud, monkeypatch) -> None:
    """`up --nodes 2 --cache-host`: the cluster is launched with the plan made on the cache's map (each node's
    bootstrap reads it), the proxy started as `bootstrap --cache-host` starts it, and stopped when `up` ends, here
    with an error."""
    from gpuprov.cloud import cluster_up
    from gpuprov.errors import GpuprovError

    seen: dict[str, object] = {}
    _stand_in_cache(monkeypatch, seen)

    def launch(plan, opts, copts, provider, store, say):
        seen.update(plan=plan, nodes=copts.nodes, started_before=("cache_at" in seen))
        raise GpuprovError("stopped by the test after the plan")

    monkeypatch.setattr(cluster_up, "up", launch)
    result = fake_cloud.gp("up", "train", "--gpu", "A10G:4", "--nodes", "2", "--yes", "--ssh-cidr", "198.51.100.7/32",
                           "--cache-host", "root@10.9.0.2", "--cache-port", "3143", "--sources", "cn-tuna")
    assert result.exit_code == 1 and "stopped by the test after the plan" in result.output, result.output
    assert seen["cache_at"] == "10.9.0.2" and seen["port"] == 3143 and seen["started_before"] is True
    upstream = seen["upstream"]
    assert isinstance(upstream, sources.Effective) and upstream.pypi == "https://pypi.tuna.tsinghua.edu.cn/simple"
    plan = seen["plan"]
    assert seen["nodes"] == 2 and plan.instance.name.startswith("g5.")  # the launch's own plan, on the cache's map
    assert set(plan.sources.mirrored) == set(sources.KEYS)  # cn-tuna sets the OS archives too
    assert {r["from"] for r in plan.step_sources()} == {"--cache-host 10.9.0.2"}
    assert plan.stack.torch.index_url.startswith("http://10.9.0.2:3142/whl/")
    assert seen["stopped"] is False
    assert fake_cloud.leftovers()["instances"] == []


def test_up_refuses_a_cache_it_cannot_use_before_asking_the_cloud_anything(fake_cloud) -> None:
    bad = {("--cache-host", "train:0"): "error: --cache-host: train:0 is a node this `up` launches: it does not run",
           ("--cache-host", "10.9.0.2", "--no-bootstrap"): "--cache-host with --no-bootstrap: the nodes download nothing",
           ("--keep-cache",): "--keep-cache needs --cache-host HOST"}
    for extra, said in bad.items():
        result = fake_cloud.gp("up", "train", "--gpu", "A10G:4", "--nodes", "2", "--yes", *extra)
        assert result.exit_code == 2 and said in result.output, (extra, result.output)
    assert fake_cloud.leftovers()["instances"] == []
