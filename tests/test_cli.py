"""The commands as a user runs them: real subprocesses for exit codes and stderr, CliRunner for output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuprov.cli import main
from tests import forkcli

ROOT = Path(__file__).resolve().parents[1]


def gpuprov(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "140"}
    return forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True, cwd=cwd, env=env)


def test_gpus_table_lists_every_gpu_with_instance_types_and_prices():
    out = CliRunner().invoke(main, ["gpus"], env={"COLUMNS": "160"}).output
    for needle in ("T4", "V100", "A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100", "H200", "B200",
                   "g4dn.xlarge", "p4d.24xlarge", "p6-b200.48xlarge", "$0.53", "$55.04"):
        assert needle in out


def test_gpus_json():
    data = json.loads(CliRunner().invoke(main, ["gpus", "--json"]).stdout)
    h100 = next(g for g in data["gpus"] if g["name"] == "H100")
    assert h100["compute_capability"] == "9.0"
    assert {it["name"] for it in h100["instance_types"]} == {"p5.4xlarge", "p5.48xlarge"}


def test_plan_picks_cheapest_instance_and_shows_stack_and_steps():
    result = CliRunner().invoke(main, ["plan", "--gpu", "l4", "--spot"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "g6.xlarge" in out and "$0.80/h" in out and "spot" in out
    assert "R595" in out and "nvidia-open" in out and "torch==2.15.*" in out
    assert "kernel-headers" in out and "verify" in out
    assert "fabric manager" not in out.lower()  # g6 has no NVSwitch


def test_plan_count_in_gpu_name_picks_a_multi_gpu_instance():
    data = json.loads(CliRunner().invoke(main, ["plan", "--gpu", "a10g:4", "--json"]).stdout)
    assert data["instance_type"] == "g5.12xlarge"  # cheapest with ≥ 4 A10G
    assert data["count"] == 4
    assert all(c["gpus"] >= 4 for c in data["candidates"])


def test_plan_json_for_nvswitch_instance_has_fabric_manager_step():
    data = json.loads(CliRunner().invoke(main, ["plan", "--gpu", "H100:8", "--json"]).stdout)
    assert data["instance_type"] == "p5.48xlarge"
    assert data["stack"]["fabric_manager"] == "required"
    assert "fabric-manager" in [s["name"] for s in data["steps"]]


def test_plan_prints_unverified_facts():
    out = CliRunner().invoke(main, ["plan", "--gpu", "A10G"], env={"COLUMNS": "200"}).output
    assert "Unverified" in out and "A10G" in out


def test_render_writes_scripts_and_manifest(tmp_path):
    result = gpuprov("render", "--gpu", "T4", "-p", "minimal", "-o", str(tmp_path / "b"))
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    names = [s["name"] for s in manifest["steps"]]
    assert names[0] == "kernel-headers" and names[-1] == "verify" and "pytorch" not in names
    for step in manifest["steps"]:
        script = tmp_path / "b" / step["file"]
        assert script.stat().st_mode & 0o111
        assert len(step["sha256"]) == 64
    assert manifest["gpuprov_plan"]["stack"]["driver_branch"] == 595


@pytest.mark.parametrize(("args", "field", "hint"), [
    (["plan", "--gpu", "A1000"], "--gpu", "A100"),
    (["plan", "--gpu", "H100", "--region", "us-east-9"], "--region", "us-east-1"),
    (["plan", "--gpu", "V100", "--torch-cuda", "cu130"], "--torch-cuda", "cu126"),
    (["plan", "--gpu", "A100", "--driver", "570", "--torch-cuda", "cu130"], "--torch-cuda", "580.65.06"),
    # issue 9: branches without a pinning package, unknown exact releases, nvcc of another CUDA major
    (["plan", "--gpu", "H100", "--driver", "535"], "--driver", "--driver 570"),
    # a GPU's own floor before the missing pinning package (whose minor-compat advice would not help a B200)
    (["plan", "--gpu", "B200", "--driver", "550"], "--driver", "B200 (sm_100) needs driver branch ≥ R570"),
    (["bootstrap", "--gpu", "B200", "--driver", "550", "root@192.0.2.1"], "--driver", "needs driver branch ≥ R570"),
    (["bootstrap", "--driver", "550", "root@192.0.2.1"], "--driver", "nvidia-driver-pinning-550"),  # no GPU known
    (["plan", "--gpu", "H100", "--driver", "580.1.1"], "--driver", "580.126.09"),
    (["plan", "--gpu", "H100", "--driver", "580.95.05"], "--driver", "580.126.09"),
    (["plan", "--gpu", "H100", "--torch-cuda", "cu130", "--cuda", "12.8"], "--cuda", "--cuda 13.0"),
    (["plan", "--gpu", "T4", "-p", "nosuch"], "--playbook", "pytorch"),
    (["plan", "--gpu", "T4", "--os", "centos-7"], "--os", "ubuntu-24.04"),
    (["plan", "--gpu", "T4:0"], "--gpu", "e.g. A100:8"),
    (["plan", "--gpu", "B200:16"], "--gpu", "8"),
    (["render", "--gpu", "T4", "--torch", "9.9", "-o", "x"], "--torch", "2.13"),
    (["up", "x", "--gpu", "T4", "--locked", "--yes"], "--locked", "give --ttl, --budget or --autostop"),
])
def test_bad_input_is_a_short_error_with_exit_2_and_no_traceback(tmp_path, args, field, hint):
    result = gpuprov(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: {field}:")
    assert hint in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) <= 4
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_malformed_playbook_names_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("name: mine\nenv:\n  manager: uv\n  pakages: [numpy]\n")
    result = gpuprov("plan", "--gpu", "T4", "-p", str(bad))
    assert result.returncode == 2
    assert f"{bad}:4" in result.stderr and "env.pakages" in result.stderr
    assert "allowed: manager, path, packages" in result.stderr


def test_broken_yaml_names_the_line(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("name: mine\nenv: [\n")
    result = gpuprov("plan", "--gpu", "T4", "-p", str(bad))
    assert result.returncode == 2 and "not valid YAML" in result.stderr and "Traceback" not in result.stderr


def test_help_explains_commands():
    out = gpuprov("--help").stdout
    for cmd in ("gpus", "plan", "render"):
        assert cmd in out
    assert "--torch-cuda" in gpuprov("plan", "--help").stdout


def test_plan_show_scripts_prints_every_rendered_step():
    data = json.loads(CliRunner().invoke(main, ["plan", "--gpu", "L4", "--json", "--show-scripts"]).stdout)
    names = [s["name"] for s in data["steps"]]
    assert len(data["scripts"]) == len(names)
    for filename, text in data["scripts"].items():
        assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text, filename
    human = CliRunner().invoke(main, ["plan", "--gpu", "L4", "--show-scripts"], env={"COLUMNS": "160"}).output
    assert "01-kernel-headers.sh" in human and "GPUPROV_RESULT" in human


@pytest.mark.parametrize(("gpu", "needles"), [
    # torch 2.15's arch list was carried forward from 2.14's and its cu130 wheels were not read on the index
    ("H100", ["2.15's arch list was not read", "cu130 wheels were not read"]),
    # HGX B200: where ib_umad/mlx5_ib come from on Ubuntu's AWS kernels is not read in a package list
    ("B200", ["linux-modules-extra", "13.2"]),
])
def test_plan_lists_the_unverified_facts_it_relies_on(gpu, needles):
    result = CliRunner().invoke(main, ["plan", "--gpu", gpu, "--json"])
    assert result.exit_code == 0, result.output
    notes = " ".join(json.loads(result.stdout)["unverified"])
    for needle in needles:
        assert needle in notes, (needle, notes)
    human = CliRunner().invoke(main, ["plan", "--gpu", gpu], env={"COLUMNS": "200"}).output
    assert "Unverified facts this plan relies on" in human



@pytest.mark.parametrize(("given", "silence"), [((), 1200.0), (("--step-silence", "30"), 30.0),
                                                (("--step-silence", "0"), None)])
def test_start_bounds_a_silent_step_as_up_and_bootstrap_do(given, silence, gp_home, monkeypatch):
    """`start` bootstraps the node again: --step-silence (default 1200 s, 0 = wait forever) reaches it."""
    from gpuprov.cli import cloud as cli_cloud
    from gpuprov.cloud import stopstart
    from gpuprov.errors import GpuprovError
    from gpuprov.state import open_store

    seen: list[float | None] = []

    def start(name, opts, provider, store, say):
        seen.append(opts.step_silence)
        raise GpuprovError("stopped here by the test")

    monkeypatch.setattr(stopstart, "start", start)
    monkeypatch.setattr(cli_cloud, "store_and_provider", lambda **_: (open_store(), None))
    result = CliRunner().invoke(main, ["start", "day", *given])
    assert seen == [silence], result.output


def test_a_confirmation_with_stdin_closed_asks_for_yes_instead_of_crashing(tmp_path):
    """`up` without --yes run with its stdin closed (`<&-`, a service manager, a CI step): Python's sys.stdin is None,
    and gpuprov used to report its own bug (AttributeError on isatty)."""
    env = {**os.environ, "GPUPROV_HOME": str(tmp_path / "gp"), "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
           "AWS_REGION": "us-east-1"}
    line = f"{sys.executable} -m gpuprov up x --gpu T4 --ssh-cidr 198.51.100.7/32 <&-"
    result = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "error: --yes: no terminal to confirm on" in result.stderr and "hit a bug" not in result.stderr


def test_name_k_of_a_single_node_is_refused_not_sent_to_dns(tmp_path):
    """`exec train:9` where train is one node: NAME:K names a cluster's node K; it went to DNS as host `train`."""
    from gpuprov.state import NodeState
    from gpuprov.state.sqlite import SqliteStore

    home = tmp_path / "gp"
    home.mkdir()
    SqliteStore(home / "state.sqlite").create_node("train", "aws", "us-east-1", state=NodeState.READY,
                                                   address="203.0.113.9", ssh_user="ubuntu")
    env = {**os.environ, "GPUPROV_HOME": str(home)}
    result = forkcli.run([sys.executable, "-m", "gpuprov", "exec", "train:9", "--", "true"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: HOST: train:9: train is a single node, not a cluster"), result.stderr
