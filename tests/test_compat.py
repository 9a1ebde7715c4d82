"""The stack resolver against the reference facts (gpu-stack-facts.md §s cited per case)."""

from __future__ import annotations

import pytest

from gpuprov.errors import StackConflict, UserInputError
from gpuprov.plan import catalog, compat
from gpuprov.plan import pins as pin_rules
from gpuprov.plan import stack as st
from gpuprov.plan.stack import StackPins

CAT = catalog.load()


def resolve(gpu: str, os_name: str = "ubuntu-24.04", nvswitch: bool | None = None, want_torch: bool = True, **pins):
    return compat.resolve(CAT.gpu(gpu), os_name, StackPins(**pins), nvswitch=nvswitch, want_torch=want_torch)


# --- defaults: the newest stack that works for each GPU (§2c, §4a, §4c) ------------------------

@pytest.mark.parametrize(
    ("gpu", "branch", "module", "variant"),
    [
        # torch 2.15 (PyPI 2026-10-28): its PyPI wheel depends on cuda-toolkit==13.2.2, so cu132 is the default
        ("T4", 595, "open", "cu132"),
        ("V100", 580, "proprietary", "cu126"),  # §2c: R580 last for Volta; 2.15 has no CUDA 12 wheels: 2.14+cu126
        ("A10G", 595, "open", "cu132"),
        ("L4", 595, "open", "cu132"),  # sm_89 runs sm_86 SASS (§2b)
        ("L40S", 595, "open", "cu132"),
        ("A100-40GB", 595, "open", "cu132"),
        ("A100-80GB", 595, "open", "cu132"),
        ("H100", 595, "open", "cu132"),
        ("H200", 595, "open", "cu132"),
        ("B200", 595, "open", "cu132"),  # §2c: open only
    ],
)
def test_default_stack_per_gpu(gpu, branch, module, variant):
    stack = resolve(gpu)
    assert stack.driver_branch == branch
    assert stack.kernel_module == module
    assert stack.torch is not None
    assert stack.torch.version == ("2.14" if gpu == "V100" else "2.15")
    assert stack.torch.variant == variant
    assert stack.torch.index_url == f"https://download.pytorch.org/whl/{variant}"
    assert stack.python == "3.12"
    assert stack.driver_package == ("nvidia-open" if module == "open" else "cuda-drivers")
    assert stack.driver_pinning_package == f"nvidia-driver-pinning-{branch}"


def test_default_driver_satisfies_the_wheel_minimum():
    for gpu in CAT.gpus:
        stack = resolve(gpu.name)
        assert stack.min_driver is not None
        assert stack.driver_branch >= int(stack.min_driver.split(".")[0])


# --- V100 (§2c, §4b, §4c) ----------------------------------------------------------------------

def test_v100_with_cu130_is_refused_naming_sm70_and_a_working_variant():
    with pytest.raises(StackConflict) as exc:
        resolve("V100", torch_cuda="cu130")
    text = str(exc.value)
    assert exc.value.field == "--torch-cuda"
    assert exc.value.rule == "wheel-no-sass"  # the wheel lacks sm_70: the precise fact (no CUDA-range rule of its own)
    assert "sm_70" in text
    assert "--torch-cuda cu126" in text
    assert "driver R580, proprietary kernel module" in text


def test_v100_with_torch_2_11_cu128_is_refused():
    with pytest.raises(StackConflict) as exc:
        resolve("V100", torch="2.11", torch_cuda="cu128")
    assert exc.value.rule == "wheel-no-sass"
    assert "sm_70" in str(exc.value)
    assert "cu126" in exc.value.hint


def test_v100_with_torch_2_7_cu128_is_refused_but_2_10_cu128_works():
    with pytest.raises(StackConflict) as exc:
        resolve("V100", torch="2.7", torch_cuda="cu128")  # §4b: 2.7 cu128 has no sm_70
    assert exc.value.rule == "wheel-no-sass"
    stack = resolve("V100", torch="2.10", torch_cuda="cu128")  # §4b: sm_70 back in 2.8–2.10 cu128
    assert (stack.driver_branch, stack.kernel_module) == (580, "proprietary")


def test_v100_driver_above_r580_is_refused():
    with pytest.raises(StackConflict) as exc:
        resolve("V100", driver="590")
    assert "R580" in str(exc.value) and exc.value.field == "--driver"
    assert exc.value.rule == "gpu-max-driver-branch"


def test_v100_cuda_13_toolkit_is_refused():
    with pytest.raises(StackConflict) as exc:
        resolve("V100", cuda="13.0")
    assert exc.value.rule == "toolkit-max-cuda"
    assert "12.9" in str(exc.value)


def test_v100_without_pins_picks_cu128_on_torch_2_10_when_pinned_there():
    stack = resolve("V100", torch="2.10")
    assert stack.torch and stack.torch.variant == "cu128"  # the release's PyPI default, which carries sm_70


# --- B200 (§2c, §2e, §4c) ----------------------------------------------------------------------

def test_b200_open_module_fm_and_nvlsm_on_nvswitch():
    stack = resolve("B200", nvswitch=True)
    assert stack.kernel_module == "open"
    assert stack.fabric_manager == "required"
    assert stack.nvlsm is True
    assert stack.torch and stack.torch.variant in {"cu128", "cu129", "cu130", "cu132"}


@pytest.mark.parametrize(("pins", "needle", "rule"), [
    ({"torch": "2.6"}, "torch ≥ 2.7", "arch-min-torch"),
    ({"torch_cuda": "cu126"}, "sm_100", "wheel-no-sass"),
    # Blackwell's own floor is named before R550's missing pinning package (whose hint, "an older branch that is
    # already installed" through minor-version compatibility, would not help a B200)
    ({"driver": "550"}, "needs driver branch ≥ R570", "gpu-min-driver-branch"),
])
def test_b200_refuses_old_torch_wrong_variant_and_old_driver(pins, needle, rule):
    with pytest.raises(StackConflict) as exc:
        resolve("B200", **pins)
    assert needle in str(exc.value)
    assert exc.value.rule == rule


def test_b200_with_r570_gets_cu128():
    stack = resolve("B200", driver="570")
    assert stack.torch and stack.torch.variant in {"cu128"}
    assert stack.driver_branch == 570


# --- Fabric Manager on NVSwitch instance types (§2e) --------------------------------------------

@pytest.mark.parametrize("instance", ["p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge",
                                      "p5en.48xlarge", "p6-b200.48xlarge"])
def test_nvswitch_instances_need_fabric_manager(instance):
    it = CAT.instance_type(instance)
    assert it.nvswitch
    stack = resolve(it.gpu, nvswitch=True, driver="580")
    assert stack.fabric_manager == "required"
    # NVIDIA's CUDA repo names it without the branch from R580 (gpu-driver-container ubuntu24.04/install.sh)
    assert stack.fabric_manager_package == "nvidia-fabricmanager"


@pytest.mark.parametrize("instance", ["g4dn.xlarge", "g5.48xlarge", "g6e.48xlarge", "p3.16xlarge", "p5.4xlarge"])
def test_other_instances_do_not(instance):
    it = CAT.instance_type(instance)
    assert not it.nvswitch
    assert resolve(it.gpu, nvswitch=False).fabric_manager == "no"


def test_unknown_host_installs_fm_only_if_nvswitch_is_found():
    assert resolve("H100").fabric_manager == "auto"


# --- driver vs wheel CUDA minimum (§2a, Table 3) and minor-version compatibility -----------------

@pytest.mark.parametrize(("driver", "variant", "minimum"), [
    # CUDA 13.x needs ≥ 580 even with minor-version compatibility (NVIDIA CUDA compatibility guide, Table 1)
    ("570", "cu130", "580.65.06"),
    ("575", "cu130", "580.65.06"),
    ("570.211.01", "cu130", "580.65.06"),
])
def test_driver_older_than_wheel_minimum_is_refused_with_the_minimum(driver, variant, minimum):
    with pytest.raises(StackConflict) as exc:
        resolve("A100-80GB", driver=driver, torch="2.9", torch_cuda=variant)
    assert minimum in str(exc.value)
    assert exc.value.rule == "wheel-needs-newer-driver"


@pytest.mark.parametrize(("driver", "variant", "torch"), [
    ("570", "cu128", "2.9"), ("580", "cu130", "2.9"), ("580.126.09", "cu130", "2.9"), ("570.211.01", "cu126", "2.7"),
])
def test_driver_at_or_above_minimum_is_accepted(driver, variant, torch):
    stack = resolve("A100-80GB", driver=driver, torch=torch, torch_cuda=variant)
    assert stack.driver_branch == int(driver.split(".")[0])
    assert stack.driver_version == (driver if "." in driver else None)
    assert not stack.minor_version_compat


# CUDA minor-version compatibility: CUDA 12.x code runs on drivers ≥ 525, 13.x on ≥ 580
# (docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html Table 1 = Table 2 of the
# CUDA release notes; read 2026-12-01). Not covered: PTX JIT of newer code, features needing the newer driver.
@pytest.mark.parametrize(("gpu", "driver", "release", "variant"), [
    ("H100", "535", "2.14", "cu126"),  # issue 9 item 7: cu126, not 2.7+cu118
    ("H100", "550", "2.14", "cu126"),
    ("A10G", "535.309.01", "2.14", "cu126"),
    ("V100", "535", "2.14", "cu126"),
    ("H100", "525", "2.14", "cu126"),
])
def test_minor_version_compat_gives_old_drivers_the_newest_cu12x_wheel(gpu, driver, release, variant):
    wheel = compat.choose_torch_for_driver(CAT.gpu(gpu), driver)
    assert (wheel.version, wheel.variant) == (release, variant)


def test_minor_version_compat_is_a_fallback_and_says_its_limits():
    # R570 runs cu126 natively (560.28.03 ≤ 570): no compat needed
    assert not resolve("H100", driver="570").minor_version_compat
    # cu132 needs 595.45.04 natively, so torch 2.15 on R580 takes cu130 (native) before cu132 (only
    # through minor-version compatibility), although cu132 is the release's PyPI default
    stack = resolve("H100", driver="580")
    assert stack.torch and (stack.torch.version, stack.torch.variant) == ("2.15", "cu130")
    assert not stack.minor_version_compat
    forced = resolve("H100", driver="580", torch_cuda="cu132")
    assert forced.minor_version_compat
    assert any("PTX JIT" in r and "minor-version compatibility" in r for r in forced.reasons)


def test_minor_version_compat_does_not_cross_the_major():
    # B200 needs a cu128+ wheel; 2.12–2.14 have no cu128, and their 13.x wheels need ≥ 580 even with
    # minor-version compatibility, so R570 gets 2.11+cu128 (native: 570.26)
    wheel = compat.choose_torch_for_driver(CAT.gpu("B200"), "570")
    assert (wheel.version, wheel.variant) == ("2.11", "cu128")
    assert not st.minor_compat_runs("13.2", "575")
    assert st.minor_compat_runs("12.8", "535") and not st.minor_compat_runs("12.8", "520")


def test_cuda_toolkit_raises_the_default_driver_when_needed():
    stack = resolve("H100", cuda="13.3")
    # 13.3 needs 610.43.02 (§2a, secondary); R610, a New Feature Branch, ended in August 2026 (NVIDIA's lifecycle
    # page), so the oldest branch after it that NVIDIA still supports: R615, whose pinning package no source shows
    assert stack.driver_branch == 615
    assert any("13.3" in note for note in stack.unverified)
    assert any(note.startswith("nvidia-driver-pinning-615: no source read shows it") for note in stack.unverified)
    assert stack.cuda_toolkit_package == "cuda-toolkit-13-3" and not stack.warnings


def test_cuda_toolkit_older_than_the_architecture_is_refused():
    with pytest.raises(StackConflict) as exc:
        resolve("B200", cuda="12.6")  # Blackwell first appears in CUDA 12.8 (§1a note)
    assert exc.value.rule == "toolkit-min-cuda"
    assert "12.8" in str(exc.value)
    # 11.8 is the first CUDA with sm_89 (§1a note), so it is accepted for Ada:
    assert resolve("L4", "ubuntu-22.04", cuda="11.8", torch="2.4", torch_cuda="cu118").cuda_toolkit == "11.8"


# --- torch / python / variant ranges (§4a) ------------------------------------------------------

@pytest.mark.parametrize(("torch", "variant"), [("2.8", "cu130"), ("2.12", "cu128"), ("2.1", "cu124")])
def test_variant_not_built_for_that_release_is_refused(torch, variant):
    with pytest.raises(StackConflict) as exc:
        resolve("A10G", torch=torch, torch_cuda=variant)
    assert exc.value.rule == "wheel-variant-missing"
    assert "has no" in str(exc.value)


def test_pypi_default_variant_is_preferred_per_release():
    assert resolve("A10G", torch="2.9").torch.variant == "cu128"
    assert resolve("A10G", torch="2.11").torch.variant == "cu130"
    assert resolve("A10G", torch="2.9.1").torch.requirement == "torch==2.9.1"
    assert resolve("A10G", torch="2.9").torch.requirement == "torch==2.9.*"


def test_python_outside_release_range_is_refused():
    with pytest.raises(StackConflict) as exc:
        resolve("T4", torch="2.1", python="3.12")
    assert exc.value.rule == "python-range"
    assert "3.8–3.11" in str(exc.value)
    assert resolve("T4", torch="2.1").python == "3.11"


def test_minimal_stack_has_no_torch_and_rejects_torch_pins():
    stack = resolve("T4", want_torch=False)
    assert stack.torch is None
    with pytest.raises(UserInputError) as exc:
        resolve("T4", want_torch=False, torch="2.9")
    assert exc.value.field == "--torch"
    with pytest.raises(UserInputError) as exc:
        resolve("T4", want_torch=False, torch_cuda="cu128")
    assert exc.value.field == "--torch"


# --- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("pins", "field"), [
    ({"driver": "999"}, "--driver"), ({"driver": "banana"}, "--driver"), ({"cuda": "12.7"}, "--cuda"),
    ({"torch": "1.13"}, "--torch"), ({"torch_cuda": "cu999"}, "--torch-cuda"), ({"python": "three"}, "--python"),
])
def test_malformed_pins_name_the_field(pins, field):
    with pytest.raises(UserInputError) as exc:
        resolve("T4", **pins)
    assert exc.value.field == field
    assert exc.value.hint  # always says what would be valid


def test_unknown_os_is_refused():
    with pytest.raises(UserInputError) as exc:
        resolve("T4", os_name="ubuntu-20.04")
    assert "ubuntu-22.04" in exc.value.hint


def test_unverified_facts_are_reported():
    # cu132 (torch 2.14's default) needs CUDA 13.2's minimum driver, read only in a secondary copy of Table 3
    assert any("13.2" in note for note in resolve("H100").unverified)
    assert any("A10G" in note for note in resolve("A10G").unverified)
    assert not any("13.2" in note for note in resolve("H100", torch="2.9").unverified)
    # torch 2.15's arch list was carried forward from 2.14's (no 2.15 matrix was read): said where it is used
    assert any("2.15's arch list was not read" in note for note in resolve("H100").unverified)
    assert not any("2.15" in note for note in resolve("V100").unverified)
    # B200 NVSwitch: where the InfiniBand modules come from is not read in a package list
    assert any("linux-modules-extra" in note for note in resolve("B200", nvswitch=True).unverified)


# --- issue 9: facts, each with its source (read 2026-12-01), each refusal by its rule id -------------

# Fabric Manager package name: no branch suffix from R580 in NVIDIA's CUDA repo (NVIDIA/gpu-driver-container
# ubuntu24.04/install.sh @ 78fa4ac: `if [ "$DRIVER_BRANCH" -ge "580" ]` -> nvidia-fabricmanager). The driver's
# own packages lose it at R590 (NVIDIA driver guide "Ubuntu 590 and later packages"): two separate cut-offs.
@pytest.mark.parametrize(("driver", "package"), [
    ("570", "nvidia-fabricmanager-570"),
    ("575", "nvidia-fabricmanager-575"),
    ("580", "nvidia-fabricmanager"),
    ("580.126.09", "nvidia-fabricmanager"),
    ("590", "nvidia-fabricmanager"),
    ("595", "nvidia-fabricmanager"),
])
def test_fabric_manager_package_name_per_branch(driver, package):
    assert resolve("H100", nvswitch=True, driver=driver).fabric_manager_package == package


def test_fabric_manager_and_driver_package_cut_offs_are_separate_facts():
    f = st.facts()
    assert f.fabric_manager_unversioned_from.branch == 580
    assert f.driver_packages_unversioned_from.branch == 590
    assert "gpu-driver-container" in f.fabric_manager_unversioned_from.source


# torch 2.14: cu126/cu130/cu132, PyPI default cu130 (its PyPI wheels require cuda-toolkit==13.0.3, not the RFC's
# cu132); Python 3.10–3.14 (pytorch/test-infra generate_binary_build_matrix.py PYTHON_ARCHES_DICT["release"] @ 61a77570).
@pytest.mark.parametrize(("pins", "variant", "python"), [
    ({"torch": "2.14"}, "cu130", "3.12"),
    ({"torch": "2.14", "torch_cuda": "cu126"}, "cu126", "3.12"),
    ({"torch": "2.14", "torch_cuda": "cu132"}, "cu132", "3.12"),
    ({"torch": "2.14", "python": "3.10"}, "cu130", "3.10"),
    ({"torch": "2.14", "python": "3.14"}, "cu130", "3.14"),
])
def test_torch_2_14_variants_default_and_python(pins, variant, python):
    stack = resolve("H100", **pins)
    assert stack.torch and (stack.torch.version, stack.torch.variant, stack.python) == ("2.14", variant, python)


def test_torch_2_14s_pypi_default_runs_on_r580_natively():
    """What a plain `pip install torch==2.14.*` gets (cu130) needs R580, not R595: on a pinned R580 it is chosen
    without CUDA minor-version compatibility, and the floor the plan states is CUDA 13.0's."""
    stack = resolve("H100", torch="2.14", driver="580")
    assert stack.torch and (stack.torch.variant, stack.min_driver, stack.minor_version_compat) == ("cu130", "580.65.06", False)
    assert compat.variants_with_sass("2.14.1", "9.0") == ["cu130", "cu126", "cu132"]  # the PyPI default first


@pytest.mark.parametrize(("pins", "rule"), [
    ({"torch": "2.14", "torch_cuda": "cu128"}, "wheel-variant-missing"),  # 2.14 ships no cu128
    ({"torch": "2.14", "python": "3.9"}, "python-range"),
    ({"torch": "2.14", "python": "3.15"}, "python-range"),  # 3.15: nightly/test only, not release
])
def test_torch_2_14_refusals(pins, rule):
    with pytest.raises(StackConflict) as exc:
        resolve("H100", **pins)
    assert exc.value.rule == rule


def test_volta_keeps_cu126_on_2_14_since_2_15_has_no_cuda_12_wheels():
    stack = resolve("V100")  # 2.14 cu126 still carries sm_70 (RFC #190355 table)
    assert stack.torch and (stack.torch.version, stack.torch.variant) == ("2.14", "cu126")
    with pytest.raises(StackConflict) as exc:
        resolve("V100", torch="2.15")  # 2.14 is "the last release to ship any CUDA 12.x wheels" (dev-discuss, 2026-09-04)
    assert exc.value.rule == "wheel-no-sass" and "torch 2.15+cu132 wheels carry code for sm_75" in exc.value.problem
    with pytest.raises(StackConflict) as exc:
        resolve("H100", torch="2.15", torch_cuda="cu126")
    assert exc.value.rule == "wheel-variant-missing" and "it ships cu130, cu132" in exc.value.problem


@pytest.mark.parametrize(("pins", "release", "python"), [
    ({}, "2.15", "3.12"),
    ({"python": "3.10"}, "2.14", "3.10"),  # 2.15 raised Requires-Python to >=3.11: the newest that fits is 2.14
    ({"python": "3.15"}, "2.15", "3.15"),  # 2.15 ships cp315 wheels
])
def test_the_default_torch_is_the_newest_release_that_fits_the_python(pins, release, python):
    stack = resolve("H100", **pins)
    assert stack.torch and (stack.torch.version, stack.python) == (release, python)


def test_the_pypi_default_variant_keeps_the_driver_floor_low():
    # 2.15's PyPI default (cu132) needs 595.45.04; a pinned R580 gets 2.15's cu130 (580.65.06), not an older release
    # and not cu132 through minor-version compatibility
    assert resolve("H100").min_driver == st.facts().cuda_min_driver["13.2"].driver
    on_580 = resolve("H100", driver="580")
    assert on_580.torch and (on_580.torch.version, on_580.torch.variant) == ("2.15", "cu130")
    assert on_580.min_driver == "580.65.06" and not on_580.minor_version_compat


# Branches without nvidia-driver-pinning-<branch> (only R570+; NVIDIA driver guide "Recent Updates").
@pytest.mark.parametrize("driver", ["535", "550", "560", "535.274.02"])
def test_branches_without_a_pinning_package_are_refused_with_what_works(driver):
    with pytest.raises(StackConflict) as exc:
        resolve("H100", driver=driver)
    assert exc.value.rule == "driver-no-pinning-package"
    assert exc.value.field == "--driver"
    assert "--driver 570" in exc.value.hint and "nvidia-driver-pinning" in exc.value.problem


# Exact versions are checked against the releases NVIDIA built (gpu-driver-container versions.mk history),
# then against the releases a public source shows an nvidia-driver-pinning-<version> package for
# (stack.yaml driver_pinning.exact_versions: dsx-ai-factory/infra-controller#6049, public apt listings).
@pytest.mark.parametrize(("driver", "rule"), [
    ("580.126.09", None), ("570.211.01", None), ("590.48.01", None), ("595.71.05", None),
    ("580.95.05", "driver-version-no-pinning-package"), ("595.91.07", "driver-version-no-pinning-package"),
    ("580.95.06", "driver-version-unknown"), ("580.99.99", "driver-version-unknown"), ("590.1", "driver-version-unknown"),
])
def test_exact_driver_versions_are_checked_against_the_data(driver, rule):
    if rule is None:
        stack = resolve("H100", driver=driver)
        assert stack.driver_pinning_package == f"nvidia-driver-pinning-{driver}"
        return
    with pytest.raises(StackConflict) as exc:
        resolve("H100", driver=driver)
    assert exc.value.rule == rule
    assert f"--driver {driver.split('.')[0]}" in exc.value.hint


def test_help_example_driver_version_exists_in_the_data():
    import re

    import click

    from gpuprov.cli import main

    plan = main.get_command(click.Context(main), "plan")
    assert plan is not None
    (driver,) = [p for p in plan.params if p.name == "driver"]
    examples = re.findall(r"\b(\d{3}\.\d+\.\d+)\b", driver.help or "")
    assert examples  # the --driver help shows an exact release
    for version in examples:
        assert version in st.facts().driver_versions.get(int(version.split(".")[0]), ()), version
        assert version in st.facts().driver_pinning.exact_versions, version  # and it has a pinning package


# nvcc must match the torch wheel's CUDA major (torch/utils/cpp_extension.py `_check_cuda_version` raises
# on a major mismatch): refused with the matching choice.
@pytest.mark.parametrize(("gpu", "pins", "hint"), [
    ("H100", {"torch_cuda": "cu130", "cuda": "12.8"}, "--cuda 13.0"),
    ("H100", {"torch": "2.9", "torch_cuda": "cu128", "cuda": "13.0"}, "--cuda 12.8"),
    ("V100", {"torch_cuda": "cu126", "cuda": "13.0"}, "12.9"),  # V100's toolkit limit names the cause first
])
def test_nvcc_major_must_match_the_wheel(gpu, pins, hint):
    with pytest.raises(StackConflict) as exc:
        resolve(gpu, **pins)
    assert hint in str(exc.value)
    if gpu == "H100":
        assert exc.value.rule == "nvcc-torch-major-mismatch" and exc.value.field == "--cuda"


def test_unpinned_torch_follows_the_toolkit_major():
    stack = resolve("H100", cuda="12.8")  # no torch pin: the newest wheel of CUDA 12 (2.14+cu126)
    assert stack.torch and stack.torch.variant == "cu126" and stack.cuda_toolkit == "12.8"
    stack = resolve("H100", cuda="13.0")
    assert stack.torch and stack.torch.cuda.startswith("13.")


def test_b200_fabric_step_carries_the_infiniband_facts():
    stack = resolve("B200", nvswitch=True)
    assert stack.nvlsm and stack.fabric_extra_packages == ("nvlsm", "infiniband-diags")
    assert stack.fabric_kernel_modules == ("ib_umad", "mlx5_ib")
    assert stack.fabric_modules_package == "linux-modules-extra-$(uname -r)"
    assert resolve("H100", nvswitch=True).fabric_kernel_modules == ()
    assert resolve("B200", nvswitch=False).fabric_kernel_modules == ()


@pytest.mark.parametrize(("gpu", "pins"), [
    ("V100", {"driver": "570", "cuda": "12.9"}),  # 12.9 needs 575.51.03
    ("L4", {"driver": "570", "cuda": "12.9"}),
])
def test_toolkit_newer_than_the_pinned_driver_is_refused_by_the_toolkit_rule(gpu, pins):
    with pytest.raises(StackConflict) as exc:
        resolve(gpu, **pins)
    assert exc.value.rule == "toolkit-needs-newer-driver" and exc.value.field == "--driver"
    assert f"CUDA {pins['cuda']} needs driver" in exc.value.problem


# --- what `gpuprov plan` says about the stack: the reason for each choice, and what is unverified -------------

@pytest.mark.parametrize(("gpu", "pins", "driver_reason", "module_reason"), [
    ("V100", {}, "driver R580: the last branch that supports Volta", "proprietary kernel module: Volta has no open module"),
    ("H100", {}, "driver R595: the branch AWS ships in its current GPU images",
     "open kernel module: NVIDIA's default since R560"),
    ("H100", {"cuda": "13.3"}, "driver R615: the oldest branch new enough for the requested CUDA", None),
    ("B200", {}, None, "open kernel module: Blackwell supports only the open module"),
])
def test_each_choice_says_why(gpu, pins, driver_reason, module_reason):
    reasons = resolve(gpu, **pins).reasons
    assert driver_reason is None or driver_reason in reasons
    assert module_reason is None or module_reason in reasons
    assert any(r.startswith("torch ") and "newest wheel that carries code for" in r for r in reasons)


def test_a_pinned_driver_gives_no_driver_reason_but_names_its_unverified_facts():
    stack = resolve("H100", driver="580")
    assert not any(r.startswith("driver R") for r in stack.reasons)
    assert f"driver pinning packages: {st.facts().driver_pinning.unverified}" in stack.unverified


def test_unverified_wheel_archs_and_python_ranges_are_listed():
    f = st.facts()
    old = resolve("T4", torch="2.4", torch_cuda="cu121")  # arch lists of 2.1-2.5 wheels are marked unverified
    row = st.wheel_archs("2.4", "cu121")
    assert row and row.unverified and row.unverified in old.unverified
    assert f.python_ranges_unverified not in old.unverified
    assert f.python_ranges_unverified in resolve("T4", torch="2.4", torch_cuda="cu121", python="3.10").unverified
    assert not any("arch lists" in u for u in resolve("T4").unverified)  # 2.14's lists were read


# --- what a refusal offers instead: one pin dropped at a time, the failing field's first, at most two -----------

@pytest.mark.parametrize(("gpu", "pins", "hint"), [
    ("V100", {"torch": "2.11", "torch_cuda": "cu128"},
     "this works instead: --torch-cuda cu126 (torch 2.11+cu126, driver R580, proprietary kernel module); "
     "or --torch 2.10 (torch 2.10+cu128, driver R580, proprietary kernel module)"),
    ("T4", {"torch": "2.1", "python": "3.12"},
     "this works instead: --torch 2.15 (torch 2.15+cu132, driver R595, open kernel module); "
     "or --python 3.11 (torch 2.1+cu121, driver R595, open kernel module)"),
    ("H100", {"driver": "570", "torch_cuda": "cu130"},
     "this works instead: --torch-cuda cu126 (torch 2.14+cu126, driver R570, open kernel module); "
     "or --driver 595 (torch 2.15+cu130, driver R595, open kernel module)"),
    ("V100", {"torch_cuda": "cu130", "python": "3.12"},  # dropping --python alone does not help: not offered
     "this works instead: --torch-cuda cu126 (torch 2.14+cu126, driver R580, proprietary kernel module)"),
    ("V100", {"driver": "590"}, "use --driver 580 (proprietary kernel module)"),  # a rule's own hint is kept
])
def test_a_refusal_offers_what_works_with_one_pin_dropped(gpu, pins, hint):
    with pytest.raises(StackConflict) as exc:
        resolve(gpu, **pins)
    assert exc.value.hint == hint


def test_dropping_the_toolkit_pin_is_described_as_such():
    stack = resolve("H100")
    assert compat._describe_change("cuda", stack) == (
        "no --cuda (the torch wheel bundles its own CUDA runtime) (torch 2.15+cu132, driver R595, open kernel module)")
    bare = resolve("H100", want_torch=False)
    assert compat._describe_change("torch", bare) == "no --torch (driver R595, open kernel module)"
    assert compat._describe_change("torch_cuda", bare) == "no --torch-cuda (driver R595, open kernel module)"


@pytest.mark.parametrize(("gpu", "branch", "cuda"), [
    ("V100", 580, "12.9"),  # Volta stops at CUDA 12.9 even on R580, which runs 13.0
    ("H100", 570, "12.8"), ("H100", 580, "13.0"), ("T4", 535, "12.2"),
])
def test_newest_cuda_a_branch_runs_on_a_gpu(gpu, branch, cuda):
    assert compat.newest_cuda(CAT.gpu(gpu), branch) == cuda


@pytest.mark.parametrize(("cuda", "branch", "minimum"), [("13.4", 615, "615.71.09"), ("13.5", 620, "620.70.06")])
def test_cuda_13_4_and_13_5_are_known_and_take_the_branch_that_runs_them(cuda, branch, minimum):
    stack = resolve("H100", cuda=cuda)
    assert (stack.cuda_toolkit, stack.driver_branch, stack.min_driver) == (cuda, branch, minimum)
    assert minimum in st.facts().driver_versions[branch]  # a release that exists, so `--driver {minimum}` installs it
    assert stack.torch and stack.torch.cuda.split(".")[0] == "13"  # nvcc and the wheel share CUDA's major
    assert any(f"CUDA {cuda}'s minimum driver" in u for u in stack.unverified)  # not read in Table 3: said so
    with pytest.raises(StackConflict) as exc:  # an older branch is refused by the toolkit's minimum
        resolve("H100", cuda=cuda, driver="595")
    assert exc.value.rule == "toolkit-needs-newer-driver" and f"CUDA {cuda} needs driver ≥ {minimum}" in exc.value.problem
    with pytest.raises(StackConflict) as volta:  # Volta stops at CUDA 12.9 whatever the branch
        resolve("V100", cuda=cuda)
    assert volta.value.rule == "toolkit-max-cuda"


def test_unverified_toolkit_minimums_change_no_default():
    """A minimum driver marked unverified (13.2 to 13.5) is used when asked for (--cuda), never chosen by itself:
    the default stack and the toolkit a driver-only plan gets stay where they were."""
    stack = resolve("H100")
    assert (stack.driver_branch, stack.torch.version, stack.torch.variant, stack.cuda_toolkit) == (595, "2.15", "cu132", None)
    assert compat.newest_cuda(CAT.gpu("H100"), 620) == compat.newest_cuda(CAT.gpu("H100"), 615) == "13.1"


@pytest.mark.parametrize(("release", "cc", "variants"), [
    ("2.14", "10.0", ["cu130", "cu132"]),  # the PyPI default first
    ("2.14", "7.0", ["cu126"]),
    ("2.14.0+cu126", "8.9", ["cu130", "cu126", "cu132"]),  # a full version works too; sm_89 runs sm_86 code
    ("2.11", "12.0", ["cu130", "cu128"]),
    ("1.9", "8.0", []),  # a release the data does not know
])
def test_variants_with_code_for_a_gpu(release, cc, variants):
    assert compat.variants_with_sass(release, cc) == variants


# --- every refusal names its flag, says what is wrong with the value given, and what to do --------------------

@pytest.mark.parametrize(("gpu", "pins", "field", "value"), [
    ("V100", {"torch_cuda": "cu130"}, "--torch-cuda", "cu130"),
    ("V100", {"driver": "590"}, "--driver", "R590"),
    ("B200", {"torch": "2.6"}, "--torch", "2.7"),
    ("L4", {"driver": "570", "cuda": "12.9"}, "--driver", "12.9"),
    ("V100", {"cuda": "13.0"}, "--cuda", "13.0"),
    ("B200", {"cuda": "12.6"}, "--cuda", "12.8"),
    ("A10G", {"torch": "2.8", "torch_cuda": "cu130"}, "--torch-cuda", "cu130"),
    ("T4", {"torch": "2.1", "python": "3.12"}, "--torch", "3.12"),
    ("H100", {"driver": "550"}, "--driver", "R550"),
    ("H100", {"driver": "580.1.2"}, "--driver", "580.1.2"),
    ("H100", {"driver": "abc"}, "--driver", "'abc'"),
    ("H100", {"driver": "999"}, "--driver", "999"),
    ("H100", {"cuda": "9.9"}, "--cuda", "'9.9'"),
    ("H100", {"torch": "0.1"}, "--torch", "'0.1'"),
    ("H100", {"torch_cuda": "cu999"}, "--torch-cuda", "'cu999'"),
    ("H100", {"python": "three"}, "--python", "'three'"),
])
def test_every_refusal_names_the_flag_the_value_and_a_way_out(gpu, pins, field, value):
    with pytest.raises(UserInputError) as exc:  # StackConflict is a UserInputError
        resolve(gpu, **pins)
    assert exc.value.field == field
    assert value in exc.value.problem
    assert exc.value.hint


def test_unsupported_os_is_named():
    with pytest.raises(UserInputError) as exc:
        resolve("H100", os_name="windows-11")
    assert (exc.value.field, exc.value.problem) == ("--os", "unsupported OS 'windows-11'")
    assert exc.value.hint.startswith("choose one of: ubuntu-")


@pytest.mark.parametrize(("gpu", "pins", "branch"), [
    ("V100", {"driver": "580"}, 580),  # Volta's last branch itself is allowed
    ("B200", {"torch": "2.7"}, 595),  # Blackwell's first torch itself is allowed
])
def test_the_limits_themselves_are_allowed(gpu, pins, branch):
    assert resolve(gpu, **pins).driver_branch == branch


def test_a_torchless_stack_needs_no_minor_version_compat_and_r550s_hint_starts_at_r570():
    assert resolve("T4", want_torch=False).minor_version_compat is False
    with pytest.raises(StackConflict) as exc:
        resolve("H100", driver="550")
    assert "(known: 570, " in exc.value.hint  # R570, the first branch with a pinning package, is installable


# --- refusal texts a user acts on, as printed -----------------------------------------------------------------

def _refusal(gpu, **pins):
    with pytest.raises(UserInputError) as exc:
        resolve(gpu, **pins)
    return exc.value


def test_driver_version_refusals_list_the_releases_that_would_do():
    unknown = _refusal("H100", driver="580.1.2")
    assert unknown.hint.startswith("known R580 releases: 580.65.06, 580.82.07, ")
    assert unknown.hint.endswith("; or pin only the branch: --driver 580")
    unpinned = _refusal("H100", driver="580.65.06")  # a real release, but no pinning package is known for it
    assert unpinned.rule == "driver-version-no-pinning-package"
    assert unpinned.problem.startswith("driver 580.65.06 is a real R580 release, but no source shows an "
                                       "nvidia-driver-pinning-580.65.06 package")
    assert unpinned.hint == ("R580 releases with one: 580.105.08, 580.126.09, 580.126.16, 580.126.20, 580.159.03; "
                             "or pin only the branch: --driver 580")


def test_wheel_refusals_say_what_the_wheel_has_and_needs():
    assert _refusal("V100", torch_cuda="cu130").problem == (
        "torch 2.15+cu130 wheels carry code for sm_75, sm_80, sm_86, sm_90, sm_100, sm_120, not V100's sm_70")
    assert _refusal("H100", driver="570", torch_cuda="cu130").problem == (
        "cu130 wheels (CUDA 13.0) need driver ≥ 580.65.06 (or ≥ 580.65.06 through CUDA minor-version "
        "compatibility) (R580); driver 570 is older")
    python = _refusal("T4", python="3.16")
    assert (python.field, python.rule, python.problem) == ("--python", "python-range",
                                                          "torch 2.15 supports Python 3.11–3.15, not 3.16")


def test_toolkit_refusals_say_which_toolkit_would_do():
    assert _refusal("V100", cuda="13.0").hint == "use --cuda 12.9"
    assert _refusal("B200", cuda="12.6").hint == "use --cuda 12.8 or newer"
    # 12.9 needs 575.51.03; R575 has ended (NVIDIA lists it as end of life), so the hint names R580
    assert _refusal("L4", driver="570", cuda="12.9").hint == "use --driver 580 or newer, or an older --cuda"


def test_an_exact_driver_release_below_a_cudas_minimum_runs_it_only_through_minor_version_compat():
    minimum = st.facts().cuda_min_driver["12.8"].driver
    assert st.driver_runs("12.8", minimum) == (True, False)  # the minimum itself runs natively
    assert st.driver_runs("12.8", "570.10.01") == (True, True)  # same branch, an older release
    assert st.driver_runs("12.8", "520") == (False, False)  # below 12.x's minor-compat floor (525.60.13)
    assert not st.minor_compat_runs("10.2", "999")  # no minor-version compatibility family for CUDA 10


def test_fabric_manager_reason_and_gen4_extras_only_where_they_apply():
    b200 = resolve("B200", nvswitch=True)
    gen4 = st.facts().nvswitch_gen4
    assert (b200.fabric_extra_packages, b200.fabric_modules_package, b200.fabric_modules_load_file) == (
        gen4.packages, gen4.kernel_modules_package["apt"], gen4.modules_load_file)
    assert any(r.endswith("both held; with nvlsm and the ib_umad/mlx5_ib modules (NVSwitch gen 4)") for r in b200.reasons)
    h100 = resolve("H100", nvswitch=True)
    assert (h100.nvlsm, h100.fabric_extra_packages, h100.fabric_modules_package, h100.fabric_modules_load_file) == (
        False, (), None, None)
    assert any(r.startswith("Fabric Manager (") and r.endswith("both held") for r in h100.reasons)
    assert not any("InfiniBand" in u for u in h100.unverified)
    assert not any(r.startswith("Fabric Manager") for r in resolve("H100", nvswitch=False).reasons)


def test_an_exact_driver_pin_lists_its_unverified_release_fact():
    stack = resolve("H100", driver="580.105.08")
    assert f"--driver 580.105.08: {st.facts().driver_versions_unverified}" in stack.unverified


def test_a_branch_without_any_pinned_release_offers_only_the_branch_and_nvcc_offers_both_ways():
    assert _refusal("H100", driver="575.57.08").hint == "or pin only the branch: --driver 575"
    assert _refusal("H100", cuda="12.8", torch_cuda="cu130").hint == (
        "use --cuda 13.0 (the wheel's CUDA)")  # torch 2.15 has no CUDA 12 wheel to offer
    assert _refusal("H100", cuda="12.8", torch="2.14", torch_cuda="cu130").hint == (
        "use --cuda 13.0 (the wheel's CUDA), or --torch-cuda cu126 (a CUDA 12 wheel of torch 2.14)")
    assert _refusal("H100", cuda="13.0", torch="2.11", torch_cuda="cu128").hint == (
        "use --cuda 12.8 (the wheel's CUDA), or --torch-cuda cu130 (a CUDA 13 wheel of torch 2.11)")


def test_remaining_refusal_details():
    no_list = _refusal("H100", driver="615.1.2")  # R615 is installable, but no release of it is listed
    assert (no_list.rule, no_list.hint) == ("driver-version-unknown",
                                            "known R615 releases: 615.71.09, 615.71.10; or pin only the branch: --driver 615")
    no_release = _refusal("H100", driver="590.1.2")  # R590 with its one release listed
    assert no_release.hint == "known R590 releases: 590.48.01; or pin only the branch: --driver 590"
    assert _refusal("H100", driver="580.65.06").field == "--driver"
    torchless = _refusal("T4", want_torch=False, torch="2.9")
    assert (torchless.problem, torchless.hint) == ("this playbook installs no PyTorch, so a torch pin has no effect",
                                                   "drop the pin or use -p pytorch")
    assert not st.minor_compat_runs("13.0", "580.10.01")  # an R580 release older than 13.x's floor (580.65.06)


def test_an_nvcc_mismatch_without_a_wheel_of_the_toolkits_major_offers_only_the_wheels_cuda():
    assert _refusal("H100", cuda="13.0", torch="2.1").hint == "use --cuda 12.1 (the wheel's CUDA)"  # 2.1 has no cu13x


# --- rules that used to be shadowed (issue 13): the data keeps them implied, and the one with a root cause fires -----

def test_a_gpu_below_its_minimum_branch_hears_that_first_with_a_branch_that_works():
    for driver in ("535", "550", "560"):  # no pinning package either: the GPU's floor is the cause that matters
        with pytest.raises(StackConflict) as exc:
            resolve("B200", driver=driver)
        assert (exc.value.rule, exc.value.field) == ("gpu-min-driver-branch", "--driver")
        assert exc.value.problem == "B200 (sm_100) needs driver branch ≥ R570"
        assert exc.value.hint == "use --driver 570 or newer"
    with pytest.raises(StackConflict) as exc:  # a GPU without that floor still hears about the pinning package
        resolve("H100", driver="550")
    assert exc.value.rule == "driver-no-pinning-package"
    assert check_pins_rule(StackPins(driver="550")) == "driver-no-pinning-package"  # before any GPU is known


def check_pins_rule(pins):
    with pytest.raises(StackConflict) as exc:
        pin_rules.check_pins(pins)
    return exc.value.rule


def test_every_wheel_with_code_for_a_gpu_is_within_its_architectures_cuda_range():
    """Why `_torch_problem` has no CUDA-range rule of its own: no toolkit outside an architecture's CUDA range
    builds code for it, so a wheel's arch list already says it (V100 + cu130 is `wheel-no-sass`). A data row
    that broke this would need that rule back."""
    f = st.facts()
    for gpu in CAT.gpus:
        arch = f.architectures[gpu.arch]
        for release, info in f.torch_releases.items():
            for variant in info.variants:
                archs = st.wheel_archs(release, variant)
                assert archs is not None, (release, variant)
                if not st.sm_runs(archs.sm, gpu.compute_capability):
                    continue
                cuda = st.version_tuple(st.variant_cuda(variant))
                assert not arch.max_cuda or cuda <= st.version_tuple(arch.max_cuda), (gpu.name, release, variant)
                assert not arch.min_cuda or cuda >= st.version_tuple(arch.min_cuda), (gpu.name, release, variant)


def test_an_architectures_last_branch_runs_its_cuda_and_comes_before_its_kernel_module_goes():
    """Why `_check_driver_pin` has no proprietary-module rule and `_choose_branch` no "CUDA needs a branch above
    the architecture's last" rule: the last branch is below the proprietary module's removal, and runs every
    CUDA up to the architecture's max_cuda (so `gpu-max-driver-branch` / `toolkit-max-cuda` name the cause)."""
    f = st.facts()
    limited = {name: a for name, a in f.architectures.items() if a.max_driver_branch}
    assert set(limited) == {"volta"}
    for arch in f.architectures.values():
        if arch.kernel_module == "proprietary":
            assert arch.max_driver_branch is not None and arch.max_driver_branch < f.proprietary_removed_in
    for arch in limited.values():
        assert arch.max_driver_branch == f.last_volta_branch and arch.max_cuda
        for cuda, minimum in f.cuda_min_driver.items():
            if st.version_tuple(cuda) <= st.version_tuple(arch.max_cuda):
                assert st.min_branch_for(minimum.driver) <= arch.max_driver_branch, cuda
    with pytest.raises(StackConflict) as exc:  # Volta on R620, where the proprietary module is gone too
        resolve("V100", driver="620")
    assert exc.value.rule == "gpu-max-driver-branch" and exc.value.hint == "use --driver 580 (proprietary kernel module)"


def test_every_valid_torch_pin_leaves_a_candidate_wheel_so_a_refusal_always_has_a_rule():
    f = st.facts()
    variants = sorted({v for info in f.torch_releases.values() for v in info.variants})
    for torch in (None, *f.torch_releases):
        for torch_cuda in (None, *variants):
            pins = StackPins(torch=torch, torch_cuda=torch_cuda)
            pin_rules.check_pins(pins)
            assert list(compat._torch_candidates(pins)), pins


def test_alternatives_skip_a_dropped_pin_that_does_not_help_and_go_on():
    # torch 2.7 stops at Python 3.13: dropping --torch-cuda (the field named first) still fails, the next two work
    with pytest.raises(StackConflict) as exc:
        resolve("V100", torch="2.7", torch_cuda="cu126", python="3.14")
    assert (exc.value.rule, exc.value.field) == ("python-range", "--torch-cuda")
    assert exc.value.hint == (
        "this works instead: --torch 2.14 (torch 2.14+cu126, driver R580, proprietary kernel module); "
        "or --python 3.12 (torch 2.7+cu126, driver R580, proprietary kernel module)")
