"""`gpuprov doctor`: walk the usual causes of a broken GPU stack on a host; name each cause and its fix.

Built like pyinfra facts: hosts/doctor_facts.py's one shell command prints the facts and `parse_facts`
turns them into typed `DoctorFacts`; `diagnose` here turns facts into findings (`verify.Check`), ordered
from root cause to symptom. Parsing and rules are pure, so they are tested on recorded outputs
(tests/fixtures/doctor/). Findings that pass are kept, so the user sees what was checked.

The rules, root cause first: nouveau, headers, apt lock, driver, driver hold and pin, Secure Boot, module; then
the symptoms: nvidia-smi, Fabric Manager (with the package name of the driver's branch), HGX B200's InfiniBand
modules loaded and listed in /etc/modules-load.d, the persistence daemon and persistence mode as nvidia-smi
reports it, device nodes, torch against the driver (minor-version compatibility included), disk; then the health
findings (health.py). "driver pin" warns when NVIDIA's driver is held but its pinning package is missing: the
hold keeps the meta-package only, and its `>=` dependencies follow a newer branch.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from gpuprov.hosts import findings
from gpuprov.hosts.check import DEFAULT_ENV
from gpuprov.hosts.doctor_facts import DoctorError, DoctorFacts, Unit, facts_command, parse_facts, upstream_version
from gpuprov.hosts.fanout import run_parallel
from gpuprov.hosts.health import health_checks
from gpuprov.hosts.remote import HostOutcome, HostSettings, Remote, on_host
from gpuprov.hosts.verify import Check, failed, passed
from gpuprov.plan import oses
from gpuprov.plan.inventory import Target
from gpuprov.plan.stack import SUPPORTED_OS, TorchWheel

DEFAULT_MIN_FREE_GB = 10.0  # a torch CUDA wheel and its nvidia-* libraries take several GB
PERSISTENCE_DROPIN = "/etc/systemd/system/nvidia-persistenced.service.d/gpuprov-persistence-mode.conf"


# --- rules ------------------------------------------------------------------------------------


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def _ok(name: str, detail: str) -> Check:
    return Check(name=name, ok=True, detail=detail)


def _fail(name: str, detail: str, fix: str, severity: str = "fail") -> Check:
    return Check(name=name, ok=False, detail=detail, fix=fix, severity="warn" if severity == "warn" else "fail")


def diagnose(facts: DoctorFacts, host: str = "HOST", min_free_gb: float = DEFAULT_MIN_FREE_GB) -> list[Check]:
    """Findings for one host, root cause first, symptoms after; passes included as ok."""
    f = facts
    out: list[Check] = []
    bootstrap = f"gpuprov bootstrap {host}"

    # the platform
    if f.os in SUPPORTED_OS and oses.family(f.os) == "apt":
        out.append(_ok("os", f"{f.os_pretty or f.os}"))
    elif f.os in SUPPORTED_OS:  # bootstrap installs there (dnf), but doctor's package checks read dpkg
        out.append(_fail("os", f"{f.os_pretty or f.os}: doctor's package checks are apt's (dpkg), this OS uses dnf",
                         "read `rpm -qa 'nvidia*'` and `dnf module list --enabled nvidia-driver` yourself", "warn"))
    else:
        out.append(_fail("os", f"{f.os_pretty or f.os or 'unknown OS'} is not one gpuprov supports "
                         f"({', '.join(SUPPORTED_OS)})",
                         "use an Ubuntu or Debian image gpuprov supports; elsewhere the apt-based checks and fixes may "
                         "not apply",
                         "warn"))
    gpus = f.pci_gpus
    if f.pci is None:
        out.append(_fail("gpu on pci bus", "lspci is not installed, the PCI bus was not checked",
                         "apt-get install -y pciutils", "warn"))
    elif gpus:
        out.append(_ok("gpu on pci bus", f"{len(gpus)} NVIDIA GPU(s): {_pci_name(gpus[0])}"
                       + (f"; {len(f.nvswitches)} NVSwitch" if f.nvswitches else "")))
    else:
        out.append(_fail("gpu on pci bus", "no NVIDIA GPU on the PCI bus (lspci -nn -d 10de:)",
                         "use a GPU instance type (g4dn, g5, g6, p4d, p5…); on a GPU instance, stop and start it "
                         "(a GPU that fell off the bus needs new hardware)"))

    # what blocks apt (and therefore every fix below)
    if f.lock_holders:
        procs = f"; running: {'; '.join(f.apt_processes[:3])}" if f.apt_processes else ""
        out.append(_fail("apt lock", f"the dpkg/apt lock is held ({'; '.join(f.lock_holders)}){procs}",
                         "wait for it to finish (`systemctl status unattended-upgrades`, `tail -f "
                         "/var/log/unattended-upgrades/unattended-upgrades.log`); gpuprov bootstrap waits up to 15 min",
                         "warn"))
    elif not f.lock_checked and f.apt_processes:
        out.append(_fail("apt lock", f"apt/dpkg is running ({'; '.join(f.apt_processes[:3])}); fuser is missing, "
                         "the lock itself was not checked", "wait for it to finish (`apt-get install psmisc` for fuser)",
                         "warn"))
    elif f.lock_checked:
        out.append(_ok("apt lock", "free"))

    # the kernel side
    if f.module_loaded("nouveau"):
        out.append(_fail("nouveau", "the nouveau driver is loaded and holds the GPU; the NVIDIA module cannot bind",
                         "printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' > "
                         "/etc/modprobe.d/blacklist-nouveau.conf && update-initramfs -u && reboot"))
    elif f.modules is not None:
        out.append(_ok("nouveau", "not loaded"))

    module_loaded = f.module_loaded("nvidia")
    smi_works = f.smi_rc == 0
    dpkg = f.packages is not None
    headers_pkg = f"linux-headers-{f.kernel}" if f.kernel else None
    headers_missing = bool(dpkg and headers_pkg and headers_pkg not in (f.packages or {}))
    if dpkg and headers_pkg:
        if not headers_missing:
            out.append(_ok("kernel headers", f"{headers_pkg} installed"))
        else:
            # with the module loaded it only bites at the next kernel update (DKMS cannot rebuild)
            out.append(_fail("kernel headers", f"{headers_pkg} is not installed: DKMS cannot build the NVIDIA module "
                             "for the running kernel", f"apt-get install -y {headers_pkg} (gpuprov bootstrap does it first)",
                             "warn" if module_loaded or smi_works else "fail"))

    drivers = f.driver_packages
    installed = bool(drivers) or f.module_version is not None or smi_works or f.smi_rc not in (None, 127)
    if drivers:
        out.append(_ok("driver package", ", ".join(f"{n} {v}" for n, v in sorted(drivers.items()))))
    elif installed:
        out.append(_ok("driver package", "no driver package, but the module is installed (runfile install?)"
                       + (f" {f.module_version}" if f.module_version else "")))
    else:
        out.append(_fail("driver package", "the NVIDIA driver is not installed (no nvidia-open / cuda-drivers / "
                         "nvidia-driver-* package, no nvidia module, no nvidia-smi)",
                         f"run `{bootstrap}` (headers, the driver from NVIDIA's repo, held, then a reboot)"))
    if drivers:
        unheld = sorted(n for n in drivers if n not in f.held)
        if unheld:
            out.append(_fail("driver hold", f"{', '.join(unheld)} not held: unattended-upgrades can upgrade the userspace "
                             "under the loaded module (\"Driver/library version mismatch\")",
                             f"apt-mark hold {' '.join(unheld)}", "warn"))
        else:
            out.append(_ok("driver hold", f"held: {', '.join(sorted(drivers))}"))
        out.extend(_pin_check(f, drivers, bootstrap))

    if installed:
        out.extend(_module_checks(f, headers_missing, headers_pkg))
        out.append(_smi_check(f, module_loaded))
        if f.nvswitch_host:
            out.extend(_fabric_manager_checks(f, bootstrap))
        unit = f.units.get("nvidia-persistenced")
        if unit is not None:
            if unit.active != "active" and unit.enabled == "enabled" and module_loaded is False:
                out.append(_ok("persistence daemon", "nvidia-persistenced enabled; it starts once the nvidia module loads"))
            elif unit.active == "active":
                out.append(_ok("persistence daemon", "nvidia-persistenced active"
                               + ("" if unit.enabled == "enabled" else f" ({unit.enabled or 'not enabled'} at boot)")))
            else:
                out.append(_fail("persistence daemon", f"nvidia-persistenced is {unit.active or 'not running'}: each CUDA "
                                 "program pays the driver's init time, and settings reset when no program runs",
                                 "systemctl enable --now nvidia-persistenced", "warn"))
        if f.persistence:
            off = [str(i) for i, on in enumerate(f.persistence) if not on]
            if off:
                # the packaged unit runs `nvidia-persistenced --no-persistence-mode`: enabling it is not enough
                out.append(_fail("persistence mode", f"persistence mode is off on GPU {', '.join(off)} (nvidia-smi "
                                 "Persistence-M: Off), though nvidia-persistenced may be running: its packaged unit "
                                 "starts it with --no-persistence-mode",
                                 f"a systemd drop-in {PERSISTENCE_DROPIN} with `ExecStart=` then `ExecStart=/usr/bin/"
                                 "nvidia-persistenced --user nvidia-persistenced --persistence-mode --verbose`, "
                                 f"`systemctl daemon-reload && systemctl restart nvidia-persistenced`; or rerun `{bootstrap}`",
                                 "warn"))
            else:
                out.append(_ok("persistence mode", f"on for all {len(f.persistence)} GPU(s)"))
        if f.dev_nodes:
            out.append(_ok("device nodes", f"{len(f.dev_nodes)}: {', '.join(n.rsplit('/', 1)[-1] for n in f.dev_nodes[:4])}"
                           + ("…" if len(f.dev_nodes) > 4 else "")))
        elif smi_works or module_loaded:
            out.append(_fail("device nodes", "no /dev/nvidia* nodes: non-root CUDA programs fail",
                             "run `sudo nvidia-smi` once, or systemctl enable --now nvidia-persistenced"))

    out.extend(_torch_checks(f))
    out.extend(_disk_checks(f, min_free_gb))
    out.extend(health_checks(f, host))  # Xid lines and the health watch's findings (hosts/health.py)
    return out


PINNING_FROM_BRANCH = 570  # NVIDIA ships nvidia-driver-pinning-<branch> from R570 (tests/shims/data/nvidia-repo.tsv)


def _pin_check(f: DoctorFacts, drivers: dict[str, str], bootstrap: str) -> list[Check]:
    """NVIDIA's repository drivers: the pinning package's preferences keep every driver package in
    the branch; `apt-mark hold nvidia-open` holds the meta-package only, whose dependencies are
    `>= VERSION` and move to a newer branch with the next `apt upgrade`."""
    meta = sorted(n for n in drivers if n in ("nvidia-open", "cuda-drivers"))
    if not meta:
        return []  # Ubuntu's own nvidia-driver-NNN packages carry the branch in their names
    pins = sorted(n for n in f.packages or {} if n.startswith("nvidia-driver-pinning-"))
    if pins:
        return [_ok("driver pin", f"{', '.join(pins)}: apt keeps every driver package in the branch")]
    version = upstream_version(drivers[meta[0]])
    branch = version.split(".")[0]
    detail = (f"no nvidia-driver-pinning-* package (its /etc/apt/preferences.d file): the hold on {meta[0]} keeps the "
              f"meta-package only; its dependencies (>= {version}) can move to a newer branch with the next apt upgrade")
    if branch.isdigit() and int(branch) >= PINNING_FROM_BRANCH:
        fix = f"apt-get install nvidia-driver-pinning-{branch} (before any other apt run), or `{bootstrap}`"
    else:
        fix = (f"NVIDIA ships pinning packages from R{PINNING_FROM_BRANCH}; on R{branch} hold every driver package: "
               "apt-mark hold $(dpkg-query -W -f='${Package}\\n' 'nvidia-*' 'libnvidia-*')")
    return [_fail("driver pin", detail, fix, "warn")]


def _pci_name(line: str) -> str:
    m = re.search(r"NVIDIA Corporation (.+?) \[10de:", line)
    return m.group(1) if m else line


def _module_checks(f: DoctorFacts, headers_missing: bool, headers_pkg: str | None) -> list[Check]:
    out: list[Check] = []
    loaded = f.module_loaded("nvidia")
    blocked_by_sb = bool(f.secure_boot and not loaded)
    if f.secure_boot is None:
        out.append(_ok("secure boot", f.secure_boot_text or "unknown (mokutil not installed)"))
    elif not f.secure_boot:
        out.append(_ok("secure boot", "disabled"))
    elif not blocked_by_sb:
        out.append(_ok("secure boot", "enabled; the nvidia module is loaded, so its signature is accepted"))
    else:
        unsigned = not f.module_signer
        out.append(_fail(
            "secure boot",
            "Secure Boot is enabled and the nvidia module is " + ("unsigned" if unsigned else f"signed by {f.module_signer!r}")
            + ": the kernel refuses a module whose key is not enrolled",
            "enroll the DKMS signing key: `mokutil --import /var/lib/shim-signed/mok/MOK.der`, reboot and confirm it in "
            "the MOK manager (console); or disable Secure Boot in the firmware / instance settings",
        ))
    if f.dkms is not None and not loaded and f.kernel:
        built = [line for line in f.dkms if line.startswith("nvidia") and f.kernel in line and "installed" in line]
        if built:
            out.append(_ok("dkms", built[0]))
        else:
            seen = "; ".join(line for line in f.dkms if line.startswith("nvidia")) or "no nvidia module in `dkms status`"
            out.append(_fail("dkms", f"the nvidia module is not built for the running kernel {f.kernel} ({seen})",
                             (f"apt-get install -y {headers_pkg}, then " if headers_missing else "")
                             + f"`dkms autoinstall -k {f.kernel}` (or `apt-get install -f`) and reboot"))
    if loaded is None:
        return out
    if loaded:
        version = f.loaded_version or f.module_version
        out.append(_ok("kernel module", "nvidia loaded" + (f" ({version})" if version else "")))
    elif f.module_loaded("nouveau"):
        out.append(_fail("kernel module", "the nvidia module is installed but not loaded (nouveau holds the GPU)",
                         "see `nouveau` above"))
    elif blocked_by_sb:
        out.append(_fail("kernel module", "the nvidia module is installed but not loaded", "see `secure boot` above"))
    elif headers_missing:
        out.append(_fail("kernel module", "the nvidia module is installed but not loaded",
                         f"apt-get install -y {headers_pkg} && apt-get install -f (DKMS builds the module), then reboot"))
    else:
        out.append(_fail("kernel module", "the nvidia module is installed but not loaded (a fresh install loads after a "
                         "reboot)", "reboot; if it still is not loaded: `modprobe nvidia` and read `dmesg | grep -i nvrm`"))
    return out


def _smi_check(f: DoctorFacts, module_loaded: bool | None) -> Check:
    if f.smi_rc is None:
        return _fail("nvidia-smi", "nvidia-smi is not installed", "reinstall the driver package (rerun gpuprov bootstrap)")
    if f.smi_rc == 0:
        return _ok("nvidia-smi", f"driver {f.driver_version}, supports CUDA ≤ {f.cuda_version}")
    low = f.smi_output.lower()
    first = next((line.strip() for line in f.smi_output.splitlines() if line.strip()), f"exit {f.smi_rc}")
    if "version mismatch" in low:
        loaded = f" (loaded module {f.loaded_version}, userspace {f.driver_version})" if f.loaded_version else ""
        return _fail("nvidia-smi", f"Driver/library version mismatch{loaded}: the driver's userspace was upgraded but the "
                     "old kernel module is still loaded",
                     "reboot the host; then hold the driver packages (apt-mark hold) so unattended-upgrades can't repeat it")
    if "couldn't communicate" in low or "communicate with the nvidia driver" in low:
        fix = "see `kernel module` above" if module_loaded is False else \
            "check `dkms status`, headers for `uname -r` and Secure Boot, then reboot"
        return _fail("nvidia-smi", "couldn't communicate with the NVIDIA driver: the kernel module is not loaded", fix)
    if "no devices were found" in low:
        return _fail("nvidia-smi", "No devices were found: the driver sees no GPU",
                     "check `lspci -d 10de:` and `dmesg | grep -i -e nvrm -e xid`; reboot; replace the instance if a "
                     "GPU fell off the bus")
    if f.smi_rc == 127 or "not found" in low:
        return _fail("nvidia-smi", "nvidia-smi is not installed", "reinstall the driver package (rerun gpuprov bootstrap)")
    if f.smi_rc == 124:
        return _fail("nvidia-smi", "nvidia-smi hung for 60 s", "check `dmesg | grep -i xid` for a GPU fault; reboot")
    return _fail("nvidia-smi", first[:200], "read `dmesg | grep -i nvrm`; reboot")


def _fabric_manager_checks(f: DoctorFacts, bootstrap: str) -> list[Check]:
    from gpuprov.plan.stack import facts

    driver = f.driver_version or f.loaded_version or f.module_version
    branch = driver.split(".")[0] if driver else None
    # NVIDIA's repo drops the branch from the Fabric Manager package name from R580 on (stack.yaml)
    package = facts().fabric_manager_package(int(branch)) if branch else "nvidia-fabricmanager"
    fm = f.fm_packages
    symptom = "CUDA fails with error 802 \"system not yet initialized\""
    at = f" at exactly {driver}" if driver else " at the driver's exact version"
    install = (f"install {package}{at} (`apt-cache madison {package}`, then "
               f"`apt-get install {package}=<that version>`), `apt-mark hold` it, "
               f"`systemctl enable --now nvidia-fabricmanager`; or rerun `{bootstrap}`")
    where = (f"{len(f.nvswitches)} NVSwitch on the bus" if f.nvswitches
             else f"NVSwitch management functions ({', '.join(f.nvswitch_seen)})" if f.nvswitch_seen
             else f"{f.instance_type} is an NVSwitch instance type")
    if not fm:
        return [_fail("fabric manager", f"{where} but nvidia-fabricmanager is not installed: {symptom}", install),
                *_nvswitch_gen4_checks(f, bootstrap, symptom)]
    name, version = sorted(fm.items())[0]
    out: list[Check] = []
    if driver and upstream_version(version) != driver:
        out.append(_fail("fabric manager", f"{name} {version} does not match driver {driver} (it must match exactly, "
                         f"patch included): the service refuses to start, {symptom}", install))
    else:
        out.append(_ok("fabric manager", f"{name} {version}" + (f" matches driver {driver}" if driver else "")))
    unit = f.units.get("nvidia-fabricmanager", Unit(active="", enabled=""))
    if unit.active == "active":
        out.append(_ok("fabric manager service", "active" + ("" if unit.enabled == "enabled" else
                                                              f" ({unit.enabled or 'not enabled'} at boot)")))
    else:
        out.append(_fail("fabric manager service", f"nvidia-fabricmanager is {unit.active or 'not running'}: {symptom}",
                         "systemctl enable --now nvidia-fabricmanager; if it fails: `journalctl -u nvidia-fabricmanager` "
                         "(a version mismatch with the driver is the usual cause)"))
    return out + _nvswitch_gen4_checks(f, bootstrap, symptom)


def _nvswitch_gen4_checks(f: DoctorFacts, bootstrap: str, symptom: str) -> list[Check]:
    """HGX B200 (NVSwitch gen 4): Fabric Manager's pre-check and nvlsm need the InfiniBand user-MAD modules
    loaded at every boot (stack.yaml `nvswitch_gen4`)."""
    from gpuprov.plan.stack import facts

    gen4 = facts().nvswitch_gen4
    if not set(gen4.archs) & f.gpu_archs or f.modules is None:
        return []
    missing = [m for m in gen4.modules if m not in f.modules]
    unpersisted = [m for m in gen4.modules if m not in f.modules_load]
    pkg = gen4.kernel_modules_package["apt"].replace("$(uname -r)", f.kernel or "$(uname -r)")
    if missing:
        return [_fail("infiniband modules", f"{', '.join(missing)} not loaded: on HGX B200 Fabric Manager's pre-check "
                      f"and nvlsm need them, so the GPUs' fabric stays \"In Progress\" and {symptom}",
                      f"apt-get install -y {pkg} {' '.join(gen4.packages)}; modprobe -a {' '.join(gen4.modules)}; "
                      f"list them in {gen4.modules_load_file} (loaded at every boot); "
                      f"systemctl restart nvidia-fabricmanager; or rerun `{bootstrap}`")]
    if unpersisted:
        return [_fail("infiniband modules", f"{', '.join(unpersisted)} loaded now but not listed in "
                      "/etc/modules-load.d: after a reboot Fabric Manager fails its pre-check",
                      f"list them in {gen4.modules_load_file}", "warn")]
    return [_ok("infiniband modules", f"{', '.join(gen4.modules)} loaded and loaded at boot")]


def _torch_checks(f: DoctorFacts) -> list[Check]:
    t = f.torch
    if t is None or not t.found:
        return [_ok("torch", f"no Python env at {f.env_path}; nothing to compare")]
    if t.error or t.version is None:
        return [_fail("torch", f"torch does not import in {f.env_path}: {t.error}",
                      "rerun `gpuprov bootstrap --force` (pytorch step)", "warn")]
    if t.cuda is None:
        return [_ok("torch", f"torch {t.version} is a CPU build; no CUDA to compare")]
    head = f"torch {t.version} built for CUDA {t.cuda}"
    if not f.cuda_version:
        return [_ok("torch", f"{head}; the driver's CUDA version is unknown (nvidia-smi failed), not compared")]
    from gpuprov.plan.stack import minor_compat_runs

    torch_cuda = ".".join(t.cuda.split(".")[:2])
    if _v(torch_cuda) > _v(f.cuda_version)[:2] and f.driver_version and minor_compat_runs(torch_cuda, f.driver_version):
        return [_ok("torch vs driver", f"{head}; driver {f.driver_version} supports CUDA ≤ {f.cuda_version}, and runs "
                    f"CUDA {t.cuda.split('.')[0]}.x code through minor-version compatibility (limited feature set, "
                    "no PTX JIT of newer code)")]
    if _v(t.cuda)[:2] > _v(f.cuda_version)[:2]:
        from gpuprov.plan.stack import facts

        minimum = facts().cuda_min_driver.get(".".join(t.cuda.split(".")[:2]))
        need = f" to ≥ {minimum.driver}" if minimum else ""
        wheel = _wheel_for_driver(f)
        other = (f"install torch {wheel.version}+{wheel.variant}, the newest wheel driver {f.driver_version} runs "
                 f"(--torch {wheel.version} --torch-cuda {wheel.variant})" if wheel else
                 f"install a torch wheel for CUDA ≤ {f.cuda_version} (--torch-cuda cu{''.join(f.cuda_version.split('.')[:2])})")
        return [_fail("torch vs driver", f"{head}, but driver {f.driver_version} supports CUDA ≤ {f.cuda_version}: "
                      "torch.cuda.is_available() is False",
                      f"upgrade the driver{need} (gpuprov bootstrap --driver …), or {other}")]
    return [_ok("torch vs driver", f"{head}; driver supports CUDA ≤ {f.cuda_version}")]


def _wheel_for_driver(f: DoctorFacts) -> TorchWheel | None:
    """The newest torch wheel the installed driver runs on this host's GPU (minor-version compatibility included)."""
    from gpuprov.errors import StackConflict
    from gpuprov.hosts.detect import gpu_from_pci
    from gpuprov.plan import catalog
    from gpuprov.plan.compat import choose_torch_for_driver

    names = {gpu_from_pci(line.rsplit("10de:", 1)[-1][:4]) for line in f.pci_gpus}
    if len(names) != 1 or None in names or not f.driver_version:
        return None
    try:
        return choose_torch_for_driver(catalog.load().gpu(str(names.pop())), f.driver_version)
    except StackConflict:
        return None


def _disk_checks(f: DoctorFacts, min_free_gb: float) -> list[Check]:
    out: list[Check] = []
    seen: set[str] = set()
    for d in f.disk:
        if d.mount in seen:
            continue
        seen.add(d.mount)
        what = f"{d.avail_gib:.1f} GiB free on {d.mount}" + (f" (for {d.path})" if d.path not in ("/", d.mount) else "")
        if d.avail_gib < min_free_gb:
            out.append(_fail("disk", f"only {what}; torch CUDA wheels and their libraries take several GB",
                             "free space (apt-get clean; uv cache clean) or grow the volume", "warn"))
        else:
            out.append(_ok("disk", what))
    return out


# --- running ----------------------------------------------------------------------------------


class DoctorReport(BaseModel):
    host: str
    facts: DoctorFacts
    findings: list[Check] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return passed(self.findings)

    @property
    def failures(self) -> list[Check]:
        return failed(self.findings)


DoctorResult = HostOutcome[DoctorReport]


def examine(host: str, output: str, env_path: str = DEFAULT_ENV, min_free_gb: float = DEFAULT_MIN_FREE_GB,
            address: str | None = None) -> DoctorReport:
    """The pure part: a host's fact-command output -> its report. `address`: how fixes name the host."""
    facts = parse_facts(output, env_path)
    return DoctorReport(host=host, facts=facts, findings=diagnose(facts, address or host, min_free_gb))


def _address(target: Target) -> str:
    """The host as a gpuprov command line takes it back (node name, or [USER@]HOST[:PORT])."""
    if target.label:
        return target.label
    return (f"{target.user}@" if target.user else "") + target.host + (f":{target.port}" if target.port not in (None, 22) else "")


def _doctor(remote: Remote, target: Target, env_path: str, min_free_gb: float) -> DoctorReport:
    out = remote.run(facts_command(env_path), sudo=True)
    if "## end" not in out.stdout and out.exited != 0:
        raise DoctorError(f"the fact command failed (exit {out.exited}): {(out.stderr or out.stdout).strip()[:300]}")
    report = examine(target.name, out.stdout, env_path, min_free_gb, _address(target))
    found = findings.parse_lines("\n".join(report.facts.health))
    if found:  # `gpuprov status` shows the node's last finding
        findings.record(target.name, found[-1])
    return report


def doctor(targets: list[Target], settings: HostSettings, env_path: str = DEFAULT_ENV,
           min_free_gb: float = DEFAULT_MIN_FREE_GB, parallel: int = 32) -> list[DoctorResult]:
    return run_parallel(targets, lambda t: on_host(t, settings, lambda r: _doctor(r, t, env_path, min_free_gb)), parallel)
