"""Shell completion: the scripts `gpuprov completion SHELL` prints, and bash completing commands, node
names, GPU names and playbooks through them (Click's protocol: COMP_WORDS / COMP_CWORD)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov.plan.stack import SUPPORTED_OS
from tests import forkcli

BIN = Path(sys.executable).parent


def env_for(tmp: Path) -> dict[str, str]:
    return {**os.environ, "GPUPROV_HOME": str(tmp / "state"), "PATH": f"{BIN}:{os.environ['PATH']}",
            "XDG_CONFIG_HOME": str(tmp / "xdg")}


@pytest.fixture
def with_node(tmp_path: Path) -> Path:
    os.environ["GPUPROV_HOME"] = str(tmp_path / "state")
    try:
        from gpuprov.state import open_store

        open_store().create_node("train", "aws", "us-east-1", state="ready", address="203.0.113.9", ssh_user="ubuntu")
    finally:
        del os.environ["GPUPROV_HOME"]
    return tmp_path


@pytest.mark.parametrize(("shell", "marker"), [("bash", "complete -o nosort -F _gpuprov_completion gpuprov"),
                                               ("zsh", "#compdef gpuprov"), ("fish", "complete --no-files --command gpuprov")])
def test_completion_scripts_are_printed(tmp_path: Path, shell: str, marker: str) -> None:
    result = forkcli.run([sys.executable, "-m", "gpuprov", "completion", shell], capture_output=True, text=True,
                         env=env_for(tmp_path))
    assert result.returncode == 0 and marker in result.stdout and "_GPUPROV_COMPLETE" in result.stdout


def bash_complete(tmp: Path, line: str) -> list[str]:
    """What bash offers for the last word of `line`, through the script gpuprov prints."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    words = line.split(" ")
    script = (f'eval "$(gpuprov completion bash)"\n'
              f'COMP_WORDS=({" ".join(repr(w) for w in words)})\nCOMP_CWORD={len(words) - 1}\n'
              '_gpuprov_completion gpuprov\nprintf "%s\\n" "${COMPREPLY[@]}"\n')
    result = subprocess.run(["bash", "--norc", "-c", script], capture_output=True, text=True, env=env_for(tmp), timeout=60)
    assert result.returncode == 0, result.stderr
    return [w for w in result.stdout.splitlines() if w]


def test_bash_completes_commands_nodes_gpus_and_playbooks(with_node: Path) -> None:
    assert bash_complete(with_node, "gpuprov mon") == ["monitor"]
    assert set(bash_complete(with_node, "gpuprov d")) == {"doctor", "down"}
    assert bash_complete(with_node, "gpuprov ssh tr") == ["train"]
    assert bash_complete(with_node, "gpuprov down ") == ["train"]
    assert bash_complete(with_node, "gpuprov plan --gpu h") == ["H100", "H200"]
    assert bash_complete(with_node, "gpuprov gpus a100") == ["A100-40GB", "A100-80GB"]
    assert bash_complete(with_node, "gpuprov up x -p ll") == ["llm-finetune"]
    assert "jupyter" in bash_complete(with_node, "gpuprov bootstrap -p ")
    assert "--accept-new-host-key" in bash_complete(with_node, "gpuprov check --acc")


def test_bash_completes_the_values_of_os_region_driver_torch_and_torch_cuda(with_node: Path) -> None:
    assert bash_complete(with_node, "gpuprov plan --os ") == list(SUPPORTED_OS)
    assert bash_complete(with_node, "gpuprov plan --region us-w") == ["us-west-1", "us-west-2"]
    assert bash_complete(with_node, "gpuprov gc --region eu-west-") == ["eu-west-1", "eu-west-2", "eu-west-3"]
    assert "580" in bash_complete(with_node, "gpuprov up x --driver 5")
    assert "580" in bash_complete(with_node, "gpuprov bootstrap --driver R5")  # as the messages write a branch
    assert "2.9" in bash_complete(with_node, "gpuprov plan --torch 2.")
    assert "cu128" in bash_complete(with_node, "gpuprov render --torch-cuda cu12")
