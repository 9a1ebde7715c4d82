"""Fake SSH hosts for tests: real OpenSSH servers, one per network namespace (tests/hosts/testhosts.sh).

    with HostPool(8, base_dir, shims_dir=Path("tests/shims")) as pool:
        c = pool.hosts[0].connection()          # fabric.Connection, host key pinned, RejectPolicy
        c.run("hostname")                        # -> gph1
        pool.exec_in(0, "cat /var/lib/gpuprov-shim/calls.log").stdout

Modes (``pool.mode``):
  * "netns" (root, ``ip netns add`` allowed): host i (1-based name ``<prefix>i``) listens on
    10.200.0.(offset+i):22 with its own hostname, private tmpfs /tmp, /root, /var/lib/gpuprov,
    /var/lib/gpuprov-shim, volatile /run/gpuprov-shim, shims first on PATH, reboot support.
  * "loopback" (fallback): sshd on 127.0.<loop_net>.(offset+i):(2200+offset+i) sharing the machine's filesystem and
    hostname; ``supports_reboot`` and ``isolated`` are False; shims are first on PATH via sshd SetEnv
    (as ``<shims_dir>/bin``, not /usr/local/gpuprov-shims/bin); ``exec_in`` runs locally.

Host indexes given to the pool's methods are 0-based positions in ``pool.hosts`` (``pool.hosts[0].name`` is
``<prefix>1``); a TestHost object is accepted too.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

SCRIPT = Path(__file__).with_name("testhosts.sh")
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHIM_BIN_IN_HOST = "/usr/local/gpuprov-shims/bin"
SITE_IN_HOST = "/usr/local/gpuprov-site"


def wait_tcp(host: str, port: int, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), 0.2).close()
            return
        except OSError:
            if time.monotonic() > end:
                raise TimeoutError(f"{host}:{port} not listening after {timeout} s") from None
            time.sleep(0.02)


@dataclass(kw_only=True)
class TestHost:
    """One fake host. ``host_key_pub`` is its public host key line, e.g. "ssh-ed25519 AAAA... gph1"."""

    __test__: ClassVar[bool] = False  # not a pytest test class

    name: str
    address: str
    port: int = 22
    user: str = "root"
    key_path: str  # client private key (authorized on every host)
    host_key_pub: str
    base: str  # this host's state folder ($BASE/<name>)
    index: int = 0  # 0-based position in HostPool.hosts

    @property
    def known_hosts_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    def known_hosts_line(self) -> str:
        keytype, b64 = self.host_key_pub.split()[:2]
        return f"{self.known_hosts_name} {keytype} {b64}"

    def host_key(self) -> Any:
        """The host key as a paramiko PKey."""
        import paramiko

        keytype, b64 = self.host_key_pub.split()[:2]
        return paramiko.PKey.from_type_string(keytype, __import__("base64").b64decode(b64))

    def pin_host_key(self, client: Any) -> None:
        """Trust exactly this host's key on a paramiko SSHClient and reject any other."""
        import paramiko

        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        keytype = self.host_key_pub.split()[0]
        client.get_host_keys().add(self.known_hosts_name, keytype, self.host_key())

    def connect_kwargs(self) -> dict[str, Any]:
        return {"key_filename": self.key_path, "look_for_keys": False, "allow_agent": False}

    def connection(self, connect_timeout: int = 5, **kwargs: Any) -> Any:
        """A fabric.Connection to this host with its host key pinned (never AutoAddPolicy).

        Note: Fabric casts connect_timeout to int, so use whole seconds."""
        from fabric import Config, Connection

        kwargs.setdefault("config", Config(overrides={"run": {"in_stream": False}}))
        c = Connection(
            self.address,
            user=self.user,
            port=self.port,
            connect_timeout=connect_timeout,
            connect_kwargs=self.connect_kwargs(),
            **kwargs,
        )
        self.pin_host_key(c.client)
        return c


@dataclass
class _Loop:
    """Loopback-mode bookkeeping for one host."""

    proc: subprocess.Popen[bytes] | None = None
    log: Any = None
    blockers: list[socket.socket] = field(default_factory=list)


class HostPool:
    """``HostPool(n, base_dir, shims_dir=None, offset=10)``: context manager that brings up n fake hosts.

    Attributes: hosts (list[TestHost]), mode ("netns" | "loopback"), supports_reboot, isolated,
    key_path (client private key, 0600, in base_dir), base (Path), fallback_reason (why loopback, or "").

    Several pools can be up at once if each has its own prefix, bridge and subnet (netns) and offset
    (loopback ports are 2200+offset+i); pools of other processes (xdist workers) also differ in loop_net.
    """

    def __init__(
        self,
        n: int,
        base_dir: str | os.PathLike[str],
        shims_dir: str | os.PathLike[str] | None = None,
        offset: int = 10,
        *,
        mode: str = "auto",
        prefix: str = "gph",
        bridge: str = "gpbr0",
        subnet: str = "10.200.0",
        reboot_delay: float = 1.0,
        startup_timeout: float = 20.0,
        host_env: dict[str, str] | None = None,
        sudo_users: tuple[str, ...] = (),
        loop_net: int = 0,
        private: tuple[str, ...] = (),
    ) -> None:
        if mode not in ("auto", "netns", "loopback"):
            raise ValueError(f"mode must be auto, netns or loopback, not {mode!r}")
        self.n = n
        self.base = Path(base_dir).resolve()
        self.shims_dir = Path(shims_dir).resolve() if shims_dir else None
        self.offset = offset
        self.prefix = prefix
        self.bridge = bridge
        self.subnet = subnet
        self.reboot_delay = reboot_delay
        self.startup_timeout = startup_timeout
        self.host_env = dict(host_env or {})
        self.sudo_users = tuple(sudo_users)
        self.private = tuple(private)  # existing folders each host (netns mode) gets an empty one of its own
        self.loop_net = loop_net  # loopback mode: third octet of the hosts' 127.x addresses (one per test net)
        self._want = mode
        self.mode = ""
        self.fallback_reason = ""
        self.hosts: list[TestHost] = []
        self.key_path = self.base / "id_ed25519"
        self._loop: list[_Loop] = []
        self._started = False

    # ---- lifecycle ----
    @property
    def supports_reboot(self) -> bool:
        return self.mode == "netns"

    @property
    def isolated(self) -> bool:
        """True when hosts have their own hostname and private /tmp, /root, /var/lib/gpuprov."""
        return self.mode == "netns"

    def __enter__(self) -> HostPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __len__(self) -> int:
        return len(self.hosts)

    def __getitem__(self, i: int) -> TestHost:
        return self.hosts[i]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.hosts)

    def _env(self) -> dict[str, str]:
        env = dict(
            os.environ,
            BASE=str(self.base),
            PUBKEY=f"{self.key_path}.pub",
            OFFSET=str(self.offset),
            PREFIX=self.prefix,
            BRIDGE=self.bridge,
            SUBNET=self.subnet,
            REBOOT_DELAY=str(self.reboot_delay),
        )
        env["SHIMS"] = str(self.shims_dir) if self.shims_dir else ""
        # the tests' site-packages at SITE_IN_HOST: the aws shim's boto3 (the checkout may lie under /tmp or /root)
        env["SITE"] = sysconfig.get_paths()["purelib"] if self.shims_dir else ""
        env["HOST_ENV"] = " ".join(f"{k}={v}" for k, v in self.host_env.items())
        env["SUDO_USERS"] = " ".join(self.sudo_users)
        env["PRIVATE"] = " ".join(self.private)
        return env

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o755)  # sshd reads authorized_keys as the target user
        if not self.key_path.exists():
            subprocess.run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    "gpuprov-test",
                    "-f",
                    str(self.key_path),
                ],
                check=True,
            )
        os.chmod(self.key_path, 0o600)
        self._started = True
        if self._want in ("auto", "netns"):
            r = subprocess.run(
                [str(SCRIPT), "up", str(self.n)],
                env=self._env(),
                capture_output=True,
                text=True,
                timeout=self.startup_timeout + 60,
            )
            if r.returncode == 0:
                self.mode = "netns"
                self._read_hosts_txt()
                return
            if r.returncode != 3 or self._want == "netns":
                if r.returncode != 4:  # 4: the namespaces belong to another run, never tear those down
                    self._script_down()
                raise RuntimeError(f"testhosts.sh up failed (rc {r.returncode}): {r.stderr.strip()}")
            self.fallback_reason = r.stderr.strip()
        self.mode = "loopback"
        try:
            self._loopback_up()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        if self.mode == "loopback":
            for i in range(len(self._loop)):
                self._loopback_stop(i)
        else:
            self._script_down()

    def _script_down(self) -> None:
        r = subprocess.run(
            [str(SCRIPT), "down"], env=self._env(), capture_output=True, text=True, timeout=120
        )
        if r.returncode != 0:
            raise RuntimeError(f"testhosts.sh down failed (rc {r.returncode}): {r.stderr.strip()}")

    def _read_hosts_txt(self) -> None:
        self.hosts = []
        for idx, line in enumerate((self.base / "hosts.txt").read_text().splitlines()):
            name, ip, pub = line.split()
            self.hosts.append(
                TestHost(
                    name=name,
                    address=ip,
                    port=22,
                    user="root",
                    key_path=str(self.key_path),
                    host_key_pub=Path(pub).read_text().strip(),
                    base=str(Path(pub).parent),
                    index=idx,
                )
            )

    # ---- per-host helpers ----
    def _h(self, i: int | TestHost) -> TestHost:
        return i if isinstance(i, TestHost) else self.hosts[i]

    def supervisor_pid(self, i: int | TestHost) -> int:
        h = self._h(i)
        if self.mode != "netns":
            raise RuntimeError("no supervisor in loopback mode")
        return int((Path(h.base) / "supervisor.pid").read_text())

    def pids_in(self, i: int | TestHost, pattern: str) -> list[int]:
        """Pids of host i's processes whose command line matches the regex `pattern`. The hosts share the
        machine's pid namespace, so `pkill`/`pgrep` run inside one would see (and kill) every other host's,
        other workers' and other runs' processes too: a host's own are those in its mount namespace.
        Loopback mode has no isolation: every process of the machine counts."""
        own = os.stat(f"/proc/{self.supervisor_pid(i)}/ns/mnt").st_ino if self.mode == "netns" else None
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if own is not None and os.stat(proc / "ns" / "mnt").st_ino != own:
                    continue
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:  # gone meanwhile
                continue
            if re.search(pattern, cmdline):
                found.append(int(proc.name))
        return found

    def kill_in(self, i: int | TestHost, pattern: str, sig: int = signal.SIGTERM) -> list[int]:
        """Send `sig` to host i's processes matching `pattern` (see pids_in); the pids signalled."""
        hit = []
        for pid in self.pids_in(i, pattern):
            try:
                os.kill(pid, sig)
                hit.append(pid)
            except ProcessLookupError:
                pass
        return hit

    def state(self, i: int | TestHost) -> str:
        """netns: "up <boots> <sshd pid>" | "rebooting" | "stopped"."""
        try:
            return (Path(self._h(i).base) / "ctl" / "state").read_text().strip()
        except FileNotFoundError:
            return ""

    def boots(self, i: int | TestHost) -> int:
        """How many times the host has booted (1 after up; +1 per reboot)."""
        return int((Path(self._h(i).base) / "ctl" / "boots").read_text())

    def _request(self, h: TestHost, what: str) -> None:
        (Path(h.base) / "ctl" / f"{what}-request").touch()

    def _wait_state(self, h: TestHost, pred: Any, timeout: float, what: str) -> str:
        end = time.monotonic() + timeout
        while True:
            st = self.state(h)
            if pred(st):
                return st
            if time.monotonic() > end:
                raise TimeoutError(f"{h.name}: {what} (state {st!r}); see {h.base}/supervisor.log")
            time.sleep(0.02)

    def wait_up(self, i: int | TestHost, timeout: float = 15.0) -> None:
        h = self._h(i)
        wait_tcp(h.address, h.port, timeout)

    def exec_in(
        self,
        i: int | TestHost,
        cmd: str,
        *,
        check: bool = False,
        timeout: float = 30.0,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``bash -c cmd`` inside host i's namespaces (no SSH), as root with HOME=/root and the PATH an
        ssh session gets. Loopback mode: runs on the machine itself (no isolation)."""
        h = self._h(i)
        path = f"{SHIM_BIN_IN_HOST}:{STD_PATH}" if self.shims_dir else STD_PATH
        if self.mode == "netns":
            e = {"HOME": "/root", "PATH": path, "LANG": "C.UTF-8", **(env or {})}
            argv = [
                "nsenter",
                "-t",
                str(self.supervisor_pid(h)),
                "-n",
                "-m",
                "-u",
                "--",
                "env",
                "-i",
                *[f"{k}={v}" for k, v in e.items()],
                "bash",
                "-c",
                cmd,
            ]
        else:
            e = dict(os.environ)
            if self.shims_dir:
                e["PATH"] = f"{self.shims_dir}/bin:{e.get('PATH', STD_PATH)}"
            e.update(env or {})
            argv = ["bash", "-c", cmd]
            return subprocess.run(argv, env=e, capture_output=True, text=True, timeout=timeout, check=check)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=check)

    def kill_host(self, i: int | TestHost) -> None:
        """Make the host unreachable: every process in it dies and TCP connects to it time out (SYNs get
        no answer), so a client's connect fails with a timeout after its connect_timeout. Undo: restart(i)."""
        h = self._h(i)
        if self.mode == "loopback":
            self._loopback_stop(h.index)
            self._loopback_blackhole(h)
            return
        self._request(h, "stop")
        self._wait_state(h, lambda s: s == "stopped", 10, "stop")
        # the host sends nothing it generates itself (SYN-ACK, RST); ARP still answers, so no fast "no route"
        subprocess.run(
            ["ip", "-n", h.name, "rule", "add", "pref", "100", "iif", "lo", "blackhole"],
            check=False,
            capture_output=True,
        )

    def restart(self, i: int | TestHost, timeout: float = 15.0) -> None:
        """Restart the host's sshd (open sessions survive; host key and config re-read). Also revives a host
        after kill_host."""
        h = self._h(i)
        if self.mode == "loopback":
            self._loopback_stop(h.index)
            self._loopback_start(h.index)
            self.wait_up(h, timeout)
            return
        subprocess.run(["ip", "-n", h.name, "rule", "del", "pref", "100"], check=False, capture_output=True)
        old = self.state(h)
        self._request(h, "restart")
        self._wait_state(h, lambda s: s.startswith("up ") and s != old, timeout, "restart")
        self.wait_up(h, timeout)

    def reboot(self, i: int | TestHost, *, wait: bool = True, timeout: float = 15.0) -> None:
        """Same as running the `reboot` shim inside the host. With wait, returns when sshd accepts again."""
        h = self._h(i)
        if not self.supports_reboot:
            raise NotImplementedError("reboot needs netns mode")
        before = self.boots(h)
        self._request(h, "reboot")
        if wait:
            self.wait_rebooted(h, before, timeout)

    def wait_rebooted(self, i: int | TestHost, boots_before: int, timeout: float = 15.0) -> None:
        h = self._h(i)
        end = time.monotonic() + timeout
        while self.boots(h) <= boots_before or not self.state(h).startswith("up "):
            if time.monotonic() > end:
                raise TimeoutError(f"{h.name} did not come back from reboot in {timeout} s")
            time.sleep(0.02)
        self.wait_up(h, max(0.5, end - time.monotonic()))

    def change_host_key(self, i: int | TestHost) -> str:
        """New ed25519 host key, then restart its sshd. Returns (and stores in the TestHost) the new line."""
        h = self._h(i)
        key = Path(h.base) / "ssh_host_ed25519_key"
        tmp = Path(h.base) / "ssh_host_ed25519_key.new"
        for p in (tmp, Path(f"{tmp}.pub")):
            p.unlink(missing_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h.name, "-f", str(tmp)], check=True
        )
        os.replace(f"{tmp}.pub", f"{key}.pub")
        os.replace(tmp, key)
        h.host_key_pub = Path(f"{key}.pub").read_text().strip()
        self.restart(h)
        return h.host_key_pub

    @contextlib.contextmanager
    def also_at(self, i: int | TestHost, address: str) -> Iterator[None]:
        """Host i answers SSH at `address` too (on its eth0, on-link with the bridge's /24), as the host a second
        instance's address stands for; its sshd config and interface are as before on exit (netns mode only)."""
        h = self._h(i)
        if self.mode != "netns":
            raise NotImplementedError("a second address needs netns mode")
        config = Path(h.base) / "sshd_config"
        kept = config.read_text()
        subprocess.run(["ip", "-n", h.name, "addr", "add", f"{address}/24", "dev", "eth0"], check=True)
        try:
            config.write_text(kept.replace(f"ListenAddress {h.address}\n",
                                           f"ListenAddress {h.address}\nListenAddress {address}\n"))
            self.restart(h)
            wait_tcp(address, 22)
            yield
        finally:
            config.write_text(kept)
            self.restart(h)
            subprocess.run(["ip", "-n", h.name, "addr", "del", f"{address}/24", "dev", "eth0"], check=False,
                           capture_output=True)

    def write_known_hosts(self, path: str | os.PathLike[str] | None = None) -> Path:
        """An OpenSSH known_hosts file with every host's current key (default: <base>/known_hosts)."""
        p = Path(path) if path else self.base / "known_hosts"
        p.write_text("".join(h.known_hosts_line() + "\n" for h in self.hosts))
        return p

    # ---- loopback fallback ----
    def _loopback_up(self) -> None:
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        user = "root" if os.geteuid() == 0 else __import__("getpass").getuser()
        (self.base / "hosts.txt").write_text("")
        self.hosts, self._loop = [], []
        for idx in range(self.n):
            i = idx + 1
            name = f"{self.prefix}{i}"
            d = self.base / name
            d.mkdir(exist_ok=True)
            os.chmod(d, 0o755)
            key = d / "ssh_host_ed25519_key"
            if not key.exists():
                subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True
                )
            ak = d / "authorized_keys"
            ak.write_text(Path(f"{self.key_path}.pub").read_text())
            ak.chmod(0o644)
            addr, port = f"127.0.{self.loop_net}.{self.offset + i}", 2200 + self.offset + i
            setenv = f"SetEnv PATH={self.shims_dir}/bin:{STD_PATH}\n" if self.shims_dir else ""
            (d / "sshd_config").write_text(f"""Port {port}
ListenAddress {addr}
HostKey {key}
PidFile {d}/sshd.pid
AuthorizedKeysFile {ak}
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
MaxStartups 100:30:200
Subsystem sftp internal-sftp
LogLevel VERBOSE
{setenv}""")
            with open(self.base / "hosts.txt", "a") as f:
                f.write(f"{name} {addr} {key}.pub\n")
            self.hosts.append(
                TestHost(
                    name=name,
                    address=addr,
                    port=port,
                    user=user,
                    key_path=str(self.key_path),
                    host_key_pub=Path(f"{key}.pub").read_text().strip(),
                    base=str(d),
                    index=idx,
                )
            )
            self._loop.append(_Loop())
            self._loopback_start(idx)
        for h in self.hosts:
            self.wait_up(h, self.startup_timeout)

    def _loopback_start(self, idx: int) -> None:
        lp, h = self._loop[idx], self.hosts[idx]
        for s in lp.blockers:
            s.close()
        lp.blockers = []
        lp.log = open(Path(h.base) / "sshd.log", "ab")  # noqa: SIM115
        lp.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", f"{h.base}/sshd_config"],
            stdin=subprocess.DEVNULL,
            stdout=lp.log,
            stderr=subprocess.STDOUT,
        )

    def _loopback_stop(self, idx: int) -> None:
        lp = self._loop[idx]
        if lp.proc is not None:
            lp.proc.terminate()
            try:
                lp.proc.wait(10)
            except subprocess.TimeoutExpired:
                lp.proc.kill()
                lp.proc.wait(10)
            lp.proc = None
        if lp.log is not None:
            lp.log.close()
            lp.log = None
        for s in lp.blockers:
            s.close()
        lp.blockers = []

    def _loopback_blackhole(self, h: TestHost) -> None:
        """A listener with a full accept queue: the kernel drops new SYNs, so connects time out."""
        lp = self._loop[h.index]
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((h.address, h.port))
        srv.listen(0)
        lp.blockers.append(srv)
        for _ in range(4):
            c = socket.socket()
            c.settimeout(0.3)
            try:
                c.connect((h.address, h.port))
                lp.blockers.append(c)
            except OSError:
                c.close()
                break
