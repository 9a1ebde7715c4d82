"""`gpuprov --help` must not pay for boto3 or Fabric: they are imported only by commands that use them."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("boto3", "botocore", "fabric", "paramiko", "invoke")


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--help"], ["plan", "--gpu", "T4"], ["gpus"]])
def test_offline_commands_import_no_cloud_or_ssh_sdk(argv):
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['gpuprov', *{argv!r}]\n"
        "try:\n    runpy.run_module('gpuprov', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        f"print('LOADED', sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "LOADED []"
