"""The config file (~/.config/gpuprov/config.toml, XDG) and `gpuprov config`: flag > environment >
config file > built-in, each value shown with where it came from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forkcli


def run(*args: str, tmp: Path, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPUPROV_", "AWS_")) and k not in ("XDG_CONFIG_HOME", "COLUMNS")}
    env.update({"HOME": str(tmp), "XDG_CONFIG_HOME": str(tmp / "xdg"), "GPUPROV_HOME": str(tmp / "state"),
                "NO_COLOR": "1", "COLUMNS": "200", "AWS_CONFIG_FILE": str(tmp / "no-aws-config"), **env_extra})
    return forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=60)


@pytest.fixture
def configured(tmp_path: Path) -> Path:
    path = tmp_path / "xdg" / "gpuprov" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text('region = "eu-west-1"\ngpu = "L40S"\nplaybook = "minimal"\nautostop = "45m"\nparallel = 7\n')
    return tmp_path


def plan(tmp: Path, *args: str, **env: str) -> dict:
    result = run("plan", "--json", *args, tmp=tmp, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_config_file_sets_defaults_and_flags_and_environment_win(configured: Path) -> None:
    data = plan(configured)
    assert (data["gpu"], data["region"], data["playbook"]) == ("L40S", "eu-west-1", "minimal")
    assert "autostop" in [s["name"] for s in data["steps"]]
    assert plan(configured, GPUPROV_GPU="T4")["gpu"] == "T4"  # environment over the file
    assert plan(configured, "--gpu", "H100", GPUPROV_GPU="T4")["gpu"] == "H100"  # the flag over both
    assert plan(configured, "-p", "pytorch")["playbook"] == "pytorch"
    assert plan(configured, AWS_REGION="us-west-2")["region"] == "us-west-2"  # the AWS chain's env over the file
    said = run("plan", "--json", tmp=configured).stderr
    assert f"region eu-west-1 (from config file {configured}/xdg/gpuprov/config.toml)" in said
    assert "GPUPROV_PARALLEL; default: 7]" in " ".join(run("check", "--help", tmp=configured).stdout.split())


def test_config_shows_each_value_and_where_it_came_from(configured: Path) -> None:
    result = run("config", "--json", tmp=configured, GPUPROV_PLAYBOOK="cuda-dev")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    by_key = {s["key"]: (s["value"], s["source"]) for s in data["settings"]}
    assert by_key["gpu"] == ("L40S", f"config file ({data['path']})")
    assert by_key["playbook"] == ("cuda-dev", "environment (GPUPROV_PLAYBOOK)")
    assert by_key["ssh_cidr"][1] == "built-in" and by_key["parallel"] == (7, f"config file ({data['path']})")
    assert data["path"] == str(configured / "xdg" / "gpuprov" / "config.toml") and data["exists"]
    table = run("config", tmp=configured).stdout
    assert "L40S" in table and "config file" in table and "built-in" in table
    assert run("config", "--path", tmp=configured).stdout.strip() == data["path"]


def test_without_a_config_file_the_built_ins_apply(tmp_path: Path) -> None:
    data = json.loads(run("config", "--json", tmp=tmp_path).stdout)
    assert not data["exists"]
    assert {s["key"]: s["source"] for s in data["settings"]}["region"] == "default"
    assert run("plan", tmp=tmp_path).returncode == 2  # no GPU anywhere: --gpu is required


@pytest.mark.parametrize(("text", "words"), [
    ("gpu = [", "not valid TOML"),
    ("bogus = 1\n", "bogus: unknown key"),
    ("parallel = 0\n", "parallel: Input should be greater than or equal to 1"),
    ("autostop = \"soon\"\n", "autostop: 'soon' is not a duration"),
])
def test_a_broken_config_file_is_named_and_help_still_works(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "xdg" / "gpuprov" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    for command in (["plan"], ["config"], ["status"]):
        result = run(*command, tmp=tmp_path)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.startswith(f"error: config: {path}: ") and words in result.stderr, result.stderr
    assert run("--help", tmp=tmp_path).returncode == 0
    assert run("plan", "--help", tmp=tmp_path).returncode == 0


def test_the_ssh_config_key_is_every_reaching_commands_ssh_config(tmp_path: Path) -> None:
    """`make sandbox` names its own ssh config (gpu-box, bastion) in the config file, not in ~/.ssh/config."""
    ssh_config = tmp_path / "sandbox_ssh_config"
    ssh_config.write_text("Host gpu-box\n  HostName 127.0.0.1\n  Port 1\n")
    path = tmp_path / "xdg" / "gpuprov" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text(f'ssh_config = "{ssh_config}"\n')
    result = run("check", "gpu-box", "--connect-timeout", "2", tmp=tmp_path)
    assert "no node called" not in result.stderr  # a Host of that ssh config, so not a typo
    assert "connection refused on port 1" in result.stdout + result.stderr
    path.write_text('ssh_config = "~/nope"\n')
    missing = run("check", "gpu-box", tmp=tmp_path)
    assert missing.returncode == 2 and f"error: {path}:1: ssh_config: " in missing.stderr


def test_config_shows_the_keys_for_where_new_nodes_go(tmp_path: Path) -> None:
    path = tmp_path / "xdg" / "gpuprov" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text('subnet = "subnet-0123456789abcdef0"\nconnect = "private"\nssh_user = "root"\nos = "ubuntu-22.04"\n'
                    'python = "3.11"\n')
    data = json.loads(run("config", "--json", tmp=tmp_path).stdout)
    by_key = {s["key"]: s["value"] for s in data["settings"]}
    assert {k: by_key[k] for k in ("subnet", "connect", "ssh_user", "os", "python")} == {
        "subnet": "subnet-0123456789abcdef0", "connect": "private", "ssh_user": "root", "os": "ubuntu-22.04",
        "python": "3.11"}
    planned = plan(tmp_path, "--gpu", "t4")
    assert (planned["os"], planned["stack"]["python"]) == ("ubuntu-22.04", "3.11")
    path.write_text('os = "windows-11"\n')
    bad = run("plan", "--gpu", "t4", tmp=tmp_path)
    assert bad.returncode == 2 and "os: 'windows-11' is not an OS gpuprov supports" in bad.stderr
