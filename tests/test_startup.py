"""`gpuprov --help` must not pay for boto3 or Fabric: they are imported only by commands that use them."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

HEAVY = ("boto3", "botocore", "fabric", "paramiko", "invoke")


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--help"], ["plan", "--gpu", "T4"], ["gpus"]])
def test_offline_commands_import_no_cloud_or_ssh_sdk(argv):
    code = (  # the executable leaves through os._exit after the atexit handlers: one of them reports
        "import atexit, runpy, sys\n"
        f"atexit.register(lambda: print('LOADED', sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
        f"sys.argv = ['gpuprov', *{argv!r}]\n"
        "runpy.run_module('gpuprov', run_name='__main__')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "LOADED []"


def test_the_executable_skips_teardown_but_not_its_output_or_exit_code():
    """`gpuprov` leaves with os._exit (no module teardown): a long output still arrives whole, exit codes
    are kept, and a reader that leaves early (`| head`) gets no traceback."""
    run = [sys.executable, "-m", "gpuprov"]
    listed = subprocess.run([*run, "gpus", "--json"], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)["gpus"]) >= 10  # every GPU, to the closing brace
    bad = subprocess.run([*run, "plan", "--gpu", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --gpu"), bad.stderr
    piped = subprocess.run(["bash", "-o", "pipefail", "-c", f"{shlex.join(run)} gpus | head -n 1"],
                           capture_output=True, text=True)
    assert piped.returncode == 0 and piped.stdout.strip(), piped.stderr
    assert "Traceback" not in piped.stderr and "Exception ignored" not in piped.stderr, piped.stderr
