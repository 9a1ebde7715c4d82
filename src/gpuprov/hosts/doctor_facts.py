"""What `gpuprov doctor` reads on a host: ONE shell command (run as root) that prints marked sections
(`## name` lines, each closed by `@rc N`, or `@missing` when its tool is absent), and `parse_facts`, which
turns that text into typed `DoctorFacts`. Pure apart from the command's text; tested on recorded outputs
(tests/fixtures/doctor/). hosts/doctor.py holds the rules that judge these facts.

Paths the test hosts keep under a sysroot (os-release, dpkg locks, /dev/nvidia*, the env) are
prefixed with `${GPUPROV_SYSROOT:-}`, the same convention as the rendered scripts (empty on real hosts).
"""

from __future__ import annotations

import re
import shlex

from pydantic import BaseModel, Field

from gpuprov.errors import GpuprovError
from gpuprov.hosts.check import DEFAULT_ENV
from gpuprov.hosts.detect import (
    IMDS_INSTANCE_TYPE,
    NVSWITCH_SCAN,
    instance_has_nvswitch,
    nvidia_gpus,
    nvidia_switches,
    pci_devices,
)
from gpuprov.hosts.findings import LOG as FINDINGS_LOG
from gpuprov.hosts.verify import parse_summary

DRIVER_PACKAGES = re.compile(r"^(nvidia-open|cuda-drivers|nvidia-driver-\d+(-server)?(-open)?|nvidia-driver)$")
FM_PACKAGES = re.compile(r"^(nvidia-fabricmanager(-\d+)?|cuda-drivers-fabricmanager(-\d+)?)$")
LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock")
UNITS = ("nvidia-persistenced", "nvidia-fabricmanager", "gpuprov-health")
_TORCH_SNIPPET = 'import torch; print("version", torch.__version__); print("cuda", torch.version.cuda)'


def facts_command(env_path: str = DEFAULT_ENV) -> str:
    """The one shell command (POSIX sh, run as root) that prints every section `parse_facts` reads."""
    env = shlex.quote(env_path)
    torch = shlex.quote(_TORCH_SNIPPET)
    locks = " ".join(f'"$R"{shlex.quote(p)}' for p in LOCKS)
    units = " ".join(UNITS)
    lines = [
        'R="${GPUPROV_SYSROOT:-}"',
        "have() { command -v \"$1\" >/dev/null 2>&1; }",
        # a hung GPU can hang nvidia-smi (and torch's import): bound them
        'tmo() { s="$1"; shift; if have timeout; then timeout "$s" "$@"; else "$@"; fi; }',
        # sec NAME CMD...: a section with CMD's output (stderr too) and exit status, or @missing
        'sec() { echo "## $1"; shift; if have "$1"; then "$@" 2>&1; echo "@rc $?"; else echo "@missing"; fi; }',
        'quiet() { echo "## $1"; shift; if have "$1"; then "$@" 2>/dev/null; echo "@rc $?"; else echo "@missing"; fi; }',
        'echo "## os"; f="$R/etc/os-release"; [ -r "$f" ] || f=/etc/os-release; '
        '( . "$f" 2>/dev/null && echo "$ID-$VERSION_ID" && echo "$PRETTY_NAME" )',
        'echo "## kernel"; uname -r',
        "sec lspci lspci -nn -d 10de:",
        "sec lsmod lsmod",
        "quiet dpkg dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'",
        "quiet held apt-mark showhold",
        "quiet modinfo-version modinfo -F version nvidia",
        "quiet modinfo-signer modinfo -F signer nvidia",
        'echo "## loaded-version"; cat /proc/driver/nvidia/version 2>/dev/null',
        "sec dkms dkms status",
        "sec secureboot mokutil --sb-state",
        "sec nvidia-smi tmo 60 nvidia-smi",
        f'echo "## units"; for u in {units}; do '
        'printf "%s %s %s\\n" "$u" "$(systemctl is-active "$u" 2>/dev/null | head -n1)" '
        '"$(systemctl is-enabled "$u" 2>/dev/null | head -n1)"; done',
        'echo "## dev"; ls -1d "$R"/dev/nvidia* 2>/dev/null',
        'echo "## modules-load"; cat "$R"/etc/modules-load.d/*.conf 2>/dev/null',
        NVSWITCH_SCAN,
        IMDS_INSTANCE_TYPE,
        f"sec lock fuser {locks}",
        "quiet apt-procs pgrep -a -x 'unattended-upgr|apt|apt-get|dpkg|aptd'",
        f'echo "## torch"; py="$R"{env}/bin/python; '
        f'if [ -x "$py" ]; then o="$(tmo 120 "$py" -c {torch} 2>&1)"; rc=$?; printf "%s\\n" "$o" | tail -n 5; '
        'echo "@rc $rc"; else echo "@missing"; fi',
        f'p="$R"{env}; while [ ! -e "$p" ]; do p="$(dirname "$p")"; done',
        'echo "## df"; df -P -k / "$p" 2>/dev/null; echo "## df-paths"; echo /; echo "$p"',
        # Xid lines in this boot's kernel log (journalctl, else dmesg), and the health watch's findings
        'echo "## xid"; { if have journalctl; then journalctl -k -o short-iso --no-pager -q 2>/dev/null; '
        'else dmesg 2>/dev/null; fi; } | grep "NVRM: Xid" | tail -n 50',
        f'echo "## health"; tail -n 50 "$R"{shlex.quote(FINDINGS_LOG)} 2>/dev/null',
        'echo "## end"',
    ]
    return "\n".join(lines)


class DoctorError(GpuprovError):
    """The doctor's facts could not be read."""


class Section(BaseModel):
    lines: list[str] = Field(default_factory=list)
    rc: int | None = None
    missing: bool = False  # the tool is not installed

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


class Unit(BaseModel):
    active: str  # "active", "inactive", "failed", "" (no such unit)
    enabled: str  # "enabled", "disabled", "" (no such unit)


class TorchFacts(BaseModel):
    found: bool  # the env's python exists
    version: str | None = None
    cuda: str | None = None  # torch.version.cuda; None for a CPU build
    error: str | None = None


class DiskFree(BaseModel):
    path: str  # the path asked about
    mount: str
    avail_gib: float


class DoctorFacts(BaseModel):
    env_path: str = DEFAULT_ENV
    os: str | None = None  # "ubuntu-22.04"
    os_pretty: str | None = None
    kernel: str | None = None
    pci: list[str] | None = None  # NVIDIA devices on the PCI bus; None: lspci missing
    modules: list[str] | None = None  # loaded kernel modules; None: lsmod missing
    packages: dict[str, str] | None = None  # installed package -> version; None: no dpkg
    held: list[str] = Field(default_factory=list)
    module_version: str | None = None  # the installed nvidia.ko (modinfo)
    module_signer: str | None = None
    loaded_version: str | None = None  # the loaded module (/proc/driver/nvidia/version)
    dkms: list[str] | None = None  # `dkms status` lines; None: dkms missing
    secure_boot: bool | None = None  # None: unknown (mokutil missing, no EFI)
    secure_boot_text: str | None = None
    smi_rc: int | None = None  # None: not run (missing)
    smi_output: str = ""
    driver_version: str | None = None  # from nvidia-smi
    cuda_version: str | None = None  # the highest CUDA the driver supports (nvidia-smi)
    units: dict[str, Unit] = Field(default_factory=dict)
    dev_nodes: list[str] = Field(default_factory=list)
    modules_load: list[str] = Field(default_factory=list)  # module names in /etc/modules-load.d/*.conf
    instance_type: str | None = None  # EC2 instance type (IMDSv2); None off EC2
    nvswitch_seen: list[str] = Field(default_factory=list)  # NVIDIA's own checks (detect.NVSWITCH_SCAN): "ib mlx5_8"
    persistence: list[bool] = Field(default_factory=list)  # per GPU: nvidia-smi's Persistence-M is On
    lock_checked: bool = False  # fuser was there to ask
    lock_holders: list[str] = Field(default_factory=list)  # "/var/lib/dpkg/lock-frontend: 1234"
    apt_processes: list[str] = Field(default_factory=list)  # "1234 /usr/bin/python3 /usr/bin/unattended-upgrade"
    torch: TorchFacts | None = None
    disk: list[DiskFree] = Field(default_factory=list)
    xid_lines: list[str] = Field(default_factory=list)  # "NVRM: Xid (PCI:…): N, …" lines of this boot's kernel log
    health: list[str] = Field(default_factory=list)  # the health watch's findings, JSON lines, oldest first

    @property
    def pci_gpus(self) -> list[str]:
        """NVIDIA GPUs on the bus: vendor 10de, PCI class 0300/0302 (detect.py)."""
        return [d.line for d in nvidia_gpus(pci_devices(self.pci or []))]

    @property
    def nvswitches(self) -> list[str]:
        """NVSwitches NVIDIA exposes as bridges (HGX A100/H100); HGX B200's are Mellanox devices."""
        return [d.line for d in nvidia_switches(pci_devices(self.pci or []))]

    @property
    def nvswitch_host(self) -> bool:
        return bool(self.nvswitches) or bool(self.nvswitch_seen) or instance_has_nvswitch(self.instance_type)

    @property
    def gpu_archs(self) -> set[str]:
        from gpuprov.hosts.detect import gpu_from_pci
        from gpuprov.plan.catalog import load

        names = {gpu_from_pci(line.rsplit("10de:", 1)[-1][:4]) for line in self.pci_gpus}
        return {g.arch for g in load().gpus if g.name in names}

    @property
    def driver_packages(self) -> dict[str, str]:
        return {n: v for n, v in (self.packages or {}).items() if DRIVER_PACKAGES.match(n)}

    @property
    def fm_packages(self) -> dict[str, str]:
        return {n: v for n, v in (self.packages or {}).items() if FM_PACKAGES.match(n)}

    def module_loaded(self, name: str) -> bool | None:
        return None if self.modules is None else name in self.modules


def split_sections(output: str) -> dict[str, Section]:
    sections: dict[str, Section] = {}
    current: Section | None = None
    for raw in output.splitlines():
        line = raw.rstrip()
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), Section())
        elif current is None:
            continue
        elif line == "@missing":
            current.missing = True
        elif m := re.fullmatch(r"@rc (\d+)", line):
            current.rc = int(m.group(1))
        elif line.strip():
            current.lines.append(line)
    return sections


def upstream_version(version: str) -> str:
    """'580.95.05-1' or '580.95.05-0ubuntu1' -> '580.95.05' (the Debian revision dropped)."""
    return version.split(":", 1)[-1].rsplit("-", 1)[0] if "-" in version else version.split(":", 1)[-1]


def parse_facts(output: str, env_path: str = DEFAULT_ENV) -> DoctorFacts:
    """Typed facts from the output of `facts_command()`; every section may be empty or missing."""
    s = split_sections(output)
    if "end" not in s:
        raise DoctorError("the doctor's fact command was cut off (no end marker)")
    empty = Section()
    f = DoctorFacts(env_path=env_path)
    os_lines = s.get("os", empty).lines
    if os_lines and (m := re.fullmatch(r"(\w+)-\"?([\d.]+)\"?", os_lines[0].strip())):
        f.os = f"{m.group(1)}-{m.group(2)}"
    f.os_pretty = os_lines[1].strip() if len(os_lines) > 1 else (os_lines[0].strip() if os_lines else None)
    kernel = s.get("kernel", empty).lines
    f.kernel = kernel[0].strip() if kernel else None

    lspci = s.get("lspci", empty)
    f.pci = None if lspci.missing else [line.strip() for line in lspci.lines if "[10de:" in line]
    lsmod = s.get("lsmod", empty)
    if not lsmod.missing and lsmod.rc == 0:
        f.modules = [line.split()[0] for line in lsmod.lines[1:] if line.split()]

    dpkg = s.get("dpkg", empty)
    if not dpkg.missing:
        f.packages = {}
        for line in dpkg.lines:
            parts = line.split("\t")
            # ${db:Status-Abbrev}: want/status/error flags; "ii " installed, "hi " installed + held
            if len(parts) >= 3 and len(parts[0]) >= 2 and parts[0][1] == "i":
                f.packages[parts[1].strip()] = parts[2].strip()
                if parts[0][0] == "h":
                    f.held.append(parts[1].strip())
    f.held += [line.strip() for line in s.get("held", empty).lines if line.strip() and line.strip() not in f.held]
    mv = s.get("modinfo-version", empty)
    f.module_version = mv.lines[0].strip() if mv.rc == 0 and mv.lines else None
    signer = s.get("modinfo-signer", empty)
    f.module_signer = signer.lines[0].strip() if signer.rc == 0 and signer.lines else None
    loaded = s.get("loaded-version", empty).text
    if m := re.search(r"Kernel Module(?: for \S+)?\s+([\d.]+)", loaded):
        f.loaded_version = m.group(1)
    dkms = s.get("dkms", empty)
    f.dkms = None if dkms.missing else [line.strip() for line in dkms.lines]

    sb = s.get("secureboot", empty)
    if not sb.missing and sb.lines:
        f.secure_boot_text = sb.lines[0].strip()
        low = sb.text.lower()
        f.secure_boot = True if "secureboot enabled" in low else False if "secureboot disabled" in low else None

    smi = s.get("nvidia-smi", empty)
    if not smi.missing:
        f.smi_rc, f.smi_output = smi.rc, smi.text
        if smi.rc == 0:
            f.driver_version, f.cuda_version = parse_summary(smi.text)
        elif m := re.search(r"NVML library version:\s*([\d.]+)", smi.text):
            f.driver_version = m.group(1)  # the userspace side of a mismatch

    for line in s.get("units", empty).lines:
        parts = line.split()
        if parts:
            f.units[parts[0]] = Unit(active=parts[1] if len(parts) > 1 else "", enabled=parts[2] if len(parts) > 2 else "")
    f.dev_nodes = [line.strip() for line in s.get("dev", empty).lines]
    f.modules_load = [line.split("#")[0].strip() for line in s.get("modules-load", empty).lines
                      if line.split("#")[0].strip()]
    it = s.get("instance-type", empty).lines
    f.instance_type = it[0].strip() if it else None
    f.nvswitch_seen = [line.strip() for line in s.get("nvswitch", empty).lines if line.strip()]
    # the summary table's GPU rows: "|   0  NVIDIA L4    On  |   00000000:31:00.0 Off |"
    f.persistence = [m.group(1) == "On" for m in re.finditer(r"^\|\s+\d+\s+.+?\s(On|Off)\s+\|\s+[0-9A-Fa-f]{8}:",
                                                                f.smi_output, re.M)] if f.smi_rc == 0 else []

    lock = s.get("lock", empty)
    f.lock_checked = not lock.missing
    # fuser prints "PATH:" on stderr and " PID..." on stdout; both land on one line here
    f.lock_holders = [" ".join(line.split()) for line in lock.lines if re.search(r":\s*\d+", line)]
    f.apt_processes = [line.strip() for line in s.get("apt-procs", empty).lines]

    torch = s.get("torch", empty)
    if "torch" in s:
        if torch.missing:
            f.torch = TorchFacts(found=False)
        else:
            values = dict(line.split(" ", 1) for line in torch.lines if line.startswith(("version ", "cuda ")))
            if torch.rc == 0 and "version" in values:
                cuda = values.get("cuda", "None").strip()
                f.torch = TorchFacts(found=True, version=values["version"].strip(), cuda=None if cuda == "None" else cuda)
            else:
                why = torch.lines[-1].strip() if torch.lines else f"exit {torch.rc}"
                f.torch = TorchFacts(found=True, error=why)

    paths = s.get("df-paths", empty).lines
    for i, line in enumerate(s.get("df", empty).lines[1:]):
        parts = line.split()
        # POSIX df -P -k: Filesystem 1024-blocks Used Available Capacity Mounted-on
        if len(parts) >= 6 and parts[3].isdigit():
            path = paths[i] if i < len(paths) else parts[-1]
            f.disk.append(DiskFree(path=path, mount=" ".join(parts[5:]), avail_gib=int(parts[3]) / 1024 / 1024))
    f.xid_lines = [line.strip() for line in s.get("xid", empty).lines if "NVRM: Xid" in line]
    f.health = [line.strip() for line in s.get("health", empty).lines if line.strip().startswith("{")]
    return f
