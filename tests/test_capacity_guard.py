"""A node in a Capacity Block: its interrupt watch knows the block's end, and 40 minutes before it (ten before EC2
begins ending the block's instances) warns and runs the on-interrupt hook, once. Locally, under the shims."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpuprov.plan.plan import BLOCK_WARN_SECONDS, Guards, guard_steps
from gpuprov.plan.render import render_steps
from tests.shimrun import ShimHost
from tests.test_guardrails import assert_bash_and_shellcheck_pass

END = 2_000_000_000  # the block's end, epoch seconds


def test_the_watch_runs_the_hook_once_forty_minutes_before_the_block_ends(tmp_path: Path) -> None:
    guards = Guards(block_end=END, on_interrupt="echo \"$GPUPROV_INTERRUPT_ACTION $GPUPROV_INTERRUPT_TIME\" "
                                                ">> /tmp/gp-block-hook")
    (step,) = guard_steps(guards)
    assert "40 min before its Capacity Block ends" in step.summary
    (script,) = render_steps((step,), {}, {}).scripts
    host = ShimHost(tmp_path, gpu="H100")
    first = host.run_script(script)
    assert first.result == "changed", first.stderr
    conf = (host.sysroot / "etc/gpuprov/interrupt.conf").read_text()
    assert f"BLOCK_END={END}\n" in conf and f"BLOCK_WARN={BLOCK_WARN_SECONDS}\n" in conf
    watch = host.sysroot / "usr/local/lib/gpuprov/interrupt-watch"
    hook = host.sysroot / "etc/gpuprov/on-interrupt"
    hook.write_text(hook.read_text().replace("/tmp/gp-block-hook", str(tmp_path / "hook-runs")))
    log = host.sysroot / "var/log/gpuprov/interrupt.log"

    def at(now: int) -> str:
        env = {**os.environ, "GPUPROV_SYSROOT": str(host.sysroot), "GPUPROV_NOW": str(now),
               "GPUPROV_METADATA_URL": "http://127.0.0.1:9"}  # no IMDS here: the block's clock alone
        subprocess.run(["bash", str(watch), "--once"], env=env, check=True, capture_output=True, timeout=30)
        runs = tmp_path / "hook-runs"
        return runs.read_text() if runs.exists() else ""

    assert at(END - BLOCK_WARN_SECONDS - 1) == ""  # a second early: nothing
    assert "capacity block" not in log.read_text()
    assert at(END - BLOCK_WARN_SECONDS) == "terminate 2033-05-18T03:03:20Z\n"  # when EC2 begins: 30 min before
    assert "capacity block ends at 2033-05-18T03:33:20Z" in log.read_text()
    assert at(END - 60) == "terminate 2033-05-18T03:03:20Z\n"  # once per block end
    (tmp_path / "step.sh").write_text(script.text)
    assert_bash_and_shellcheck_pass([tmp_path / "step.sh", watch])
