"""Parse the verify probe's output into a typed report, and judge it against what was expected.

The probe (templates/probe.py.j2) runs on the host and prints one JSON object between
GPUPROV_PROBE_BEGIN / GPUPROV_PROBE_END: raw nvidia-smi outputs plus what torch reports. The
raw text is parsed here, so parsers are tested on recorded real outputs (tests/fixtures/).
Each failed check carries the reason and the fix, in one line each.

The probe (standard library + optional torch) prints the raw `nvidia-smi --query-gpu=... --format=csv,noheader,
nounits` output, the plain `nvidia-smi` header (for "CUDA Version"), /dev/nvidia* and torch's facts with a 256x256
matmul per GPU checked against the CPU. The verify step runs it and the step's own verdict in one Python process
(templates/verify.sh.j2: the sources read into variables by bash, no temporary file), the probe's JSON on stdout,
the verdict on a descriptor of its own. A matmul that fails with "no kernel image is available" names the
`--torch-cuda` build of the same release that carries the GPU's arch (plan/compat.variants_with_sass).
"""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuprov.errors import GpuprovError

QUERY_FIELDS = (
    "index,name,uuid,pci.bus_id,driver_version,memory.total,memory.used,utilization.gpu,"
    "temperature.gpu,power.draw,persistence_mode,ecc.errors.uncorrected.volatile.total,compute_cap"
)
BEGIN, END = "GPUPROV_PROBE_BEGIN", "GPUPROV_PROBE_END"


class ProbeError(GpuprovError):
    """The probe's output could not be read."""


class _Probed(BaseModel):
    """Built on first use, not at import: bootstrap imports these types, and only a verify step uses them."""

    model_config = ConfigDict(defer_build=True)


class GpuInfo(_Probed):
    model_config = ConfigDict(frozen=True)

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    driver_version: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    utilization_pct: int | None
    temperature_c: int | None
    power_w: float | None
    persistence_mode: bool | None
    ecc_uncorrected: int | None
    compute_cap: str | None


class TorchDevice(_Probed):
    index: int
    name: str
    capability: tuple[int, int]
    memory_mib: int
    matmul_ok: bool
    max_abs_err: float | None = None
    error: str | None = None


class TorchInfo(_Probed):
    version: str | None = None
    cuda: str | None = None
    is_available: bool = False
    device_count: int = 0
    arch_list: list[str] = Field(default_factory=list)
    nccl: str | None = None
    devices: list[TorchDevice] = Field(default_factory=list)
    error: str | None = None


class Check(_Probed):
    name: str
    ok: bool
    detail: str
    fix: str | None = None
    severity: Literal["fail", "warn"] = "fail"


def passed(checks: list[Check]) -> bool:
    """No failure among the checks (warnings allowed)."""
    return not failed(checks)


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if not c.ok and c.severity == "fail"]


class Expectation(_Probed):
    """What the host should show: from the plan (GPU, count, torch) or from the user."""

    gpu: str | None = None  # catalog name, e.g. "A100-40GB"
    gpu_count: int | None = None
    torch: bool = False
    torch_cuda: str | None = None  # "12.8"
    cpu_only: bool = False  # a node on a CPU-only type (plan/cpu.py): no GPU checks; torch checked without CUDA


class CheckReport(_Probed):
    host: str
    hostname: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # the highest CUDA the driver supports
    gpus: list[GpuInfo] = Field(default_factory=list)
    dev_nodes: list[str] = Field(default_factory=list)
    nvidia_smi_error: str | None = None
    torch: TorchInfo | None = None
    checks: list[Check] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return passed(self.checks)

    @property
    def failures(self) -> list[Check]:
        return failed(self.checks)


# --- parsers ----------------------------------------------------------------------------------


def _na(value: str) -> str | None:
    value = value.strip()
    return None if not value or value.startswith("[") or value in ("N/A", "Not Supported") else value


def _int(value: str) -> int | None:
    v = _na(value)
    return int(float(v)) if v is not None else None


def parse_query_csv(text: str) -> list[GpuInfo]:
    """Rows of `nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits`."""
    gpus = []
    for row in csv.reader(io.StringIO(text.strip()), skipinitialspace=True):
        if not row or len(row) < 13:
            continue
        power = _na(row[9])
        persistence = _na(row[10])
        gpus.append(GpuInfo(
            index=int(row[0]), name=row[1].strip(), uuid=row[2].strip(), pci_bus_id=row[3].strip(),
            driver_version=row[4].strip(), memory_total_mib=_int(row[5]), memory_used_mib=_int(row[6]),
            utilization_pct=_int(row[7]), temperature_c=_int(row[8]), power_w=float(power) if power else None,
            persistence_mode=None if persistence is None else persistence.lower() == "enabled",
            ecc_uncorrected=_int(row[11]), compute_cap=_na(row[12]),
        ))
    return gpus


def parse_summary(text: str) -> tuple[str | None, str | None]:
    """(driver version, CUDA version) from the header of plain `nvidia-smi` output."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", text)
    return (driver.group(1) if driver else None, cuda.group(1) if cuda else None)


def extract_probe(output: str) -> dict[str, Any]:
    """The JSON object between the probe's markers in a command's stdout."""
    match = re.search(rf"^{BEGIN}\s*$(.*?)^{END}\s*$", output, re.S | re.M)
    if not match:
        raise ProbeError("the verify probe printed no result (was it cut off?)")
    try:
        data = json.loads(match.group(1))
    except json.JSONDecodeError as exc:
        raise ProbeError(f"the verify probe's JSON is unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise ProbeError("the verify probe's JSON is not an object")
    return data


def parse_probe(host: str, data: dict[str, Any]) -> CheckReport:
    smi = data.get("nvidia_smi") or {}
    report = CheckReport(host=host, hostname=data.get("hostname"), dev_nodes=list(data.get("dev_nodes") or []))
    if not smi.get("found"):
        report.nvidia_smi_error = "nvidia-smi not found"
    elif smi.get("returncode") not in (0, None):
        # nvidia-smi prints some failures (NVML init) on stdout, others on stderr
        texts = (smi.get("stderr"), smi.get("query_csv"), smi.get("summary"))
        report.nvidia_smi_error = next((t.strip() for t in texts if t and t.strip()), f"exit {smi.get('returncode')}")
    else:
        report.gpus = parse_query_csv(smi.get("query_csv") or "")
        report.driver_version, report.cuda_driver_version = parse_summary(smi.get("summary") or "")
        if report.driver_version is None and report.gpus:
            report.driver_version = report.gpus[0].driver_version
    if data.get("torch") is not None:
        report.torch = TorchInfo.model_validate(data["torch"])
    return report


# --- judging ----------------------------------------------------------------------------------


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def _smi_failure(error: str) -> Check:
    low = error.lower()
    if "version mismatch" in low:
        return Check(name="nvidia-smi", ok=False, detail="Driver/library version mismatch: the driver's userspace was "
                     "upgraded but the old kernel module is still loaded",
                     fix="reboot the host; then hold the driver packages (apt-mark hold) so unattended-upgrades can't repeat it")
    if "couldn't communicate" in low or "communicate with the nvidia driver" in low:
        return Check(name="nvidia-smi", ok=False, detail="the NVIDIA kernel module is not loaded",
                     fix="check `dkms status` and headers for `uname -r`, Secure Boot, then reboot")
    if "no devices were found" in low:
        return Check(name="nvidia-smi", ok=False, detail="no GPU visible to the driver",
                     fix="check the instance type and `lspci -d 10de:`; on NVSwitch systems start nvidia-fabricmanager")
    if "not found" in low:
        return Check(name="nvidia-smi", ok=False, detail="nvidia-smi is not installed",
                     fix="run `gpuprov bootstrap` with a GPU playbook (installs the driver)")
    return Check(name="nvidia-smi", ok=False, detail=error.splitlines()[0][:200], fix="run `gpuprov doctor` on the host")


def judge(report: CheckReport, expect: Expectation) -> CheckReport:
    """Fill report.checks: each expectation met or not, with the fix when not."""
    if expect.cpu_only:
        return _judge_cpu_only(report, expect)
    checks: list[Check] = []
    if report.nvidia_smi_error:
        checks.append(_smi_failure(report.nvidia_smi_error))
    else:
        checks.append(Check(name="nvidia-smi", ok=True,
                            detail=f"driver {report.driver_version}, supports CUDA ≤ {report.cuda_driver_version}"))
        n = len(report.gpus)
        checks.append(Check(name="gpus visible", ok=n > 0, detail=f"{n} GPU(s)" + (
            f": {report.gpus[0].name}" if n else ""), fix=None if n else "check `lspci -d 10de:` and the instance type"))
        if expect.gpu_count is not None:
            checks.append(Check(
                name="gpu count", ok=n >= expect.gpu_count, detail=f"{n} visible, {expect.gpu_count} expected",
                fix=None if n >= expect.gpu_count else
                "a GPU fell off the bus or is held back: check `dmesg | grep -i xid`, reboot, or replace the instance",
            ))
        if expect.gpu and report.gpus:
            from gpuprov.hosts.detect import gpu_from_name

            seen = {gpu_from_name(g.name) for g in report.gpus}
            ok = seen == {expect.gpu}
            checks.append(Check(name="gpu model", ok=ok, detail=f"{', '.join(sorted(s or '?' for s in seen))}"
                                f" (expected {expect.gpu})", fix=None if ok else "check --gpu against the host"))
        no_pm = [g.index for g in report.gpus if g.persistence_mode is False]
        if no_pm:
            # enabling the packaged unit is not enough: it runs nvidia-persistenced --no-persistence-mode
            checks.append(Check(name="persistence", ok=False, severity="warn",
                                detail=f"persistence mode off on GPU {', '.join(map(str, no_pm))} (nvidia-smi "
                                "persistence_mode: Disabled)",
                                fix="run nvidia-persistenced with --persistence-mode (a systemd drop-in; rerun "
                                "`gpuprov bootstrap`, whose persistence step writes it)"))
        elif report.gpus and all(g.persistence_mode for g in report.gpus):
            checks.append(Check(name="persistence", ok=True, detail="persistence mode enabled on every GPU"))
        ecc = [g.index for g in report.gpus if g.ecc_uncorrected]
        if ecc:
            checks.append(Check(name="ecc", ok=False, detail=f"uncorrected ECC errors on GPU {', '.join(map(str, ecc))}",
                                fix="reset the GPU (nvidia-smi -r) or replace the instance"))
    if report.gpus and not report.dev_nodes:
        checks.append(Check(name="device nodes", ok=False, detail="no /dev/nvidia* nodes",
                            fix="run `sudo nvidia-smi` once, or enable nvidia-persistenced"))
    if expect.torch or report.torch is not None:
        checks.extend(_torch_checks(report, expect))
    report.checks = checks
    return report


def _judge_cpu_only(report: CheckReport, expect: Expectation) -> CheckReport:
    """A CPU-only node has no GPU to fail: no nvidia-smi, driver or matmul on a GPU; torch (its CPU wheel) imports."""
    checks = [Check(name="gpu", ok=True, detail="none: a CPU-only node, so no nvidia-smi, driver or GPU checks")]
    t = report.torch
    if t is None:
        if expect.torch:
            checks.append(Check(name="torch", ok=False, detail="torch is not importable in the env",
                                fix="rerun `gpuprov bootstrap` (pytorch step)"))
    else:
        ok = t.version is not None and t.error is None
        checks.append(Check(name="torch", ok=ok, detail=f"torch {t.version} on the CPU, "
                            + (f"built for CUDA {t.cuda}" if t.cuda else "no CUDA (the CPU wheel)")
                            + (f"; {t.error}" if t.error else ""),
                            fix=None if ok else "rerun `gpuprov bootstrap` (pytorch step)"))
    report.checks = checks
    return report


def _torch_checks(report: CheckReport, expect: Expectation) -> list[Check]:
    t = report.torch
    if t is None:
        return [Check(name="torch", ok=False, detail="torch is not importable in the env",
                      fix="rerun `gpuprov bootstrap` (pytorch step)")]
    checks = [Check(name="torch", ok=t.version is not None and t.error is None,
                    detail=f"torch {t.version} built for CUDA {t.cuda}, NCCL {t.nccl or 'n/a'}"
                    + (f"; {t.error}" if t.error else ""))]
    driver_cuda = report.cuda_driver_version
    from gpuprov.plan.stack import minor_compat_runs

    torch_cuda = ".".join(t.cuda.split(".")[:2]) if t.cuda else None
    if (torch_cuda and driver_cuda and report.driver_version and _v(torch_cuda) > _v(driver_cuda)[:2]
            and minor_compat_runs(torch_cuda, report.driver_version)):
        checks.append(Check(name="torch vs driver", ok=True, severity="warn",
                            detail=f"torch is built for CUDA {t.cuda}, driver {report.driver_version} supports CUDA ≤ "
                            f"{driver_cuda}: it runs through CUDA minor-version compatibility (limited feature set, "
                            "no PTX JIT of newer code)"))
    elif t.cuda and driver_cuda and _v(t.cuda)[:2] > _v(driver_cuda)[:2]:
        from gpuprov.plan.stack import facts

        minimum = facts().cuda_min_driver.get(".".join(t.cuda.split(".")[:2]))
        need = f" (≥ {minimum.driver})" if minimum else ""
        checks.append(Check(
            name="torch vs driver", ok=False,
            detail=f"torch is built for CUDA {t.cuda} but driver {report.driver_version} supports CUDA ≤ {driver_cuda}",
            fix=f"upgrade the driver{need}, or install a torch wheel for CUDA ≤ {driver_cuda} (--torch-cuda)",
        ))
    if expect.torch_cuda and t.cuda and _v(t.cuda)[:2] != _v(expect.torch_cuda)[:2]:
        checks.append(Check(name="torch build", ok=False, detail=f"CUDA {t.cuda} build, plan expects {expect.torch_cuda}",
                            fix="rerun `gpuprov bootstrap --force` to reinstall the planned wheel"))
    checks.append(Check(name="torch.cuda", ok=t.is_available, detail=f"is_available={t.is_available}, "
                        f"{t.device_count} device(s)", fix=None if t.is_available else
                        "see the checks above; a wheel for a newer CUDA than the driver is the usual cause"))
    if t.is_available and report.gpus and t.device_count != len(report.gpus):
        checks.append(Check(name="torch devices", ok=False,
                            detail=f"torch sees {t.device_count}, nvidia-smi {len(report.gpus)}",
                            fix="check CUDA_VISIBLE_DEVICES in the environment"))
    for dev in t.devices:
        checks.append(Check(
            name=f"matmul gpu{dev.index}", ok=dev.matmul_ok,
            detail=f"{dev.name} sm_{dev.capability[0]}{dev.capability[1]}: "
            + ("matches CPU" if dev.matmul_ok else (dev.error or f"max error {dev.max_abs_err}").splitlines()[0]),
            fix=None if dev.matmul_ok else _matmul_fix(t, dev),
        ))
    return checks


def _matmul_fix(t: TorchInfo, dev: TorchDevice) -> str:
    """A wheel without code for the GPU is a wrong install, not a broken GPU: name a wheel that has it."""
    if "no kernel image is available" not in (dev.error or ""):
        return "check `dmesg | grep -i xid`; reset or replace the GPU"
    from gpuprov.plan.compat import variants_with_sass

    sm = f"sm_{dev.capability[0]}{dev.capability[1]}"
    release = (t.version or "").split("+")[0]
    built = f" (it carries {', '.join(t.arch_list)})" if t.arch_list else ""
    variants = variants_with_sass(release, f"{dev.capability[0]}.{dev.capability[1]}") if release else []
    if variants:
        return (f"torch {t.version} has no code for {dev.name}'s {sm}{built}: install its {variants[0]} build "
                f"(`gpuprov bootstrap --torch-cuda {variants[0]} --force`)")
    return (f"torch {t.version} has no code for {dev.name}'s {sm}{built}: install a torch release whose wheels "
            f"carry {sm} (`gpuprov plan --gpu ...` names one)")
