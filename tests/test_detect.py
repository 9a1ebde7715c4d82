"""GPU, NVSwitch and OS detection from the facts command's output."""

from __future__ import annotations

import pytest

from gpuprov.hosts.detect import gpu_from_name, parse_facts


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


# --- GPUs by PCI class, NVSwitch from facts that identify it (issue 9, item 3) -------------------------
# 10de:2901 is the B200 GPU (pci.ids "GB100 [B200]", class 0302), not an NVSwitch; HGX B200's NVSwitches are
# Mellanox devices (aws-parallelcluster-cookbook PR #3098 counts GPUs as 10de::0302 and NVSwitches as bridges).
B200_LSPCI = "\n".join(
    f"{b}:00.0 3D controller [0302]: NVIDIA Corporation GB100 [B200] [10de:2901] (rev a1)"
    for b in ("1b", "43", "52", "61", "9d", "c3", "d1", "df")
)


def test_b200_is_a_gpu_not_an_nvswitch():
    facts = parse_facts(f"## nvidia-smi\n## lspci\n{B200_LSPCI}\n## os\nubuntu-24.04\n## instance-type\n## end\n")
    assert facts.gpus == ["B200"] * 8 and facts.pci_gpu_count == 8 and facts.source == "lspci"
    assert facts.nvswitch is False  # nothing on the NVIDIA bus identifies an NVSwitch here


def test_b200_nvswitch_comes_from_the_instance_type():
    facts = parse_facts(f"## nvidia-smi\n## lspci\n{B200_LSPCI}\n## os\nubuntu-24.04\n"
                        "## instance-type\np6-b200.48xlarge\n## end\n")
    assert facts.nvswitch is True and facts.instance_type == "p6-b200.48xlarge"
    g6 = parse_facts("## nvidia-smi\n## lspci\n## os\nubuntu-24.04\n## instance-type\ng6.xlarge\n## end\n")
    assert g6.nvswitch is False


@pytest.mark.parametrize(("line", "gpu", "unknown"), [
    ("01:00.0 3D controller [0302]: NVIDIA Corporation Device [10de:2bb1] (rev a1)", "unknown", ["10de:2bb1"]),
    ("01:00.0 VGA compatible controller [0300]: NVIDIA Corporation Device [10de:2bb5] (rev a1)", "unknown", ["10de:2bb5"]),
    ("01:00.0 3D controller [0302]: NVIDIA Corporation AD104GL [L4] [10de:27b8] (rev a1)", "L4", []),
    # an id the catalog lacks, but the host's pci.ids names the model
    ("01:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2324] (rev a1)", "H100", []),
])
def test_gpus_are_found_by_class_and_unknown_ids_are_reported(line, gpu, unknown):
    facts = parse_facts(f"## nvidia-smi\n## lspci\n{line}\n## os\nubuntu-24.04\n## end\n")
    assert facts.gpus == [gpu] and facts.unknown_pci_ids == unknown
    if unknown:
        assert facts.unknown_gpu_text == f"NVIDIA {unknown[0]}, unknown model"


def test_non_gpu_nvidia_functions_are_not_gpus():
    lines = ("01:00.1 Audio device [0403]: NVIDIA Corporation Device [10de:22bc] (rev a1)\n"
             "c5:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)\n")
    facts = parse_facts(f"## nvidia-smi\n## lspci\n{lines}## os\nubuntu-24.04\n## end\n")
    assert facts.gpus == [] and facts.nvswitch is True and facts.source == "none"


def test_unknown_model_stops_bootstrap_planning_with_pass_gpu():
    from gpuprov.errors import UserInputError
    from gpuprov.hosts.planner import Planner
    from gpuprov.plan.inventory import Target
    from gpuprov.plan.stack import StackPins

    facts = parse_facts("## nvidia-smi\n## lspci\n01:00.0 3D controller [0302]: NVIDIA Corporation Device "
                        "[10de:2bb1] (rev a1)\n## os\nubuntu-24.04\n## end\n")
    with pytest.raises(UserInputError) as exc:
        Planner(None, "pytorch", None, StackPins())(Target(host="gpu1"), facts)
    assert "NVIDIA 10de:2bb1, unknown model: pass --gpu" in str(exc.value)
    plan = Planner("L4", "minimal", None, StackPins())(Target(host="gpu1"), facts)
    assert plan.gpu and plan.gpu.name == "L4"


def test_a_hosts_plan_is_known_ahead_when_the_command_line_names_its_gpu_and_os():
    """Then bootstrap renders it before contacting any host; a host whose facts agree gets that same plan."""
    from gpuprov.hosts.planner import Planner
    from gpuprov.plan.inventory import Target
    from gpuprov.plan.stack import StackPins

    host = Target(host="gpu1")
    l4 = parse_facts("## nvidia-smi\nNVIDIA L4\n## lspci\n## os\nubuntu-24.04\n## end\n")
    planner = Planner("L4", "minimal", "ubuntu-24.04", StackPins())
    ahead = planner.ahead(host)
    assert ahead is not None and ahead.gpu and ahead.gpu.name == "L4"
    assert planner(host, l4) is ahead
    assert Planner(None, "minimal", "ubuntu-24.04", StackPins()).ahead(host) is None  # the GPU comes from the facts
    assert Planner("L4", "minimal", None, StackPins()).ahead(host) is None  # the OS too
    assert Planner("L4", "minimal", None, StackPins()).ahead(Target(host="gpu1", os="ubuntu-22.04")) is not None


# --- NVSwitch as NVIDIA's own tools tell it, every generation (detect.NVSWITCH_SCAN) -----------------------------

@pytest.mark.parametrize(("section", "seen"), [
    ("proc 0\nproc 1\n", ["proc 0", "proc 1"]),  # the driver's /proc/driver/nvidia-nvswitch/devices (gen 1-3)
    ("ib mlx5_8\npci 0000:e0:00.0\n", ["ib mlx5_8", "pci 0000:e0:00.0"]),  # VPD SW_MNG (gen 4, HGX B200)
])
def test_nvswitch_from_the_drivers_devices_or_the_bridge_functions_vpd(section: str, seen: list[str]) -> None:
    facts = parse_facts(f"## nvidia-smi\n## lspci\n{B200_LSPCI}\n## os\nubuntu-24.04\n## nvswitch\n{section}"
                        "## instance-type\n## end\n")
    assert facts.nvswitch is True and facts.nvswitch_seen == seen and facts.instance_type is None


def test_an_nvidia_bridge_is_named_where_it_was_seen() -> None:
    lspci = "c5:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)"
    facts = parse_facts(f"## nvidia-smi\n## lspci\n{lspci}\n## os\nubuntu-24.04\n## nvswitch\n## instance-type\n## end\n")
    assert facts.nvswitch and facts.nvswitch_seen == ["bridge c5:00.0"]


OS_RELEASES = [
    ('PRETTY_NAME="Ubuntu 22.04.5 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nID_LIKE=debian\n', "ubuntu-22.04"),
    ("NAME='Red Hat Enterprise Linux'\nID='rhel'\nVERSION_ID='9.4'\n", "rhel-9.4"),
    ('NAME="Amazon Linux"\nVERSION="2023"\nID="amzn"\nVERSION_ID="2023"\n', "amzn-2023"),
    ('# a comment\n\nPRETTY_NAME="Debian GNU/Linux trixie/sid"\nID=debian\n', None),  # sid: no VERSION_ID
    ('ID=ubuntu\nVERSION_ID="24.04"', "ubuntu-24.04"),  # no newline after the last line
]


@pytest.mark.parametrize(("text", "os_name"), OS_RELEASES)
@pytest.mark.parametrize("shell", ["bash", "dash"])
def test_the_os_is_read_by_the_shell_itself_as_sourcing_os_release_read_it(tmp_path, shell, text, os_name):
    """The facts' OS line, read with `read` and `case` (no subshell), prints what `. /etc/os-release` printed, in
    bash and in a POSIX sh (the first exec runs in the login shell), and parses to the same OS."""
    import shutil
    import subprocess

    from gpuprov.hosts.detect import OS_RELEASE

    if shutil.which(shell) is None:
        pytest.skip(f"no {shell} here")
    release = tmp_path / "os-release"
    release.write_text(text)
    ours = subprocess.run([shell, "-c", OS_RELEASE.replace("/etc/os-release", str(release))], capture_output=True,
                          text=True, check=True)
    sourced = subprocess.run([shell, "-c", f'( . {release} && echo "$ID-$VERSION_ID" )'], capture_output=True,
                             text=True, check=True)
    assert ours.stdout == sourced.stdout and ours.stderr == ""
    assert parse_facts(f"## nvidia-smi\n## lspci\n## os\n{ours.stdout}## end\n").os == os_name
    missing = subprocess.run([shell, "-c", OS_RELEASE.replace("/etc/os-release", str(tmp_path / "none"))],
                             capture_output=True, text=True, check=True)
    assert missing.stdout == missing.stderr == ""  # no file: an empty section, as before
