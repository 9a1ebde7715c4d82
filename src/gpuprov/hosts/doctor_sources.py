"""`gpuprov doctor HOST --sources`: from the host itself, time a small fetch from each configured source and from
each preset's, and name, per key of the sources map, the fastest that works.

A small file per kind (PROBES): NVIDIA's repository index for the host's OS and architecture (an apt repository's
InRelease, a dnf one's repodata/repomd.xml; Ubuntu 24.04's on an OS gpuprov does not know), a
simple-index page (PyPI's, PyTorch's), the uv installer, the pinned Miniforge release's .sha256, Docker's .repo
file, the container toolkit's gpgkey. One shell command on the host fetches them all at once (curl, each bounded
by --timeout); a source that does not answer, or answers an HTTP error, is said as such with what curl said.
Parsing and judging are pure (`judge`), so they are tested on recorded output too.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from pydantic import BaseModel

from gpuprov.hosts.fanout import run_parallel
from gpuprov.hosts.remote import HostOutcome, HostSettings, Remote, on_host
from gpuprov.plan import sources
from gpuprov.plan.inventory import Target

# key -> the small file under its base URL that stands for it ("" : the URL itself); {repo}: NVIDIA's repository
# folder and its index file for the host's OS and architecture
PROBES: dict[str, str] = {
    "nvidia": "/{repo}",
    "pypi": "/pip/",
    "torch": "/filelock/",
    "uv": "/{uv}/uv-x86_64-unknown-linux-musl.tar.gz.sha256",
    "miniforge": "/{miniforge}/Miniforge3-{miniforge}-Linux-x86_64.sh.sha256",
    "docker": "/centos/docker-ce.repo",
    "container_toolkit": "/gpgkey",
    "epel": "/RPM-GPG-KEY-EPEL-9",
    "conda": "/conda-forge/",
    "awscli": "/awscli-exe-linux-x86_64.zip.sig",
    "ubuntu": "/dists/noble/Release.gpg",
    "ubuntu_ports": "/dists/noble/Release.gpg",
    "rocky": "/RPM-GPG-KEY-Rocky-9",
}
MARK = "GPUPROV_SOURCE"


@dataclass(frozen=True)
class Probe:
    key: str
    source: str  # "configured" or a preset's name
    url: str  # the file fetched


class Timed(BaseModel):
    key: str
    source: str
    url: str
    ok: bool
    seconds: float | None = None  # the whole fetch, when it worked
    problem: str = ""  # why not: "unreachable: …", "HTTP 404"


class SourcesReport(BaseModel):
    host: str
    timed: list[Timed]

    @property
    def ok(self) -> bool:
        """Every key has a source that works from the host."""
        return all(self.fastest(k) is not None for k in dict.fromkeys(t.key for t in self.timed))

    def fastest(self, key: str) -> Timed | None:
        working = [t for t in self.timed if t.key == key and t.ok and t.seconds is not None]
        return min(working, key=lambda t: t.seconds or 0.0) if working else None


def nvidia_index(os_name: str | None, arch: str) -> str:
    """NVIDIA's repository index file for the OS (`ubuntu-24.04`, `rocky-9`) and `uname -m`, under its base."""
    from gpuprov.plan import oses

    known = os_name in oses.names()
    repo, family = (oses.info(os_name).repo, oses.family(os_name)) if known and os_name else ("ubuntu2404", "apt")
    folder = "sbsa" if arch == "aarch64" else "x86_64"
    return f"{repo}/{folder}/" + ("InRelease" if family == "apt" else "repodata/repomd.xml")


def probes(configured: sources.Effective, arch: str = "x86_64", os_name: str | None = None) -> list[Probe]:
    """What to fetch: each key of the configured map, then each preset's keys (a URL fetched once)."""
    index = nvidia_index(os_name, arch)
    version = sources.installers()["miniforge"].version
    uv = sources.installers()["uv"].version

    def url(key: str, base: str) -> str:
        return base + PROBES.get(key, "/").format(repo=index, miniforge=version, uv=uv)

    out = [Probe(k, "configured", url(k, configured.urls[k])) for k in sources.KEYS]
    seen = {p.url for p in out}
    for name, preset in sources.presets().items():
        for key in sources.KEYS:
            base = getattr(preset.urls, key)
            if base and url(key, base) not in seen:
                seen.add(url(key, base))
                out.append(Probe(key, name, url(key, base)))
    return out


def command(batch: list[Probe], timeout: float) -> str:
    """One shell command that fetches every probe at once and prints one MARK line for each."""
    lines = []
    for i, p in enumerate(batch):
        lines.append(f"( r=$(curl -sS -L -o /dev/null --max-time {timeout:g} -w '%{{http_code}} %{{time_total}}' "
                     f"{shlex.quote(p.url)} 2>&1 | tr '\\n' ' '); echo \"{MARK} {i} $r\" ) &")
    return ("command -v curl >/dev/null || { echo 'curl is not installed on the host' >&2; exit 3; }\n"
            + "\n".join(lines) + "\nwait\n")


def judge(host: str, batch: list[Probe], output: str) -> SourcesReport:
    """The host's MARK lines -> each probe timed, or why it failed."""
    said: dict[int, str] = {}
    for line in output.splitlines():
        if line.startswith(MARK + " "):
            _, index, *rest = line.split(" ", 2)
            said[int(index)] = rest[0].strip() if rest else ""
    timed = []
    for i, p in enumerate(batch):
        text = said.get(i, "")
        # the -w line ("200 0.042") and, on a failure, curl's error, in either order
        found = re.search(r"(?<![\d.])(\d{3}) (\d+(?:[.,]\d+)?)(?![\d.])", text)
        code, secs = (found.group(1), found.group(2).replace(",", ".")) if found else ("000", "0")
        error = (text[:found.start()] + text[found.end():] if found else text).strip().removeprefix("curl: ")
        if code.startswith("2"):
            timed.append(Timed(key=p.key, source=p.source, url=p.url, ok=True, seconds=float(secs)))
        elif code == "000":
            timed.append(Timed(key=p.key, source=p.source, url=p.url, ok=False,
                               problem=f"unreachable: {error or 'no answer'}"))
        else:
            timed.append(Timed(key=p.key, source=p.source, url=p.url, ok=False, problem=f"HTTP {code}"))
    return SourcesReport(host=host, timed=timed)


def _time_sources(remote: Remote, target: Target, configured: sources.Effective, timeout: float) -> SourcesReport:
    from gpuprov.plan import oses

    said = remote.run('uname -m; . /etc/os-release 2>/dev/null; echo "${ID:-} ${VERSION_ID:-}"', timeout=30)
    arch, _, release = said.stdout.strip().partition("\n")
    os_id, _, version = release.strip().partition(" ")
    batch = probes(configured, arch.strip(), oses.from_os_release(os_id, version) if os_id else None)
    out = remote.run(command(batch, timeout), timeout=timeout + 60)
    if MARK not in out.stdout:
        from gpuprov.hosts.doctor_facts import DoctorError

        raise DoctorError(f"no source was timed (exit {out.exited}): {(out.stderr or out.stdout).strip()[:300]}")
    return judge(target.name, batch, out.stdout)


def time_sources(targets: list[Target], settings: HostSettings, configured: sources.Effective, timeout: float = 5.0,
                 parallel: int = 32) -> list[HostOutcome[SourcesReport]]:
    return run_parallel(targets, lambda t: on_host(t, settings, lambda r: _time_sources(r, t, configured, timeout)),
                        parallel)
