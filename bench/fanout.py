"""Fan-out: the same 5-step bundle bootstrapped on 1, 8 and 32 test hosts. Prints figures; asserts nothing.

    sudo python bench/fanout.py [--sizes 1,8,32] [--runs 3] [--compare]

Hosts are real OpenSSH servers in network namespaces (tests/hosts/fixture.py, prefix "gpb", bridge
"gpbbr0", subnet 10.230.0; loopback sshds when namespaces are not allowed). One pool of max(sizes)
hosts is started once; a run on N hosts uses the first N. Each timed run is the whole
`gpuprov.bootstrap.bootstrap()` call (connect + facts + upload + markers + 5 steps, with
Options(force=True) so every step really runs); no warm-up run hides connection setup. The figure
is the median of --runs runs.

With --compare, ansible-core and pyinfra are installed into /tmp/bench-venv (if they can be) and
run the same 5 shell commands on the same hosts, host keys checked against a known_hosts file.
Their figures are whole-process wall times (interpreter start and imports included); gpuprov's are
in-process, so the gpuprov CLI's own start-up (bench/cli_startup.py) is not in them.

Goal (the project's issue): 32 hosts within 1.3x the time of one.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.hosts.fixture

STEPS = 5
STEP_SLEEP = 0.2
OUT_DIR = "/tmp/gpuprov-bench"  # per-host private tmpfs in netns mode
VENV = Path("/tmp/bench-venv")


def step_command(i: int) -> str:
    """What step i does, as one shell command (the same for gpuprov, Ansible and pyinfra)."""
    return f"mkdir -p {OUT_DIR} && echo step{i} > {OUT_DIR}/step{i}.txt && sleep {STEP_SLEEP} && echo ok"


def playbook_yaml() -> str:
    lines = ["name: fanout-bench", "description: 5 small steps for bench/fanout.py", "stack: none", "env: null",
             "steps:"]
    for i in range(1, STEPS + 1):
        lines += [f"  - name: step-{i}", f"    run: {step_command(i)!r}"]
    return "\n".join(lines) + "\n"


# ---- instrumentation: SSH round trips and where each host's time goes -----------------------------

class Probe:
    """Wraps Remote.open/run/put_bytes: per-thread (= per-host) counts and seconds."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.calls: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.secs: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    def install(self) -> None:
        from gpuprov import remote

        for name in ("open", "run", "put_bytes"):
            orig = getattr(remote.Remote, name)

            def wrapper(self_: object, *a: object, _orig=orig, _name=name, **kw: object) -> object:
                start = time.perf_counter()
                try:
                    return _orig(self_, *a, **kw)
                finally:
                    self.record(_name, time.perf_counter() - start)

            setattr(remote.Remote, name, wrapper)

    def record(self, what: str, secs: float) -> None:
        tid = threading.get_ident()
        with self.lock:
            self.calls[tid][what] += 1
            self.secs[tid][what] += secs

    def per_host(self) -> tuple[dict[str, float], dict[str, float]]:
        """Mean calls and mean seconds per host, by kind."""
        n = max(1, len(self.calls))
        calls: collections.Counter[str] = collections.Counter()
        secs: collections.Counter[str] = collections.Counter()
        for c in self.calls.values():
            calls.update(c)
        for s in self.secs.values():
            secs.update(s)
        return {k: v / n for k, v in calls.items()}, {k: v / n for k, v in secs.items()}


# ---- gpuprov ----------------------------------------------------------------------------------------

def run_gpuprov(pool, n: int, playbook: Path, work: Path, probe: Probe) -> tuple[float, list]:
    from gpuprov.bootstrap import Options, bootstrap
    from gpuprov.compat import StackPins
    from gpuprov.inventory import Target
    from gpuprov.plan import make_host_plan
    from gpuprov.remote import HostSettings

    plan = make_host_plan(None, str(playbook), "ubuntu-24.04", StackPins())
    targets = [Target(host=pool[i].address, user="root", key=str(pool.key_path)) for i in range(n)]
    settings = HostSettings(known_hosts=work / "known_hosts", accept_new_host_key=False, key_filename=str(pool.key_path))
    log_dir = work / "logs"
    log_dir.mkdir(exist_ok=True)
    probe.reset()
    start = time.perf_counter()
    results = bootstrap(targets, settings, lambda t, f: plan, Options(parallel=64, force=True), log_dir=log_dir)
    wall = time.perf_counter() - start
    bad = [f"{r.target.name}: {r.summary} {r.error or ''}" for r in results if r.status not in ("ok", "changed")]
    if bad:
        raise RuntimeError("gpuprov bootstrap failed on some hosts:\n  " + "\n  ".join(bad[:5]))
    return wall, results


# ---- Ansible / pyinfra --------------------------------------------------------------------------------

def ensure_tools() -> dict[str, str | None]:
    """{tool: reason it is missing, or None}; installs into /tmp/bench-venv once."""
    exe = {"ansible": VENV / "bin" / "ansible-playbook", "pyinfra": VENV / "bin" / "pyinfra"}
    if not all(p.exists() for p in exe.values()):
        try:
            if not (VENV / "bin" / "python").exists():
                subprocess.run(["python3", "-m", "venv", str(VENV)], check=True, capture_output=True, text=True,
                               timeout=120)
            r = subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", "ansible-core", "pyinfra"],
                               capture_output=True, text=True, timeout=600)
            reason = (r.stderr.strip().splitlines() or [f"pip exit {r.returncode}"])[-1] if r.returncode else None
        except (OSError, subprocess.SubprocessError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        if reason:
            return {k: reason for k in exe}
    return {k: None if p.exists() else "not installed by pip" for k, p in exe.items()}


def ansible_files(pool, n: int, work: Path) -> list[str]:
    d = work / f"ansible-{n}"
    d.mkdir(exist_ok=True)
    kh = d / "known_hosts"
    write_known_hosts(pool, kh)
    common = f"-o UserKnownHostsFile={kh} -o StrictHostKeyChecking=yes -o GlobalKnownHostsFile=/dev/null"
    inv = ["[bench]"] + [
        f"{pool[i].name} ansible_host={pool[i].address} ansible_port={pool[i].port}" for i in range(n)
    ] + ["", "[bench:vars]", "ansible_user=root", f"ansible_ssh_private_key_file={pool.key_path}",
         f"ansible_ssh_common_args='{common}'", "ansible_python_interpreter=/usr/bin/python3"]
    (d / "inventory.ini").write_text("\n".join(inv) + "\n")
    tasks = "\n".join(f"    - name: step-{i}\n      ansible.builtin.shell: {step_command(i)!r}" for i in range(1, STEPS + 1))
    (d / "play.yml").write_text(f"- hosts: bench\n  gather_facts: false\n  tasks:\n{tasks}\n")
    return [str(VENV / "bin" / "ansible-playbook"), "-i", str(d / "inventory.ini"), "-f", "32", str(d / "play.yml")]


def pyinfra_files(pool, n: int, work: Path) -> list[str]:
    d = work / f"pyinfra-{n}"
    d.mkdir(exist_ok=True)
    kh = d / "known_hosts"
    write_known_hosts(pool, kh)
    data = {"ssh_user": "root", "ssh_key": str(pool.key_path), "ssh_known_hosts_file": str(kh),
            "ssh_strict_host_key_checking": "yes"}
    hosts = [(pool[i].address, {**data, "ssh_port": pool[i].port}) for i in range(n)]
    (d / "inventory.py").write_text(f"hosts = {hosts!r}\n")
    ops = "\n".join(f"server.shell(name='step-{i}', commands=[{step_command(i)!r}])" for i in range(1, STEPS + 1))
    (d / "deploy.py").write_text(f"from pyinfra.operations import server\n\n{ops}\n")
    return [str(VENV / "bin" / "pyinfra"), str(d / "inventory.py"), str(d / "deploy.py"), "-y", "--parallel", "32",
            "--ssh-key", str(pool.key_path)]


def write_known_hosts(pool, path: Path) -> None:
    if hasattr(pool, "write_known_hosts"):
        pool.write_known_hosts(path)
    else:
        path.write_text("".join(h.known_hosts_line() + "\n" for h in pool.hosts))


def run_tool(argv: list[str], work: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    r = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=600, env=env)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-8:])
        raise RuntimeError(f"{Path(argv[0]).name} exit {r.returncode}:\n{tail}")
    return wall


# ---- main ---------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,8,32", help="host counts, comma-separated (default 1,8,32)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per size; the median is printed")
    parser.add_argument("--compare", action="store_true", help="also time ansible-core and pyinfra (installed into "
                        f"{VENV} if possible)")
    args = parser.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    if os.geteuid() != 0:
        print("bench/fanout.py starts SSH servers in network namespaces and needs root; run it as root.")
        return 0

    work = Path(tempfile.mkdtemp(prefix="gpuprov-fanout-"))
    os.environ["GPUPROV_HOME"] = str(work / "home")
    sys.path.insert(0, str(ROOT / "src"))
    from tests.hosts.fixture import HostPool

    playbook = work / "fanout-bench.yml"
    playbook.write_text(playbook_yaml())
    from gpuprov.compat import StackPins
    from gpuprov.plan import make_host_plan

    plan = make_host_plan(None, str(playbook), "ubuntu-24.04", StackPins())
    if len(plan.steps) != STEPS:
        print(f"the bench playbook planned {len(plan.steps)} steps, not {STEPS}: {[s.name for s in plan.steps]}")
        return 1

    tools: dict[str, str | None] = {}
    if args.compare:
        print(f"installing ansible-core and pyinfra into {VENV} (once) ...", flush=True)
        tools = ensure_tools()
        for name, reason in tools.items():
            if reason:
                print(f"{name}: not installable here ({reason})")

    probe = Probe()
    probe.install()
    pool = HostPool(max(sizes), work / "hosts", offset=10, prefix="gpb", bridge="gpbbr0", subnet="10.230.0")
    try:
        t0 = time.perf_counter()
        pool.start()
        print(f"{len(pool)} test hosts up in {time.perf_counter() - t0:.1f}s (mode {pool.mode}"
              f"{', ' + pool.fallback_reason if pool.fallback_reason else ''}); {os.cpu_count()} CPUs; "
              f"{STEPS} steps of `sleep {STEP_SLEEP}` each; median of {args.runs} runs\n", flush=True)
        write_known_hosts(pool, work / "known_hosts")

        rows: dict[int, dict[str, float]] = {}
        profile: dict[int, tuple[dict[str, float], dict[str, float], float]] = {}
        for n in sizes:
            walls, per_host = [], []
            for _ in range(args.runs):
                wall, results = run_gpuprov(pool, n, playbook, work, probe)
                walls.append(wall)
                per_host.append(statistics.mean(r.seconds for r in results))
            rows[n] = {"gpuprov": statistics.median(walls)}
            calls, secs = probe.per_host()  # the last run's
            profile[n] = (calls, secs, per_host[-1])  # all from the last run
            for tool, build in (("ansible", ansible_files), ("pyinfra", pyinfra_files)):
                if tool not in tools or tools[tool]:
                    continue
                argv = build(pool, n, work)
                env = dict(os.environ, ANSIBLE_HOST_KEY_CHECKING="True", ANSIBLE_NOCOLOR="1",
                           ANSIBLE_LOCAL_TEMP=str(work / "ansible-tmp"), HOME=str(work / "home"))
                try:
                    rows[n][tool] = statistics.median(run_tool(argv, work, env) for _ in range(args.runs))
                except (RuntimeError, subprocess.SubprocessError) as exc:
                    print(f"{tool} on {n} hosts failed: {exc}")
                    tools[tool] = "failed"
            print(f"  N={n:<3} gpuprov {rows[n]['gpuprov']:.2f}s"
                  + "".join(f"  {t} {rows[n][t]:.2f}s" for t in ("ansible", "pyinfra") if t in rows[n]), flush=True)

        base = rows[sizes[0]]["gpuprov"]
        print(f"\ngpuprov bootstrap, whole call (connect + facts + upload + {STEPS} steps)")
        print(f"{'N':>4} {'wall s':>8} {'ratio':>7} {'steps/s/host':>13} {'round trips/host':>17}")
        for n in sizes:
            wall = rows[n]["gpuprov"]
            calls = profile[n][0]
            trips = calls.get("open", 0) + calls.get("run", 0) + calls.get("put_bytes", 0)
            print(f"{n:>4} {wall:8.2f} {wall / base:6.2f}x {STEPS / wall:13.2f} {trips:10.0f} "
                  f"({calls.get('open', 0):.0f} connect, {calls.get('run', 0):.0f} run, {calls.get('put_bytes', 0):.0f} put)")
        target = f"goal: {sizes[-1]} hosts within 1.3x of {sizes[0]}"
        print(f"{target}: {rows[sizes[-1]]['gpuprov'] / base:.2f}x")

        print(f"\nwhere a host's time goes (mean per host, last run; {STEPS * STEP_SLEEP:.1f}s of it is the steps' sleep)")
        print(f"{'N':>4} {'host s':>7} {'connect':>8} {'run':>7} {'per run':>8} {'put':>6} {'other':>6}")
        for n in sizes:
            calls, secs, host_s = profile[n]
            other = host_s - sum(secs.values())
            per_run = secs.get("run", 0) / max(1, calls.get("run", 1))
            print(f"{n:>4} {host_s:7.2f} {secs.get('open', 0):8.2f} {secs.get('run', 0):7.2f} {per_run:8.3f} "
                  f"{secs.get('put_bytes', 0):6.2f} {other:6.2f}")

        if tools:
            names = [t for t in ("ansible", "pyinfra") if not tools.get(t)]
            print("\nbeside Ansible (ansible-core) and pyinfra, same 5 shell commands, wall s "
                  f"(ratio to their own N={sizes[0]})")
            print(f"{'N':>4} {'gpuprov':>14}" + "".join(f" {t:>14}" for t in names))
            for n in sizes:
                cells = [f"{rows[n]['gpuprov']:6.2f} ({rows[n]['gpuprov'] / base:4.2f}x)"]
                for t in names:
                    v, b = rows[n].get(t), rows[sizes[0]].get(t)
                    cells.append(f"{v:6.2f} ({v / b:4.2f}x)" if v and b else "-")
                print(f"{n:>4} " + " ".join(f"{c:>14}" for c in cells))
            for t, reason in tools.items():
                if reason:
                    print(f"{t}: {reason}")
    finally:
        pool.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
