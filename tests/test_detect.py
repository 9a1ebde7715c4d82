"""GPU, NVSwitch and OS detection from the facts command's output."""

from __future__ import annotations

import pytest

from gpuprov.detect import gpu_from_name, parse_facts


@pytest.mark.parametrize(("name", "gpu"), [
    ("Tesla T4", "T4"), ("NVIDIA A10G", "A10G"), ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"), ("NVIDIA B200", "B200"),
    ("Tesla V100-SXM2-16GB", "V100"), ("NVIDIA GeForce RTX 4090", None),
])
def test_gpu_names(name, gpu):
    assert gpu_from_name(name) == gpu


P4D_LSPCI = "\n".join(
    [f"10:1{c}.0 3D controller [0302]: NVIDIA Corporation GA100 [A100 SXM4 40GB] [10de:20b0] (rev a1)" for c in "cdef"]
    + [f"a{c}:00.0 Bridge [0680]: NVIDIA Corporation Device [10de:1af1] (rev a1)" for c in "0123"]
)


def test_nvswitch_host_from_lspci_only():
    facts = parse_facts(f"## nvidia-smi\n## lspci\n{P4D_LSPCI}\n## os\nubuntu-22.04\n## end\n")
    assert facts.gpus == ["A100-40GB"] * 4 and facts.nvswitch and facts.source == "lspci"
    assert facts.pci_gpu_count == 4 and facts.os == "ubuntu-22.04" and facts.gpu == "A100-40GB"


def test_nvidia_smi_names_win_and_mixed_hosts_have_no_single_gpu():
    facts = parse_facts("## nvidia-smi\nTesla T4\nNVIDIA L4\n## lspci\n## os\nubuntu-24.04\n## end\n")
    assert facts.gpus == ["T4", "L4"] and facts.gpu is None and facts.source == "nvidia-smi"


def test_cpu_host_without_lspci():
    facts = parse_facts("## nvidia-smi\n## lspci\n## lspci-missing\n## os\ndebian-12\n## end\n")
    assert facts.gpus == [] and facts.source == "none" and facts.pci_gpu_count is None and facts.os == "debian-12"
