"""Fan-out: `gpuprov bootstrap` (whole CLI process) beside hand-written threaded Fabric on the same hosts.

    sudo .venv/bin/python bench/fanout.py [--sizes 1,32] [--runs 3] [--src OTHER_TREE/src]

Hosts are real OpenSSH servers in network namespaces (tests/hosts/fixture.py, prefix "gpb", bridge
"gpbbr0", subnet 10.230.0, each shifted by GPUPROV_TEST_NET as the tests' are). One pool of max(sizes)
hosts is started once; a run on N hosts uses the first N. Every timed figure is a whole process,
interpreter start and imports included, cold connections, and the median of --runs runs; the gpuprov
and Fabric runs alternate. gpuprov's sources are byte-compiled first, as a wheel install leaves them.

  gpuprov   `gpuprov bootstrap --inventory INV -p PLAYBOOK --force --json` (5 steps, every one
            really run; facts, plan, bundle, markers and the runner included: one exec per host)
  Fabric    a thread pool, one fabric.Connection per host (host key pinned): `put` the same bundle tar,
            one `run` to unpack it, one `run` per rendered step script (no facts, markers or verify)
  scripts   the 5 rendered step scripts run back to back inside one host, no SSH: the floor

Every host's gpuprov state (markers, the bundle, the runner's lock and output), the steps' output and Fabric's
files are removed before each timed run (`nsenter` into the host, outside sshd), so every run installs from
nothing, as the first `bootstrap` of a fleet does. The rerun (`gpuprov bootstrap` again, nothing reset, nothing
changed: every step skipped by its marker) is timed apart, as a second figure.

Round trips per host are counted on the hosts' side: sshd (LogLevel VERBOSE) logs one "Starting session"
line per exec (or sftp) channel and one "Accepted publickey" line per connection. Host-side CPU per host is
everything each host's sshd ran for the run, children included (bench/hostcpu.py: a cpuacct cgroup per host).

Goals (issue 28): host-side CPU per host <= Fabric's; 32 hosts <= 0.9x Fabric's time; 64 hosts <= 0.95x; one
host <= 0.4 s above the scripts' own time; controller CPU per host <= 0.7x Fabric's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hostcpu import HostCPU  # beside this script: python puts its folder first on sys.path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.hosts.fixture

STEPS = 5
STEP_SLEEP = 0.2
OUT_DIR = "/tmp/gpuprov-bench"  # per-host private tmpfs in netns mode


def step_command(i: int) -> str:
    """What step i does, as one shell command (the same for gpuprov and Fabric)."""
    return f"mkdir -p {OUT_DIR} && echo step{i} > {OUT_DIR}/step{i}.txt && sleep {STEP_SLEEP} && echo ok"


def playbook_yaml() -> str:
    lines = ["name: fanout-bench", "description: 5 small steps for bench/fanout.py", "stack: none", "env: null",
             "steps:"]
    for i in range(1, STEPS + 1):
        lines += [f"  - name: step-{i}", f"    run: {step_command(i)!r}"]
    return "\n".join(lines) + "\n"


FABRIC_SCRIPT = '''
import sys
from concurrent.futures import ThreadPoolExecutor

import paramiko
from fabric import Config, Connection

known_hosts, key, tar, scripts, hosts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(), sys.argv[5:]


def one(host):
    c = Connection(host, user="root", config=Config(overrides={"run": {"in_stream": False}}),
                   connect_kwargs={"key_filename": key, "look_for_keys": False, "allow_agent": False})
    c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    c.client.load_host_keys(known_hosts)
    with c:
        c.put(tar, "/tmp/fabric-bundle.tar")
        c.run("rm -rf /tmp/fabric-bundle && mkdir /tmp/fabric-bundle && tar -xf /tmp/fabric-bundle.tar -C /tmp/fabric-bundle",
              hide=True)
        for script in scripts:
            c.run(f"bash /tmp/fabric-bundle/{script}", hide=True)


with ThreadPoolExecutor(max_workers=64) as pool:
    list(pool.map(one, hosts))
'''

# the `gpuprov` executable, as a user runs it (else `python -m gpuprov`, ~5 ms more for runpy)
GPUPROV = [str(Path(sys.executable).with_name("gpuprov"))] if Path(sys.executable).with_name("gpuprov").exists() \
    else [sys.executable, "-m", "gpuprov"]

IMPORTS = {"gpuprov": "import gpuprov.cli.hosts, gpuprov.hosts.bootstrap", "Fabric": "import fabric"}


def session_counts(pool, n: int) -> tuple[int, int]:
    """(exec/sftp channels, connections) logged so far by the first n hosts' sshd, in total."""
    channels = connections = 0
    for i in range(n):
        text = (Path(pool[i].base) / "sshd.log").read_text(errors="replace")
        channels += text.count("Starting session:")
        connections += text.count("Accepted publickey")
    return channels, connections


def compile_sources(src: Path) -> None:
    """Byte-compile gpuprov's sources first, as installing a wheel does (Fabric's modules in site-packages were
    compiled at install). Without it, under PYTHONDONTWRITEBYTECODE (set on the shared test machine) every
    process compiled all ~25 of gpuprov's modules from source again: 0.1-0.2 s of CPU a run, which no user
    pays."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(src / "gpuprov")], check=True,
                   stdout=subprocess.DEVNULL)


RESET = f"rm -rf /var/lib/gpuprov/* {OUT_DIR} /tmp/fabric-bundle /tmp/fabric-bundle.tar"


def reset(pool, n: int) -> None:
    """The first n hosts as before a first install: no gpuprov state, no step output, no Fabric files."""
    for i in range(n):
        pool.exec_in(i, RESET, check=True)


Run = tuple[float, float, float, float, float]  # wall s, channels/host, connections/host, controller CPU s, host CPU s/host


def timed(pool, cpu, n: int, argv: list[str], env: dict[str, str]) -> tuple[Run, str]:
    """((wall s, channels per host, connections per host, the process's own CPU s, host-side CPU s per host),
    stdout) of one whole process on the first n hosts."""
    host_before = sum(cpu.read(n))
    before = session_counts(pool, n)
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    wall = time.perf_counter() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    if r.returncode != 0:
        try:  # the hosts that did not end ok, not the last host's steps
            bad = [h for h in json.loads(r.stdout) if h.get("status") not in ("ok", "changed")]
            tail = "\n".join(f"{h.get('host')}: {h.get('status')}: {h.get('error')}" for h in bad) + "\n" + r.stderr[-2000:]
        except (ValueError, AttributeError):
            tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-12:])
        raise RuntimeError(f"{' '.join(argv[:4])} exit {r.returncode}:\n{tail}")
    host = (sum(cpu.read(n)) - host_before) / n  # read once every login has ended: sshd's log is complete too
    after = session_counts(pool, n)
    return (wall, (after[0] - before[0]) / n, (after[1] - before[1]) / n, own, host), r.stdout


def timed_import(code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return time.perf_counter() - start


def scripts_floor(pool) -> float:
    """Seconds the 5 rendered step scripts take run back to back on host 1, no SSH (Fabric's run unpacked
    them there)."""
    r = pool.exec_in(0, "s=$(date +%s%N); for f in /tmp/fabric-bundle/0*.sh; do bash \"$f\" >/dev/null 2>&1 "
                        "|| exit 1; done; e=$(date +%s%N); echo $(( (e - s) / 1000 ))", check=True)
    return int(r.stdout.strip()) / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,32", help="host counts, comma-separated (default 1,32)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per size and tool; the median is printed")
    parser.add_argument("--src", type=Path, default=ROOT / "src",
                        help="gpuprov's sources to time (another tree's src/, for before and after); default this tree's")
    args = parser.parse_args()
    src = args.src.resolve()
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    if os.geteuid() != 0:
        print("bench/fanout.py starts SSH servers in network namespaces and needs root; run it as root.")
        return 0

    work = Path(tempfile.mkdtemp(prefix="gpuprov-fanout-"))
    home = work / "home"
    home.mkdir()
    sys.path.insert(0, str(src))
    from tests import testnet
    from tests.hosts.fixture import HostPool

    playbook = work / "fanout-bench.yml"
    playbook.write_text(playbook_yaml())
    fabric_script = work / "fabric_ref.py"
    fabric_script.write_text(FABRIC_SCRIPT)
    from gpuprov.hosts.bootstrap import bundle_tar
    from gpuprov.plan.plan import make_host_plan
    from gpuprov.plan.stack import StackPins

    bundle = make_host_plan(None, str(playbook), "ubuntu-24.04", StackPins()).bundle()
    tar = work / "bundle.tar"  # the bundle gpuprov sends: Fabric uploads the same file and runs the same scripts
    tar.write_bytes(bundle_tar(bundle))
    env = dict(os.environ, GPUPROV_HOME=str(home), HOME=str(home), COLUMNS="200", NO_COLOR="1")
    env["PYTHONPATH"] = str(src)
    compile_sources(src)

    pool = HostPool(max(sizes), work / "hosts", offset=10, prefix=testnet.prefix("gpb"), bridge=testnet.bridge("gpbbr0"),
                    subnet=testnet.subnet("10.230.0"))
    cpu = HostCPU(pool.hosts, f"gpuprov-fanout-{testnet.NET}")
    try:
        t0 = time.perf_counter()
        pool.start()
        if pool.mode != "netns":
            print(f"needs the netns test hosts (got {pool.mode}: {pool.fallback_reason})")
            return 1
        cpu.hosts = pool.hosts
        mode = cpu.attach()
        load = os.getloadavg()
        print(f"gpuprov from {src}")
        print(f"{len(pool)} test hosts up in {time.perf_counter() - t0:.1f}s; {os.cpu_count()} CPUs; load average "
              f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {STEPS} steps of `sleep {STEP_SLEEP}` each; "
              f"median of {args.runs} runs; hosts reset before every timed run; host CPU from "
              f"{'a cpuacct cgroup per host' if mode == 'cgroup' else '/proc/PID/stat of each sshd (10 ms ticks)'}\n",
              flush=True)
        pool.write_known_hosts(home / "known_hosts")  # gpuprov's own known_hosts ($GPUPROV_HOME): pinned, no TOFU
        pool.write_known_hosts(work / "known_hosts")
        scripts = " ".join(script.filename for script in bundle.scripts)

        rows: dict[int, dict[str, Run]] = {}
        cold: dict[int, float] = {}
        floor = 0.0
        for n in sizes:
            inventory = work / f"inventory-{n}.yml"
            inventory.write_text("defaults: {user: root, key: " + str(pool.key_path) + "}\nhosts:\n"
                                 + "".join(f"  - host: {pool[i].address}\n" for i in range(n)))
            gp_argv = [*GPUPROV, "bootstrap", "--inventory", str(inventory), "-p", str(playbook),
                       "--os", "ubuntu-24.04", "--json", "--parallel", "64"]
            fab_argv = [sys.executable, str(fabric_script), str(work / "known_hosts"), str(pool.key_path), str(tar), scripts,
                        *[pool[i].address for i in range(n)]]
            runs: dict[str, list[Run]] = {"gpuprov": [], "fabric": [], "rerun": []}

            def gpuprov(expect: str, n: int = n, gp_argv: list[str] = gp_argv) -> Run:
                run, out = timed(pool, cpu, n, gp_argv, env)
                got = {h["status"] for h in json.loads(out)}
                if got != {expect}:
                    raise RuntimeError(f"gpuprov: host statuses {sorted(got)}, expected {expect!r} on every host")
                return run

            # a first run with nothing cached (templates compiled, the bundle rendered), apart from the median:
            # the timed runs after it find both in the cache, as any rerun of the same plan does
            shutil.rmtree(home / "cache", ignore_errors=True)
            reset(pool, n)
            cold[n] = gpuprov("changed")[0]
            for _ in range(args.runs):
                reset(pool, n)
                runs["gpuprov"].append(gpuprov("changed"))  # a first install: every step runs
                runs["rerun"].append(gpuprov("ok"))  # nothing changed since: every step skipped by its marker
                reset(pool, n)
                runs["fabric"].append(timed(pool, cpu, n, fab_argv, env)[0])
            rows[n] = {tool: (statistics.median(r[0] for r in rs), rs[-1][1], rs[-1][2],
                              statistics.median(r[3] for r in rs), statistics.median(r[4] for r in rs))
                       for tool, rs in runs.items()}
            if n == sizes[0]:
                floor = statistics.median(scripts_floor(pool) for _ in range(args.runs))
            g, f, again = rows[n]["gpuprov"], rows[n]["fabric"], rows[n]["rerun"]
            print(f"  N={n:<3} gpuprov {g[0]:.2f}s  Fabric {f[0]:.2f}s  ratio {g[0] / f[0]:.2f}  host CPU/host "
                  f"{g[4] * 1000:.0f} vs {f[4] * 1000:.0f} ms  (rerun {again[0]:.2f}s; nothing cached {cold[n]:.2f}s)",
                  flush=True)

        load = os.getloadavg()
        print(f"\nwhole processes, first installs (hosts reset), median of {args.runs}: wall s, the controller process's "
              "own CPU s, and host-side CPU ms per host (everything sshd ran); round trips per host counted by the "
              f"hosts' sshd; load average now {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        print(f"{'N':>4} {'gpuprov':>8} {'Fabric':>7} {'gp/Fab':>7} {'gp CPU':>7} {'Fab CPU':>8} {'gp host':>8} "
              f"{'Fab host':>9} {'gp execs':>9} {'Fab execs':>10} {'conns':>6}")
        for n in sizes:
            g, f = rows[n]["gpuprov"], rows[n]["fabric"]
            print(f"{n:>4} {g[0]:8.2f} {f[0]:7.2f} {g[0] / f[0]:6.2f}x {g[3]:7.2f} {f[3]:8.2f} {g[4] * 1000:8.0f} "
                  f"{f[4] * 1000:9.0f} {g[1]:9.1f} {f[1]:10.1f} {g[2]:3.0f}/{f[2]:.0f}")
        print(f"\nrerun (nothing reset, nothing changed: every step skipped), median of {args.runs}")
        print(f"{'N':>4} {'wall s':>7} {'gp CPU':>7} {'host ms':>8} {'execs':>6}")
        for n in sizes:
            r = rows[n]["rerun"]
            print(f"{n:>4} {r[0]:7.2f} {r[3]:7.2f} {r[4] * 1000:8.0f} {r[1]:6.1f}")
        starts = {tool: statistics.median(timed_import(code, env) for _ in range(args.runs)) for tool, code in IMPORTS.items()}
        print("\nstart-up, `python -c 'import ...'`: " + ", ".join(f"{tool} {t:.2f}s" for tool, t in starts.items()))
        one, big = sizes[0], sizes[-1]
        g1, gb, fb = rows[one]["gpuprov"], rows[big]["gpuprov"], rows[big]["fabric"]
        print(f"the {STEPS} scripts' own time on one host (no SSH): {floor:.2f}s")
        print("goals:")
        print(f"  host-side CPU per host <= Fabric's: {gb[4] * 1000:.0f} ms vs {fb[4] * 1000:.0f} ms at {big} "
              f"({gb[4] / fb[4]:.2f}x)")
        print(f"  {big} hosts <= {0.95 if big >= 64 else 0.9}x Fabric: {gb[0] / fb[0]:.2f}x")
        print(f"  one host ({one}) <= the scripts' time + 0.40 s: gpuprov {g1[0] - floor:+.2f}s, "
              f"Fabric {rows[one]['fabric'][0] - floor:+.2f}s")
        print(f"  controller CPU per host <= 0.7x Fabric's: {gb[3] / fb[3]:.2f}x at {big}")
        print("with nothing cached (a first run: templates compiled, bundle rendered): " + ", ".join(
            f"{n} host{'s' if n > 1 else ''} {cold[n]:.2f}s ({cold[n] / rows[n]['fabric'][0]:.2f}x Fabric)" for n in sizes))
    finally:
        cpu.detach()
        pool.stop()
    return 0

if __name__ == "__main__":
    sys.exit(main())
