"""Host side, part by part: the processes each part of a bootstrap starts on a host and the CPU it uses there,
beside the same step scripts run by a bare `bash -s` on their own exec channels (what Fabric or `ssh host
'bash -s' < script` costs a host).

    sudo .venv/bin/python bench/hostside.py [--reps 20] [--src OTHER_TREE/src]

One SSH test host (netns, prefix "gpk", bridge "gpkbr0", subnet 10.233.0, shifted by GPUPROV_TEST_NET), one
connection through gpuprov's own `Remote` (the same transport bootstrap uses) for every exec. CPU: everything
the host's sshd runs for the part, children included, from a cpuacct cgroup (bench/hostcpu.py), the mean of
--reps repetitions, each from the state a first install finds (gpuprov's state removed by `nsenter` before it,
outside sshd, so not counted). Processes: every process started on the host for one repetition, and how many of
them executed a program (the others are bash's own forks: subshells, `$(...)`), counted by `strace -f` on the
host's sshd in a separate pass (strace slows what it follows).

Parts:
  login            a second connection opened and closed (no exec): sshd's own work for every connection
  exec channel     `true` on its own exec channel: what any command costs sshd (session, the login shell's -c)
  facts            bootstrap's busy check and facts command, as its first exec prints them
  unpack           the tar on stdin into /var/lib/gpuprov/bundle (beside the old one, swapped in)
  runner           the rendered runner with the 5 steps, markers written, on an unpacked bundle
  runner, rerun    the same runner again: every step skipped by its marker
  bootstrap exec   the whole first exec as `gpuprov bootstrap` sends it: facts, unpack, runner; and its rerun
  bash -s (x5)     each step script on its own exec channel, `bash -s` with the script on stdin
The runner's own cost is `runner` minus the five scripts run inside one session (`in-session scripts`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hostcpu import HostCPU, listener_pid, processes_started

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.hosts.fixture
sys.path.insert(0, str(ROOT / "src"))

RESET = "rm -rf /var/lib/gpuprov/* /tmp/gpuprov-bench"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=20, help="repetitions per part; the mean is printed")
    parser.add_argument("--src", help="import gpuprov from this folder (another tree's src/: before and after)")
    args = parser.parse_args()
    if args.src:
        sys.path.insert(0, str(Path(args.src).resolve()))
    if os.geteuid() != 0:
        print("bench/hostside.py starts an SSH server in a network namespace and needs root; run it as root.")
        return 0
    from fanout import playbook_yaml
    from tests import testnet
    from tests.hosts.fixture import HostPool

    from gpuprov.hosts import runner
    from gpuprov.hosts.bootstrap import bundle_tar
    from gpuprov.hosts.detect import FACTS_COMMAND
    from gpuprov.hosts.remote import HostSettings, Remote
    from gpuprov.plan.inventory import Target
    from gpuprov.plan.plan import make_host_plan
    from gpuprov.plan.stack import StackPins

    work = Path(tempfile.mkdtemp(prefix="gpuprov-hostside-"))
    playbook = work / "fanout-bench.yml"
    playbook.write_text(playbook_yaml())
    bundle = make_host_plan(None, str(playbook), "ubuntu-24.04", StackPins()).bundle()
    tar = bundle_tar(bundle)
    scripts = [s.text.encode() for s in bundle.scripts]
    client = "bench:root@bench:1"
    nonce = runner.new_nonce()

    pool = HostPool(1, work / "hosts", offset=10, prefix=testnet.prefix("gpk"), bridge=testnet.bridge("gpkbr0"),
                    subnet=testnet.subnet("10.233.0"))
    cpu = HostCPU([], f"gpuprov-hostside-{testnet.NET}")
    try:
        pool.start()
        if pool.mode != "netns":
            print(f"needs the netns test hosts (got {pool.mode}: {pool.fallback_reason})")
            return 1
        cpu.hosts = pool.hosts
        mode = cpu.attach()
        known = pool.write_known_hosts(work / "known_hosts")
        remote = Remote(Target(pool[0].address, user="root", key=str(pool.key_path)),
                        HostSettings(known_hosts=known, key_filename=str(pool.key_path)))
        remote.open()

        def run(command: str, stdin: bytes = b"") -> None:
            errors: list[str] = []
            code = remote.stream(command, stdin=stdin, on_out=lambda _: None, on_err=errors.append)
            if code != 0:
                raise RuntimeError(f"{command[:60]!r}: exit {code}: {''.join(errors)[-300:]}")

        def reset() -> None:
            pool.exec_in(0, RESET, check=True)

        def unpacked() -> None:
            reset()
            run(runner.command(nonce, 1, False, None, unpack=True, client=client).replace(
                f"exec bash {runner.BUNDLE_DIR}/{runner.RUNNER_FILE}", "exit 0 #"), tar)

        def installed() -> None:
            unpacked()
            run(runner.command(nonce, 1, False, None, unpack=False, client=client))

        def login() -> None:
            other = Remote(Target(pool[0].address, user="root", key=str(pool.key_path)),
                           HostSettings(known_hosts=known, key_filename=str(pool.key_path)))
            other.open()
            other.close()
            cpu.settle(1, only_new=True)

        runner_cmd = runner.command(nonce, 1, False, None, unpack=False, client=client)
        first_exec = (runner.busy_check(client, False) + f"{FACTS_COMMAND}; echo {runner.facts_end(nonce)}; "
                      + runner.command(nonce, 1, False, None, unpack=True, client=client))

        def installed_by_bootstrap() -> None:
            reset()
            run(first_exec, tar)
        in_session = "; ".join(f"bash {runner.BUNDLE_DIR}/{s.filename} >/dev/null" for s in bundle.scripts)
        parts: list[tuple[str, Callable[[], None], Callable[[], None]]] = [
            ("login (connect, key exchange, auth)", reset, login),
            ("exec channel (`true`)", reset, lambda: run("true")),
            ("facts (busy check + facts command)", reset,
             lambda: run(runner.busy_check(client, False) + FACTS_COMMAND)),
            ("unpack (tar on stdin)", reset, lambda: run(runner.command(nonce, 1, False, None, unpack=True,
                                                                        client=client).split("exec bash")[0]
                                                         + "exit 0", tar)),
            ("runner, 5 steps, first install", unpacked, lambda: run(runner_cmd)),
            ("in-session scripts (5, no runner)", unpacked, lambda: run(in_session)),
            ("runner, rerun (5 skipped)", installed, lambda: run(runner_cmd)),
            ("bootstrap exec (facts+unpack+runner)", reset, lambda: run(first_exec, tar)),
            ("bootstrap exec, rerun (5 skipped)", installed_by_bootstrap, lambda: run(first_exec, tar)),
            ("bash -s, 5 scripts (5 execs)", reset, lambda: [run("bash -s", s) for s in scripts] and None),
        ]
        load = os.getloadavg()
        import gpuprov

        print(f"gpuprov from {Path(gpuprov.__file__).parent}; one test host; {os.cpu_count()} CPUs; "
              f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
              f"host CPU from {'a cpuacct cgroup' if mode == 'cgroup' else '/proc/PID/stat (10 ms ticks)'}; mean of "
              f"{args.reps} repetitions; processes from one strace pass\n", flush=True)
        print(f"{'part':<38} {'processes':>9} {'programs':>9} {'CPU ms':>7}")
        rows: dict[str, float] = {}
        for name, before, part in parts:
            samples = []
            for _ in range(args.reps):
                before()
                start = cpu.read(1, settle=False)[0]
                part()
                samples.append(cpu.read(1, settle=False)[0] - start)
            before()
            procs, execs = processes_started(listener_pid(pool[0]), part)
            rows[name] = statistics.mean(samples)
            print(f"{name:<38} {procs:>9} {execs:>9} {rows[name] * 1000:7.1f}", flush=True)
        own = rows["runner, 5 steps, first install"] - rows["in-session scripts (5, no runner)"]
        whole = rows["bootstrap exec (facts+unpack+runner)"]
        ref = rows["bash -s, 5 scripts (5 execs)"]
        load = os.getloadavg()
        print(f"\nthe runner's own cost beside the scripts it runs: {own * 1000:+.1f} ms; the bootstrap exec "
              f"{whole * 1000:.1f} ms beside 5 `bash -s` execs {ref * 1000:.1f} ms ({whole / ref:.2f}x); "
              f"load average now {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        remote.close()
        time.sleep(0.1)
    finally:
        cpu.detach()
        pool.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
