"""What a host is: its GPUs (from nvidia-smi when the driver is there, else lspci), NVSwitch, OS.

One shell command gathers the facts; parsing is pure, so it is tested on recorded outputs.
"""

from __future__ import annotations

import re
from collections import Counter

from pydantic import BaseModel

from gpuprov import catalog

NVSWITCH_PCI_IDS = ("1af1", "22a3", "2901")  # p4d/p4de, p5*, p6 (gpu-stack-facts §1b)

# Separated by marker lines so each part can be empty without confusing the parser. Run it as root:
# a non-root nvidia-smi fails until the /dev/nvidia* nodes exist (a root nvidia-smi creates them).
FACTS_COMMAND = (
    "echo '## nvidia-smi'; "
    "command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null; "
    "echo '## lspci'; "
    "if command -v lspci >/dev/null 2>&1; then lspci -nn -d 10de: 2>/dev/null; else echo '## lspci-missing'; fi; "
    "echo '## os'; "
    "( . /etc/os-release 2>/dev/null && echo \"$ID-$VERSION_ID\" ); "
    "echo '## end'"
)

_NAME_RULES: tuple[tuple[str, str], ...] = (
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


class HostFacts(BaseModel):
    gpus: list[str]  # catalog names, one per GPU; "unknown" for an NVIDIA GPU not in the catalog
    nvswitch: bool
    os: str | None  # "ubuntu-22.04"
    source: str  # "nvidia-smi", "lspci" or "none"
    pci_gpu_count: int | None = None  # GPUs on the PCI bus, whatever the driver says; None without lspci

    @property
    def gpu(self) -> str | None:
        """The host's GPU model when all its GPUs are one model."""
        kinds = Counter(self.gpus)
        return next(iter(kinds)) if len(kinds) == 1 else None


def gpu_from_name(name: str) -> str | None:
    """Catalog name for an nvidia-smi or lspci GPU name ('NVIDIA A100-SXM4-80GB' -> 'A100-80GB')."""
    for pattern, gpu in _NAME_RULES:
        if re.search(pattern, name, re.I):
            return gpu
    return None


def _gpu_from_pci(device_id: str) -> str | None:
    for gpu in catalog.load().gpus:
        if device_id in gpu.pci_device_ids:
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
    devices = [(line, m.group(1).lower()) for line in pci if (m := re.search(r"\[10de:([0-9a-fA-F]{4})\]", line))]
    nvswitch = any(i in NVSWITCH_PCI_IDS for _, i in devices)
    pci_gpus = [(line, i) for line, i in devices
                if i not in NVSWITCH_PCI_IDS and re.search(r"(3D|VGA|Display) controller", line)]
    smi = sections.get("nvidia-smi", [])
    if smi:
        gpus = [gpu_from_name(n) or "unknown" for n in smi]
        source = "nvidia-smi"
    else:
        gpus = [_gpu_from_pci(i) or gpu_from_name(line) or "unknown" for line, i in pci_gpus]
        source = "lspci" if gpus else "none"
    os_line = (sections.get("os") or [""])[0]
    os_name = None
    if m := re.fullmatch(r"(\w+)-\"?([\d.]+)\"?", os_line):
        os_name = f"{m.group(1)}-{m.group(2)}"
    has_lspci = "lspci" in sections and (bool(pci) or "lspci-missing" not in sections)
    return HostFacts(gpus=gpus, nvswitch=nvswitch, os=os_name, source=source,
                     pci_gpu_count=len(pci_gpus) if has_lspci and pci_gpus else None)
