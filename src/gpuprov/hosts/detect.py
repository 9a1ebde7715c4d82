"""What a host is: its GPUs (from nvidia-smi when the driver is there, else lspci), NVSwitch, OS.

One shell command gathers the facts; parsing is pure, so it is tested on recorded outputs.

GPUs on the PCI bus are found by class, not by an allowlist of device ids: vendor 10de with PCI
class 0300 (VGA) or 0302 (3D controller); the catalog's device ids only name the model, and an
NVIDIA GPU whose id the catalog lacks is reported as "NVIDIA 10de:xxxx, unknown model".
NVSwitch presence comes from what NVIDIA's own tools read (NVSWITCH_SCAN), for every generation: NVIDIA
bridges on the PCI bus (class 0680: HGX A100/H100/H200, as aws-parallelcluster-cookbook PR #3098 counts them
by vendor + class) and, with the driver in, the devices under /proc/driver/nvidia-nvswitch; on HGX B200/B300
(NVLink 5) the NVSwitches are no PCI devices of the host but are managed through ConnectX-7 bridge functions
whose VPD carries SW_MNG; else the EC2 instance type (IMDSv2) when the catalog marks it `nvswitch`.

os-release is read by the shell's own `read` (no subshell). The EC2 instance type comes from IMDSv2, asked only
where DMI says EC2 (AWS's own test: Nitro's board_asset_tag is the instance id, the system UUID starts with ec2), so
a host elsewhere never waits on 169.254.169.254; an ECS instance's from ECS's metadata, where DMI says Alibaba
Cloud. An unknown GPU makes bootstrap ask for `--gpu`; `nvswitch_seen` says which evidence found NVSwitch. The facts
also carry `ID_LIKE`, the first package manager on PATH, the installed driver's version (nvidia-smi, else
/proc/driver/nvidia/version) and the `## login` line (root, sudo, or neither: plan/noroot.py). GPU names come from
nvidia-smi only when it exits 0 (a failing one prints its error on stdout), else from lspci. The architecture
(`uname -m`) and the CPU (Grace, Graviton, or x86's model name) decide which NVIDIA repositories and torch wheels
the host's plan takes (sbsa and aarch64 ones on an Arm host).
"""

from __future__ import annotations

import re
from collections import Counter

from pydantic import BaseModel, Field

from gpuprov.plan import oses

GPU_CLASSES = ("0300", "0302")  # VGA compatible controller, 3D controller (PCI class codes)
NVSWITCH_CLASS = "0680"  # "Bridge" (other bridge device): how NVSwitches of HGX A100/H100 show up

# IMDSv2, best effort (1 s timeouts), asked only where DMI says EC2: off EC2 a router may drop packets to
# 169.254.169.254, and every facts read would wait out the timeout. AWS's "Detect whether a host is an EC2
# instance" (EC2 User Guide): a Nitro instance's board_asset_tag is its instance id, and the
# system UUID starts with ec2/EC2; a Xen-based one says Xen (its UUID may be little-endian). No DMI at all (a
# microVM, a container without /sys): no EC2 GPU instance. Bash builtins only; the test hosts' DMI sits under
# their GPUPROV_SYSROOT, like every path the scripts read. An Alibaba Cloud ECS instance is told the same way, by its
# DMI (sys_vendor "Alibaba Cloud", product_name "Alibaba Cloud ECS", as hostnamectl shows an ECS instance's), and
# asked ECS's metadata (100.100.100.200, instance/instance-type, with its token) only then: its type is ecs.….
IMDS_INSTANCE_TYPE = (
    'echo "## instance-type"; '
    'dmi="${GPUPROV_SYSROOT:-}/sys/devices/virtual/dmi/id" ec2="" ecs=""; '
    "for f in sys_vendor bios_version board_asset_tag product_uuid product_name; do v=\"\"; "
    '[ -r "$dmi/$f" ] && read -r v < "$dmi/$f"; '
    'case "$f=$v" in sys_vendor=Amazon*|sys_vendor=Xen*|bios_version=*amazon*|board_asset_tag=i-*|'
    "product_uuid=[Ee][Cc]2*) ec2=1 ;; sys_vendor=Alibaba*|product_name=Alibaba*) ecs=1 ;; esac; done; "
    'if [ -n "$ec2" ] && command -v curl >/dev/null 2>&1; then '
    "t=\"$(curl -fsS --connect-timeout 1 --max-time 2 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' "
    "http://169.254.169.254/latest/api/token 2>/dev/null || true)\"; "
    "[ -n \"$t\" ] && curl -fsS --connect-timeout 1 --max-time 2 -H \"X-aws-ec2-metadata-token: $t\" "
    "http://169.254.169.254/latest/meta-data/instance-type 2>/dev/null; echo; "
    'elif [ -n "$ecs" ] && command -v curl >/dev/null 2>&1; then '
    "t=\"$(curl -fsS --connect-timeout 1 --max-time 2 -X PUT -H 'X-aliyun-ecs-metadata-token-ttl-seconds: 60' "
    "http://100.100.100.200/latest/api/token 2>/dev/null || true)\"; "
    "[ -n \"$t\" ] && curl -fsS --connect-timeout 1 --max-time 2 -H \"X-aliyun-ecs-metadata-token: $t\" "
    "http://100.100.100.200/latest/meta-data/instance/instance-type 2>/dev/null; echo; fi"
)

# NVSwitch as NVIDIA tells it (NVIDIA/gpu-driver-container nvidia-driver @ 06a208ca: `_assert_nvswitch_system`, a
# non-empty /proc/driver/nvidia-nvswitch/devices; `_assert_nvlink5_system`, any /sys/class/infiniband/*/device/vpd
# containing SW_MNG; Fabric Manager's start script reads the same VPD field, "SMDL=SW_MNG"). The VPD is read
# through /sys/bus/pci/devices too, for Mellanox functions (vendor 0x15b3), so gen 4 is found before mlx5_ib
# binds them: a ConnectX-7 NIC shares the bridge's PCI id (15b3:1021), only the VPD tells them apart.
# Printed: "proc DEV", "ib DEV" or "pci ADDRESS" per NVSwitch (management function) found.
NVSWITCH_SCAN = (
    'echo "## nvswitch"; r="${GPUPROV_SYSROOT:-}"; '
    'for d in "$r"/proc/driver/nvidia-nvswitch/devices/*; do if [ -e "$d" ]; then echo "proc ${d##*/}"; fi; done; '
    'for d in "$r"/sys/class/infiniband/*; do '
    'if [ -r "$d/device/vpd" ] && grep -qa SW_MNG "$d/device/vpd" 2>/dev/null; then echo "ib ${d##*/}"; fi; done; '
    'for d in "$r"/sys/bus/pci/devices/*; do v=""; if [ -r "$d/vendor" ]; then read -r v < "$d/vendor"; fi; '
    'if [ "$v" = 0x15b3 ] && [ -r "$d/vpd" ] && grep -qa SW_MNG "$d/vpd" 2>/dev/null; then echo "pci ${d##*/}"; fi; '
    "done"
)

# ID-VERSION_ID and ID_LIKE of os-release (os-release(5): shell-compatible KEY=value lines, values optionally
# quoted), the sysroot's own first, as doctor reads it (a test host presents its OS there), read by the shell's own
# `read` and `case`: sourcing it in a subshell cost the host a fork for every facts read. A missing file prints
# nothing; a missing key leaves its part empty, as sourcing did ("debian-" on sid has no VERSION_ID: no OS).
OS_RELEASE = (
    'f="${GPUPROV_SYSROOT:-}/etc/os-release"; [ -r "$f" ] || f=/etc/os-release; '
    "if [ -r \"$f\" ]; then i= v= l=; while IFS== read -r k x || [ -n \"$k\" ]; do "
    "x=${x#[\\\"\\']}; x=${x%[\\\"\\']}; case $k in ID) i=$x ;; VERSION_ID) v=$x ;; ID_LIKE) l=$x ;; esac; "
    'done < "$f"; echo "$i-$v"; echo "like $l"; fi'
)

# The package manager the host has (the family its steps need: apt or dnf), and any other Linux (`stack: none`
# playbooks run on any Linux with bash).
PACKAGE_MANAGER = (
    'echo "## package-manager"; for pm in apt-get dnf yum zypper pacman apk; do '
    'if command -v "$pm" >/dev/null 2>&1; then echo "$pm"; break; fi; done'
)

# The installed driver's version, for a host that keeps its driver (--keep-driver): nvidia-smi's, else the loaded
# kernel module's (/proc/driver/nvidia/version: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  ...").
DRIVER_VERSION = (
    'echo "## driver"; v=""; if command -v nvidia-smi >/dev/null 2>&1; then '
    'v="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null)" || v=""; v="${v%%$\'\\n\'*}"; fi; '
    'if [ -z "$v" ] && [ -r "${GPUPROV_SYSROOT:-}/proc/driver/nvidia/version" ]; then '
    'read -r v < "${GPUPROV_SYSROOT:-}/proc/driver/nvidia/version"; v="nvrm $v"; fi; echo "$v"'
)

# The CPU architecture (`uname -m`: x86_64, aarch64) and what names the CPU: on Arm, /proc/cpuinfo's implementer and
# part (the kernel's arm64 cpuinfo; 0x41 is Arm Ltd, whose Neoverse cores Grace and Graviton both use) and the SoC's
# JEP106 id (/sys/devices/soc0/soc_id, the SMCCC SoC id arm64 kernels publish: NVIDIA's code, bank 4 0x6b, prints
# as jep106:036b); on x86 the first "model name". Read by the shell's own `read`, under the sysroot as the rest.
CPU = (
    'echo "## cpu"; uname -m 2>/dev/null || echo unknown; r="${GPUPROV_SYSROOT:-}"; '
    'if [ -r "$r/proc/cpuinfo" ]; then m= i= p=; while IFS=: read -r k v; do k="${k%"${k##*[![:space:]]}"}"; '
    'v="${v#"${v%%[![:space:]]*}"}"; case $k in "model name") [ -n "$m" ] || m=$v ;; "CPU implementer") '
    '[ -n "$i" ] || i=$v ;; "CPU part") [ -n "$p" ] || p=$v ;; esac; done < "$r/proc/cpuinfo"; '
    'echo "model $m"; echo "implementer $i"; echo "part $p"; fi; '
    'if [ -r "$r/sys/devices/soc0/soc_id" ]; then read -r s < "$r/sys/devices/soc0/soc_id"; echo "soc $s"; fi'
)

# Separated by marker lines so each part can be empty without confusing the parser. Run it as root:
# a non-root nvidia-smi fails until the /dev/nvidia* nodes exist (a root nvidia-smi creates them).
FACTS_COMMAND = (
    "echo '## nvidia-smi'; "
    # only a successful nvidia-smi names GPUs: a failing one prints "NVIDIA-SMI has failed …" on stdout
    "if command -v nvidia-smi >/dev/null 2>&1 && smi=\"$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)\"; "
    "then printf '%s\\n' \"$smi\"; fi; "
    "echo '## lspci'; "
    "if command -v lspci >/dev/null 2>&1; then lspci -nn -d 10de: 2>/dev/null; else echo '## lspci-missing'; fi; "
    "echo '## os'; "
    + OS_RELEASE + "; "
    + PACKAGE_MANAGER + "; "
    + DRIVER_VERSION + "; "
    + NVSWITCH_SCAN + "; "
    + IMDS_INSTANCE_TYPE + "; "
    + CPU + "; "
    "echo '## end'"
)

_NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"\bGB300\b", "GB300"),
    (r"\bGB200\b", "GB200"),
    (r"\bGH200\b", "GH200"),
    (r"\bT4G\b", "T4G"),
    (r"\bB200\b", "B200"),
    (r"\bH200\b", "H200"),
    (r"\bH100\b", "H100"),
    (r"\bA100\b.*\b80\s*GB\b", "A100-80GB"),
    (r"\bA100\b", "A100-40GB"),
    (r"\bL40S\b", "L40S"),
    (r"\bL4\b", "L4"),
    (r"\bA10G\b", "A10G"),
    (r"\bV100\b", "V100"),
    (r"\bT4\b", "T4"),
)

_PCI_LINE = re.compile(r"\[(?P<cls>[0-9a-fA-F]{4})\]:.*\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\]")


class PciDevice(BaseModel):
    line: str
    pci_class: str  # "0302"
    vendor: str  # "10de"
    device: str  # "2901"

    @property
    def id(self) -> str:
        return f"{self.vendor}:{self.device}"


def pci_devices(lines: list[str]) -> list[PciDevice]:
    """Devices of `lspci -nn` lines (`BUS NAME [cccc]: VENDOR NAME [vvvv:dddd]`); other lines are skipped."""
    out = []
    for line in lines:
        if m := _PCI_LINE.search(line):
            out.append(PciDevice(line=line.strip(), pci_class=m["cls"].lower(), vendor=m["vendor"].lower(),
                                 device=m["device"].lower()))
    return out


def nvidia_gpus(devices: list[PciDevice]) -> list[PciDevice]:
    return [d for d in devices if d.vendor == "10de" and d.pci_class in GPU_CLASSES]


def nvidia_switches(devices: list[PciDevice]) -> list[PciDevice]:
    return [d for d in devices if d.vendor == "10de" and d.pci_class == NVSWITCH_CLASS]


def instance_has_nvswitch(instance_type: str | None) -> bool:
    if not instance_type:
        return False
    from gpuprov.plan import catalog  # here: a host off EC2 with no unknown GPU never reads the catalog

    return any(it.name == instance_type and it.nvswitch for it in catalog.load().instance_types)


class HostFacts(BaseModel):
    gpus: list[str]  # catalog names, one per GPU; "unknown" for an NVIDIA GPU not in the catalog
    nvswitch: bool
    os: str | None  # "ubuntu-22.04"
    source: str  # "nvidia-smi", "lspci" or "none"
    pci_gpu_count: int | None = None  # GPUs on the PCI bus, whatever the driver says; None without lspci
    unknown_pci_ids: list[str] = Field(default_factory=list)  # "10de:xxxx" of GPUs the catalog does not name
    instance_type: str | None = None  # from IMDSv2 on EC2, from ECS's metadata on Alibaba Cloud (ecs.…)
    nvswitch_seen: list[str] = Field(default_factory=list)  # what showed it: "bridge c5:00.0", "proc 0", "ib mlx5_8", …
    os_like: list[str] = Field(default_factory=list)  # /etc/os-release ID_LIKE: "rhel centos fedora"
    package_manager: str | None = None  # apt-get, dnf, …: the first of those on PATH
    driver_version: str | None = None  # the installed NVIDIA driver ("550.54.14"), from nvidia-smi or the module
    # bootstrap's first exec (runner.first_exec): the login's home when it has no root there (not uid 0, `sudo -n
    # true` fails); None: root, or not asked
    home: str | None = None
    arch: str | None = None  # `uname -m`: "x86_64", "aarch64"; None: not read (facts of an older gpuprov)
    cpu: str | None = None  # "Grace", "Graviton2", "Neoverse-V2", or x86's model name; None: not known

    @property
    def gpu(self) -> str | None:
        """The host's GPU model when all its GPUs are one model."""
        kinds = Counter(self.gpus)
        return next(iter(kinds)) if len(kinds) == 1 else None

    @property
    def unknown_gpu_text(self) -> str | None:
        """'NVIDIA 10de:2bb1, unknown model' when the host has NVIDIA GPUs the catalog does not name."""
        if "unknown" not in self.gpus:
            return None
        ids = ", ".join(dict.fromkeys(self.unknown_pci_ids)) or "GPU"
        return f"NVIDIA {ids}, unknown model"


# Arm Ltd's core part numbers (the kernel's arch/arm64/include/asm/cputype.h ARM_CPU_PART_*), and which Graviton each
# is on EC2: Graviton2 is Neoverse N1, Graviton3 V1, Graviton4 V2 (AWS's Graviton pages); Grace is Neoverse V2 too,
# told apart by the SoC's maker (NVIDIA's JEP106 code) or by EC2.
_ARM_PARTS = {"0xd0c": "Neoverse-N1", "0xd40": "Neoverse-V1", "0xd49": "Neoverse-N2", "0xd4f": "Neoverse-V2"}
_GRAVITON = {"0xd0c": "Graviton2", "0xd40": "Graviton3", "0xd4f": "Graviton4"}
NVIDIA_JEP106 = "jep106:036b"


def cpu_name(lines: list[str], on_ec2: bool) -> tuple[str | None, str | None]:
    """(architecture, CPU) of the `## cpu` section: the architecture as `uname -m` says it, the CPU by name."""
    arch = lines[0] if lines and lines[0] != "unknown" else None
    found = {key: value for key, _, value in (line.partition(" ") for line in lines[1:])}
    part, soc = found.get("part", "").lower(), found.get("soc", "").lower()
    if arch != "aarch64":
        return arch, found.get("model") or None
    if soc.startswith(NVIDIA_JEP106):
        return arch, "Grace"
    if on_ec2 and part in _GRAVITON:
        return arch, _GRAVITON[part]
    return arch, _ARM_PARTS.get(part) or (f"Arm part {part}" if part else None)


def gpu_from_name(name: str) -> str | None:
    """Catalog name for an nvidia-smi or lspci GPU name ('NVIDIA A100-SXM4-80GB' -> 'A100-80GB')."""
    for pattern, gpu in _NAME_RULES:
        if re.search(pattern, name, re.I):
            return gpu
    return None


def gpu_from_pci(device_id: str) -> str | None:
    from gpuprov.plan import catalog

    for gpu in catalog.load().gpus:
        if device_id.lower() in gpu.pci_device_ids:
            return gpu.name
    return None


def parse_facts(output: str) -> HostFacts:
    sections: dict[str, list[str]] = {}
    current = None
    for line in output.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        elif current and line.strip():
            sections[current].append(line.strip())
    pci = sections.get("lspci", [])
    devices = pci_devices(pci)
    pci_gpus = nvidia_gpus(devices)
    instance = next(iter(sections.get("instance-type") or []), None)
    seen = [f"bridge {d.line.split()[0]}" for d in nvidia_switches(devices)] + sections.get("nvswitch", [])
    nvswitch = bool(seen) or instance_has_nvswitch(instance)
    smi = sections.get("nvidia-smi", [])
    unknown_ids: list[str] = []
    if smi:
        gpus = [gpu_from_name(n) or "unknown" for n in smi]
        source = "nvidia-smi"
        if "unknown" in gpus:
            unknown_ids = [d.id for d in pci_gpus if gpu_from_pci(d.device) is None]
    else:
        gpus = []
        for d in pci_gpus:
            # the id names the model; else the host's own pci.ids name in the line ("GB100 [B200]")
            name = gpu_from_pci(d.device) or gpu_from_name(d.line.split("]:", 1)[-1].split(f"[{d.id}]")[0])
            if name is None:
                unknown_ids.append(d.id)
            gpus.append(name or "unknown")
        source = "lspci" if gpus else "none"
    os_lines = sections.get("os") or [""]
    os_name = None
    if m := re.fullmatch(r"(\w+)-\"?([\d.]+)\"?", os_lines[0]):
        os_name = oses.from_os_release(m.group(1), m.group(2))
    like = next((line.split()[1:] for line in os_lines[1:] if line.startswith("like")), [])
    driver_line = next(iter(sections.get("driver") or []), "")
    driver = re.search(r"(?:^|\s)(\d{3}\.\d+(?:\.\d+)?)(?:\s|$)", driver_line)
    arch, cpu = cpu_name(sections.get("cpu", []), on_ec2=instance is not None and not instance.startswith("ecs."))
    login = next(iter(sections.get("login") or []), "root")
    home = login.split(" ", 1)[1] if login.startswith("user ") else None
    has_lspci = "lspci" in sections and (bool(pci) or "lspci-missing" not in sections)
    return HostFacts(gpus=gpus, nvswitch=nvswitch, os=os_name, source=source,
                     pci_gpu_count=len(pci_gpus) if has_lspci and pci_gpus else None,
                     unknown_pci_ids=unknown_ids, instance_type=instance, nvswitch_seen=seen, os_like=like,
                     package_manager=next(iter(sections.get("package-manager") or []), None),
                     driver_version=driver.group(1) if driver else None, home=home, arch=arch, cpu=cpu)
