"""The stack resolver against the reference facts (gpu-stack-facts.md §s cited per case)."""

from __future__ import annotations

import pytest

from gpuprov import catalog, compat
from gpuprov.compat import StackPins
from gpuprov.errors import StackConflict, UserInputError

CAT = catalog.load()


def resolve(gpu: str, os_name: str = "ubuntu-24.04", nvswitch: bool | None = None, want_torch: bool = True, **pins):
    return compat.resolve(CAT.gpu(gpu), os_name, StackPins(**pins), nvswitch=nvswitch, want_torch=want_torch)


# --- defaults: the newest stack that works for each GPU (§2c, §4a, §4c) ------------------------

@pytest.mark.parametrize(
    ("gpu", "branch", "module", "variant"),
    [
        ("T4", 595, "open", "cu130"),
        ("V100", 580, "proprietary", "cu126"),  # §2c: R580 last for Volta; §4b: no cu13x for sm_70
        ("A10G", 595, "open", "cu130"),
        ("L4", 595, "open", "cu130"),  # sm_89 runs sm_86 SASS (§2b)
        ("L40S", 595, "open", "cu130"),
        ("A100-40GB", 595, "open", "cu130"),
        ("A100-80GB", 595, "open", "cu130"),
        ("H100", 595, "open", "cu130"),
        ("H200", 595, "open", "cu130"),
        ("B200", 595, "open", "cu130"),  # §2c: open only
    ],
)
def test_default_stack_per_gpu(gpu, branch, module, variant):
    stack = resolve(gpu)
    assert stack.driver_branch == branch
    assert stack.kernel_module == module
    assert stack.torch is not None
    assert stack.torch.version == "2.13"
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
    assert "sm_70" in text
    assert "--torch-cuda cu126" in text
    assert "driver R580, proprietary kernel module" in text


def test_v100_with_torch_2_11_cu128_is_refused():
    with pytest.raises(StackConflict) as exc:
        resolve("V100", torch="2.11", torch_cuda="cu128")
    assert "sm_70" in str(exc.value)
    assert "cu126" in exc.value.hint


def test_v100_with_torch_2_7_cu128_is_refused_but_2_10_cu128_works():
    with pytest.raises(StackConflict):
        resolve("V100", torch="2.7", torch_cuda="cu128")  # §4b: 2.7 cu128 has no sm_70
    stack = resolve("V100", torch="2.10", torch_cuda="cu128")  # §4b: sm_70 back in 2.8–2.10 cu128
    assert (stack.driver_branch, stack.kernel_module) == (580, "proprietary")


def test_v100_driver_above_r580_is_refused():
    with pytest.raises(StackConflict) as exc:
        resolve("V100", driver="590")
    assert "R580" in str(exc.value) and exc.value.field == "--driver"


def test_v100_cuda_13_toolkit_is_refused():
    with pytest.raises(StackConflict) as exc:
        resolve("V100", cuda="13.0")
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


@pytest.mark.parametrize(("pins", "needle"), [
    ({"torch": "2.6"}, "torch ≥ 2.7"),
    ({"torch_cuda": "cu126"}, "sm_100"),
    ({"driver": "550"}, "R570"),
])
def test_b200_refuses_old_torch_wrong_variant_and_old_driver(pins, needle):
    with pytest.raises(StackConflict) as exc:
        resolve("B200", **pins)
    assert needle in str(exc.value)


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
    assert stack.fabric_manager_package == "nvidia-fabricmanager-580"


@pytest.mark.parametrize("instance", ["g4dn.xlarge", "g5.48xlarge", "g6e.48xlarge", "p3.16xlarge", "p5.4xlarge"])
def test_other_instances_do_not(instance):
    it = CAT.instance_type(instance)
    assert not it.nvswitch
    assert resolve(it.gpu, nvswitch=False).fabric_manager == "no"


def test_unknown_host_installs_fm_only_if_nvswitch_is_found():
    assert resolve("H100").fabric_manager == "auto"


# --- driver vs wheel CUDA minimum (§2a) ---------------------------------------------------------

@pytest.mark.parametrize(("driver", "variant", "minimum"), [
    ("535", "cu128", "570.26"),
    ("550", "cu126", "560.28.03"),
    ("570", "cu130", "580.65.06"),
    ("560.28.02", "cu126", "560.28.03"),
])
def test_driver_older_than_wheel_minimum_is_refused_with_the_minimum(driver, variant, minimum):
    torch = "2.9" if variant in ("cu128", "cu130") else "2.7"
    with pytest.raises(StackConflict) as exc:
        resolve("A100-80GB", driver=driver, torch=torch, torch_cuda=variant)
    assert minimum in str(exc.value)


@pytest.mark.parametrize(("driver", "variant"), [("570", "cu128"), ("580", "cu130"), ("560.28.03", "cu126"),
                                                 ("535", "cu121"), ("535", "cu118")])
def test_driver_at_or_above_minimum_is_accepted(driver, variant):
    torch = {"cu128": "2.9", "cu130": "2.9", "cu126": "2.7", "cu121": "2.4", "cu118": "2.4"}[variant]
    stack = resolve("A100-80GB", driver=driver, torch=torch, torch_cuda=variant)
    assert stack.driver_branch == int(driver.split(".")[0])
    assert stack.driver_version == (driver if "." in driver else None)


def test_driver_pin_alone_picks_the_newest_wheel_it_can_run():
    stack = resolve("H100", driver="550")
    # cu126+ need ≥ 560.28.03 (§2a); the newest release with a wheel R550 runs is 2.7+cu118 (§4a)
    assert stack.torch and (stack.torch.version, stack.torch.variant) == ("2.7", "cu118")


def test_cuda_toolkit_raises_the_default_driver_when_needed():
    stack = resolve("H100", cuda="13.3")
    assert stack.driver_branch == 610  # 13.3 needs 610.43.02 (§2a, secondary)
    assert any("13.3" in note for note in stack.unverified)
    assert stack.cuda_toolkit_package == "cuda-toolkit-13-3"


def test_cuda_toolkit_older_than_the_architecture_is_refused():
    with pytest.raises(StackConflict) as exc:
        resolve("B200", cuda="12.6")  # Blackwell first appears in CUDA 12.8 (§1a note)
    assert "12.8" in str(exc.value)
    # 11.8 is the first CUDA with sm_89 (§1a note), so it is accepted for Ada:
    assert resolve("L4", cuda="11.8", torch="2.4", torch_cuda="cu118").cuda_toolkit == "11.8"


# --- torch / python / variant ranges (§4a) ------------------------------------------------------

@pytest.mark.parametrize(("torch", "variant"), [("2.8", "cu130"), ("2.12", "cu128"), ("2.1", "cu124")])
def test_variant_not_built_for_that_release_is_refused(torch, variant):
    with pytest.raises(StackConflict) as exc:
        resolve("A10G", torch=torch, torch_cuda=variant)
    assert "has no" in str(exc.value)


def test_pypi_default_variant_is_preferred_per_release():
    assert resolve("A10G", torch="2.9").torch.variant == "cu128"
    assert resolve("A10G", torch="2.11").torch.variant == "cu130"
    assert resolve("A10G", torch="2.9.1").torch.requirement == "torch==2.9.1"
    assert resolve("A10G", torch="2.9").torch.requirement == "torch==2.9.*"


def test_python_outside_release_range_is_refused():
    with pytest.raises(StackConflict) as exc:
        resolve("T4", torch="2.1", python="3.12")
    assert "3.8–3.11" in str(exc.value)
    assert resolve("T4", torch="2.1").python == "3.11"


def test_minimal_stack_has_no_torch_and_rejects_torch_pins():
    stack = resolve("T4", want_torch=False)
    assert stack.torch is None
    with pytest.raises(UserInputError):
        resolve("T4", want_torch=False, torch="2.9")


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
    assert any("2.12/2.13" in note for note in resolve("H100").unverified)
    assert any("A10G" in note for note in resolve("A10G").unverified)
    assert not any("2.12/2.13" in note for note in resolve("H100", torch="2.9").unverified)
