"""A recorded HGX B200 host's sysfs (tests/fixtures/hgx-b200): its InfiniBand devices and their PCI functions'
VPD, where four ConnectX-7 functions are NVSwitch management functions (VPD field SMDL=SW_MNG) and eight are
plain NICs with the same PCI id. `tarball()` packs it for a test host's sysroot; `install()` unpacks it there."""

from __future__ import annotations

import base64
import io
import struct
import tarfile
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "fixtures" / "hgx-b200" / "infiniband.tsv"


def devices() -> list[tuple[str, str, str]]:
    """(ib device, PCI function, role) of the recorded host."""
    return [tuple(line.split("\t")) for line in TABLE.read_text().splitlines()  # type: ignore[misc]
            if line and not line.startswith("#")]


def vpd(role: str, serial: str) -> bytes:
    """A PCI VPD image (identifier string, VPD-R keywords, end tag); an NVSwitch function's says SMDL=SW_MNG."""
    name = b"NVIDIA ConnectX-7 HHHL adapter card" if role == "nic" else b"NVIDIA ConnectX-7 NVLink management function"
    keywords = [(b"PN", b"MCX75310AAS-NEAT" if role == "nic" else b"699-2G525-0200"), (b"EC", b"A7"),
                (b"SN", serial.encode()), (b"V2", b"MCX75310AAS-NEAT" if role == "nic" else b"SMDL=SW_MNG")]
    body = b"".join(k + bytes([len(v)]) + v for k, v in keywords)
    body += b"RV" + b"\x01" + b"\x00"  # checksum keyword (value not computed: nothing here checks it)
    return b"\x82" + struct.pack("<H", len(name)) + name + b"\x90" + struct.pack("<H", len(body)) + body + b"\x78"


def tarball() -> bytes:
    """sys/bus/pci/devices/<fn>/{vendor,device,class,vpd} and sys/class/infiniband/<dev>/device -> the function."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        def add(path: str, data: bytes) -> None:
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o444
            tar.addfile(info, io.BytesIO(data))

        for n, (ib, fn, role) in enumerate(devices()):
            base = f"sys/bus/pci/devices/{fn}"
            add(f"{base}/vendor", b"0x15b3\n")
            add(f"{base}/device", b"0x1021\n")
            add(f"{base}/class", b"0x020700\n")
            add(f"{base}/vpd", vpd(role, f"MT25{n:04d}X0000"))
            link = tarfile.TarInfo(f"sys/class/infiniband/{ib}/device")
            link.type, link.linkname = tarfile.SYMTYPE, f"../../../bus/pci/devices/{fn}"
            tar.addfile(link)
    return out.getvalue()


def install(sysroot: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(tarball()), mode="r:gz") as tar:
        tar.extractall(sysroot, filter="fully_trusted")


def install_command() -> str:
    """A shell command that writes the same tree under ${GPUPROV_SYSROOT} (an SSH test host)."""
    data = base64.b64encode(tarball()).decode()
    return f'mkdir -p "$GPUPROV_SYSROOT" && printf %s {data} | base64 -d | tar -C "$GPUPROV_SYSROOT" -xzf -'
