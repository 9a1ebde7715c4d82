"""Parsers on recorded nvidia-smi outputs, and the judge's verdicts with their fixes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprov.hosts.verify import (
    Expectation,
    ProbeError,
    extract_probe,
    judge,
    parse_probe,
    parse_query_csv,
    parse_summary,
)

FIX = Path(__file__).parent / "fixtures" / "nvidia-smi"


@pytest.mark.parametrize(("name", "driver", "cuda"), [
    ("a100-sxm4-80gb-x4.summary.txt", "555.42.02", "12.5"),
    ("h100-80gb-hbm3-x8.summary.txt", "565.57.01", "12.7"),
    ("tesla-t4.summary-r418.txt", "418.67", "10.1"),
])
def test_summary_header_of_real_outputs(name, driver, cuda):
    assert parse_summary((FIX / name).read_text()) == (driver, cuda)


# Per `nvidia-smi --help-query-gpu`: ", " separated, nounits, "[N/A]" / "[Not Supported]" for absent values.
CSV_A100 = (
    "0, NVIDIA A100-SXM4-40GB, GPU-4a4c9c1e-1b6b-2d5c-8f0e-3a1b2c3d4e5f, 00000000:10:1C.0, 580.95.05, 40960, "
    "0, 0, "
    "31, 52.17, Enabled, 0, 8.0\n"
    "1, NVIDIA A100-SXM4-40GB, GPU-5b5d0d2f-2c7c-3e6d-9a1f-4b2c3d4e5f60, 00000000:10:1D.0, 580.95.05, 40960, "
    "3, 7, "
    "33, 55.02, Disabled, 2, 8.0\n"
)
CSV_ODD = "0, Tesla T4, GPU-x, 00000000:00:1E.0, 535.104.05, 15360, 0, [N/A], 38, [Not Supported], Enabled, [N/A], 7.5\n"


def test_query_csv_fields():
    gpus = parse_query_csv(CSV_A100)
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].name == "NVIDIA A100-SXM4-40GB"
    assert gpus[0].memory_total_mib == 40960 and gpus[0].compute_cap == "8.0"
    assert gpus[0].persistence_mode is True and gpus[1].persistence_mode is False
    assert gpus[1].ecc_uncorrected == 2 and gpus[0].power_w == pytest.approx(52.17)


def test_query_csv_not_available_values_are_none():
    (gpu,) = parse_query_csv(CSV_ODD)
    assert gpu.utilization_pct is None and gpu.power_w is None and gpu.ecc_uncorrected is None
    assert gpu.compute_cap == "7.5"


def probe(**over) -> dict:
    data = {
        "probe_version": 1, "hostname": "node-1",
        "nvidia_smi": {"found": True, "returncode": 0, "query_csv": CSV_A100.splitlines()[0] + "\n",
                       "summary": (FIX / "a100-sxm4-80gb-x4.summary.txt").read_text(), "stderr": ""},
        "dev_nodes": ["/dev/nvidia0", "/dev/nvidiactl"],
        "torch": {"version": "2.5.1+cu124", "cuda": "12.4", "is_available": True, "device_count": 1,
                  "arch_list": ["sm_80"], "nccl": "2.21.5", "error": None,
                  "devices": [{"index": 0, "name": "NVIDIA A100-SXM4-40GB", "capability": [8, 0], "memory_mib": 40326,
                               "matmul_ok": True, "max_abs_err": 1e-5, "error": None}]},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


def verdict(data: dict, **expect):
    report = judge(parse_probe("h", data), Expectation(**expect))
    return report, {c.name: c for c in report.checks}


def test_healthy_host_passes_every_check():
    report, checks = verdict(probe(), gpu="A100-40GB", gpu_count=1, torch=True, torch_cuda="12.4")
    assert report.ok, [c for c in report.checks if not c.ok]
    assert report.driver_version == "555.42.02" and report.cuda_driver_version == "12.5"
    assert checks["matmul gpu0"].ok and checks["gpu model"].ok


def test_torch_built_for_newer_cuda_than_the_driver():
    data = probe(torch={"version": "2.9.0+cu130", "cuda": "13.0", "is_available": False, "device_count": 0, "devices": []})
    report, checks = verdict(data, torch=True)
    assert not report.ok
    bad = checks["torch vs driver"]
    assert not bad.ok and bad.severity == "fail"
    assert "13.0" in bad.detail and "12.5" in bad.detail
    assert bad.fix and "580.65.06" in bad.fix  # the driver CUDA 13.0 needs (Table 3)
    assert not checks["torch.cuda"].ok


def test_newer_cuda_12_wheel_on_an_older_12_driver_runs_by_minor_version_compat():
    # CUDA 12.x code runs on drivers ≥ 525 (NVIDIA CUDA compatibility guide, Table 1): driver 555 runs cu128
    data = probe(torch={"version": "2.9.0+cu128", "cuda": "12.8"})
    report, checks = verdict(data, torch=True)
    assert report.ok, [c for c in report.checks if not c.ok]
    note = checks["torch vs driver"]
    assert note.ok and note.severity == "warn"
    assert "minor-version compatibility" in note.detail and "PTX JIT" in note.detail


def test_persistence_mode_is_read_from_nvidia_smi():
    # persistence_mode from --query-gpu: GPU 1 "Disabled" -> a warning whose fix is --persistence-mode, not
    # `systemctl enable` (the packaged unit runs nvidia-persistenced --no-persistence-mode)
    data = probe(nvidia_smi={"query_csv": CSV_A100})
    _, checks = verdict(data)
    pm = checks["persistence"]
    assert not pm.ok and pm.severity == "warn" and "GPU 1" in pm.detail
    assert pm.fix and "--persistence-mode" in pm.fix
    _, ok_checks = verdict(probe())
    assert ok_checks["persistence"].ok and "enabled" in ok_checks["persistence"].detail


@pytest.mark.parametrize(("stdout", "stderr", "needle", "fix"), [
    ("Failed to initialize NVML: Driver/library version mismatch\n", "", "version mismatch", "reboot"),
    ("", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "not loaded", "dkms"),
    ("No devices were found\n", "", "no GPU visible", "lspci"),
])
def test_nvidia_smi_failures_name_the_cause_and_fix(stdout, stderr, needle, fix):
    data = probe(nvidia_smi={"returncode": 18, "query_csv": stdout, "summary": stdout, "stderr": stderr}, torch=None)
    report, checks = verdict(data)
    assert not report.ok
    assert needle in checks["nvidia-smi"].detail and fix in checks["nvidia-smi"].fix


def test_missing_nvidia_smi():
    _report, checks = verdict(probe(nvidia_smi={"found": False, "returncode": None}, torch=None))
    assert "not installed" in checks["nvidia-smi"].detail


def test_fewer_gpus_than_the_instance_has():
    _report, checks = verdict(probe(), gpu_count=8)
    assert not checks["gpu count"].ok and "1 visible, 8 expected" in checks["gpu count"].detail


def test_failed_matmul_and_missing_device_nodes_and_ecc():
    data = probe(dev_nodes=[], nvidia_smi={"query_csv": CSV_A100})
    data["torch"]["device_count"] = 2
    data["torch"]["devices"] = [
        {"index": 0, "name": "A100", "capability": [8, 0], "memory_mib": 1, "matmul_ok": True},
        {"index": 1, "name": "A100", "capability": [8, 0], "memory_mib": 1, "matmul_ok": False,
         "error": "CUDA error: an illegal memory access was encountered"},
    ]
    _report, checks = verdict(data, torch=True)
    assert not checks["matmul gpu1"].ok and "illegal memory access" in checks["matmul gpu1"].detail
    assert not checks["device nodes"].ok
    assert not checks["ecc"].ok and "GPU 1" in checks["ecc"].detail
    assert checks["persistence"].severity == "warn"


def test_torch_missing_when_expected():
    _report, checks = verdict(probe(torch=None), torch=True)
    assert not checks["torch"].ok and "not importable" in checks["torch"].detail


def test_extract_probe_between_markers_and_errors():
    out = "noise\nGPUPROV_PROBE_BEGIN\n" + json.dumps(probe()) + "\nGPUPROV_PROBE_END\nGPUPROV_RESULT=unchanged\n"
    assert extract_probe(out)["hostname"] == "node-1"
    with pytest.raises(ProbeError, match="printed no result"):
        extract_probe("no markers at all")
    with pytest.raises(ProbeError, match="JSON is unreadable: Expecting property name"):
        extract_probe("GPUPROV_PROBE_BEGIN\n{not json\nGPUPROV_PROBE_END\n")
    with pytest.raises(ProbeError, match="JSON is not an object"):
        extract_probe("GPUPROV_PROBE_BEGIN\n[1, 2]\nGPUPROV_PROBE_END\n")


# --- parsing, field by field, on rows whose every value differs (so a swapped column cannot pass) --------------

def test_query_csv_maps_every_column_and_reads_missing_values_as_none() -> None:
    from gpuprov.hosts.verify import parse_query_csv

    text = (
        "0, NVIDIA H100 80GB HBM3, GPU-aaaa, 00000000:53:00.0, 580.95.05, 81559, 1234, 37, 41, 250.50, Enabled, 0, 9.0\n"
        "\n"
        "1, short row, GPU-cccc\n"  # a row cut short is skipped, not the end of the output
        "2, Tesla T4, GPU-bbbb, 00000000:00:1E.0, 570.195.03, 15360, [N/A], [Not Supported], N/A, Not Supported, "
        "Disabled, 3, 7.5\n"
        "3, NVIDIA A10G, GPU-dddd, 00000000:00:1F.0, 570.195.03, 23028, 5, 6, 7, 8.25, [N/A], , 8.6\n"
    )
    h100, t4, a10g = parse_query_csv(text)
    assert (h100.index, h100.name, h100.uuid, h100.pci_bus_id, h100.driver_version) == (
        0, "NVIDIA H100 80GB HBM3", "GPU-aaaa", "00000000:53:00.0", "580.95.05")
    assert (h100.memory_total_mib, h100.memory_used_mib, h100.utilization_pct, h100.temperature_c, h100.power_w) == (
        81559, 1234, 37, 41, 250.5)
    assert (h100.persistence_mode, h100.ecc_uncorrected, h100.compute_cap) == (True, 0, "9.0")
    assert (t4.index, t4.memory_used_mib, t4.utilization_pct, t4.temperature_c, t4.power_w) == (2, None, None, None, None)
    assert (t4.persistence_mode, t4.ecc_uncorrected, t4.compute_cap) == (False, 3, "7.5")
    assert (a10g.persistence_mode, a10g.ecc_uncorrected, a10g.power_w, a10g.temperature_c) == (None, None, 8.25, 7)


def test_summary_versions_and_their_absence() -> None:
    from gpuprov.hosts.verify import parse_summary

    assert parse_summary("| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |") == ("580.95.05", "13.0")
    assert parse_summary("| NVIDIA-SMI 470.82.01   Driver Version: 470.82.01 |") == ("470.82.01", None)
    assert parse_summary("no header at all") == (None, None)


# --- every failed check names a fix; passing ones do not; the boundaries of each comparison -------------------

def _failed_without_fix(report) -> list[str]:
    return [c.name for c in report.checks if not c.ok and not c.fix]


@pytest.mark.parametrize(("over", "expect", "failing"), [
    ({"nvidia_smi": {"query_csv": ""}}, {}, {"gpus visible"}),
    ({}, {"gpu_count": 2}, {"gpu count"}),
    ({}, {"gpu": "H100"}, {"gpu model"}),
    ({"dev_nodes": []}, {}, {"device nodes"}),
    ({"torch": None}, {"torch": True}, {"torch"}),
    ({"torch": {"cuda": "12.6"}}, {"torch_cuda": "12.4"}, {"torch build"}),
    ({"torch": {"is_available": False, "device_count": 0, "devices": []}}, {}, {"torch.cuda"}),
    ({"torch": {"device_count": 2}}, {}, {"torch devices"}),
    ({"nvidia_smi": {"found": False}}, {}, {"nvidia-smi"}),
    ({"nvidia_smi": {"returncode": 4, "stderr": "Unable to determine the device handle\nsecond line"}}, {},
     {"nvidia-smi"}),
])
def test_each_failure_fails_alone_and_names_its_fix(over, expect, failing) -> None:
    report, _ = verdict(probe(**over), **expect)
    assert {c.name for c in report.checks if not c.ok and c.severity == "fail"} == failing
    assert _failed_without_fix(report) == []


def test_passing_checks_carry_no_fix_and_the_exact_count_passes() -> None:
    report, checks = verdict(probe(), gpu="A100-40GB", gpu_count=1, torch=True, torch_cuda="12.4")
    assert report.ok and all(c.fix is None for c in report.checks)
    assert checks["gpus visible"].detail == "1 GPU(s): NVIDIA A100-SXM4-40GB"
    assert "torch vs driver" not in checks  # a wheel for exactly the driver's CUDA needs no compat note


def test_an_unknown_nvidia_smi_failure_shows_its_first_line_and_sends_to_doctor() -> None:
    _, checks = verdict(probe(nvidia_smi={"returncode": 4, "stderr": "Unable to determine the device handle\nmore"}))
    smi = checks["nvidia-smi"]
    assert (smi.ok, smi.detail, smi.fix) == (False, "Unable to determine the device handle", "run `gpuprov doctor` on the host")
    _, checks = verdict(probe(nvidia_smi={"returncode": 9, "stderr": "", "query_csv": "", "summary": ""}))
    assert checks["nvidia-smi"].detail == "exit 9"  # nothing printed: the exit code is the reason
    _, checks = verdict(probe(nvidia_smi={"found": False}))
    assert not checks["nvidia-smi"].ok and "bootstrap" in (checks["nvidia-smi"].fix or "")


def test_the_report_keeps_the_hostname_and_falls_back_to_the_csvs_driver_version() -> None:
    report = parse_probe("h", probe(nvidia_smi={"summary": ""}))
    assert report.hostname == "node-1" and report.driver_version == report.gpus[0].driver_version
    assert report.cuda_driver_version is None


def test_no_persistence_check_when_nvidia_smi_does_not_say_and_no_torch_checks_when_none_is_expected() -> None:
    row = CSV_A100.splitlines()[0].split(",")
    row[10] = " [N/A]"
    _, checks = verdict(probe(nvidia_smi={"query_csv": ",".join(row) + "\n"}, torch=None))
    assert "persistence" not in checks and "torch" not in checks and "torch.cuda" not in checks


def test_a_torch_import_error_fails_the_torch_check_and_says_why() -> None:
    _, checks = verdict(probe(torch={"error": "ImportError: libcudnn.so.9"}))
    assert not checks["torch"].ok and "ImportError: libcudnn.so.9" in checks["torch"].detail



def test_a_wheel_without_code_for_the_gpu_is_answered_with_the_build_that_has_it() -> None:
    device = {"index": 0, "name": "NVIDIA B200", "capability": [10, 0], "memory_mib": 183359, "matmul_ok": False,
              "max_abs_err": None, "error": "RuntimeError: CUDA error: no kernel image is available for execution on "
              "the device\nCUDA kernel errors might be asynchronously reported"}
    torch = {"version": "2.14.0+cu126", "cuda": "12.6", "arch_list": ["sm_80", "sm_90"], "devices": [device]}
    _, checks = verdict(probe(torch=torch))
    matmul = checks["matmul gpu0"]
    assert matmul.detail == ("NVIDIA B200 sm_100: RuntimeError: CUDA error: no kernel image is available for execution "
                             "on the device")  # the first line only
    assert matmul.fix == ("torch 2.14.0+cu126 has no code for NVIDIA B200's sm_100 (it carries sm_80, sm_90): install "
                          "its cu130 build (`gpuprov bootstrap --torch-cuda cu130 --force`)")  # 2.14's PyPI default
    _, checks = verdict(probe(torch={**torch, "version": "1.9.0+cu111", "arch_list": []}))
    assert checks["matmul gpu0"].fix == ("torch 1.9.0+cu111 has no code for NVIDIA B200's sm_100: install a torch "
                                         "release whose wheels carry sm_100 (`gpuprov plan --gpu ...` names one)")
    wrong = {**device, "error": "GPU result differs from the CPU result by 1e+03 (values up to 50)"}
    _, checks = verdict(probe(torch={**torch, "devices": [wrong]}))
    assert checks["matmul gpu0"].fix == "check `dmesg | grep -i xid`; reset or replace the GPU"


def test_a_healthy_torch_check_says_exactly_what_it_saw() -> None:
    _, checks = verdict(probe(), torch=True)
    assert checks["torch"].detail == "torch 2.5.1+cu124 built for CUDA 12.4, NCCL 2.21.5"
    assert checks["matmul gpu0"].detail == "NVIDIA A100-SXM4-40GB sm_80: matches CPU"
    _, checks = verdict(probe(torch={"version": "2.5.1+cpu", "cuda": None, "is_available": False, "device_count": 0,
                                     "devices": []}), torch=True)  # a CPU-only wheel: no CUDA to compare
    assert "torch vs driver" not in checks and not checks["torch.cuda"].ok


def test_a_wheel_for_exactly_the_drivers_cuda_needs_nothing_and_an_unknown_newer_cuda_names_no_minimum() -> None:
    _, checks = verdict(probe(torch={"cuda": "12.5"}))  # the fixture's driver supports CUDA 12.5
    assert "torch vs driver" not in checks
    _, checks = verdict(probe(torch={"cuda": "14.9"}))
    assert checks["torch vs driver"].fix == "upgrade the driver, or install a torch wheel for CUDA ≤ 12.5 (--torch-cuda)"


@pytest.mark.parametrize("where", ["query_csv", "summary"])
def test_nvml_failures_printed_on_stdout_are_found_after_blank_stderr(where) -> None:
    smi = {"returncode": 18, "stderr": "  \n", "query_csv": "", "summary": "",
           where: "Failed to initialize NVML: Driver/library version mismatch"}
    _, checks = verdict(probe(nvidia_smi=smi))
    assert "version mismatch" in checks["nvidia-smi"].detail


def test_an_unknown_failures_detail_is_cut_at_200_characters() -> None:
    _, checks = verdict(probe(nvidia_smi={"returncode": 4, "stderr": "x" * 300}))
    assert checks["nvidia-smi"].detail == "x" * 200


def test_uncorrected_ecc_errors_fail_with_a_fix() -> None:
    row = CSV_A100.splitlines()[0].split(",")
    row[11] = " 7"
    _, checks = verdict(probe(nvidia_smi={"query_csv": ",".join(row) + "\n"}))
    assert not checks["ecc"].ok and checks["ecc"].fix == "reset the GPU (nvidia-smi -r) or replace the instance"
