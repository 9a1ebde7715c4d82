"""plan.py's decisions in-process, asserted as `gpuprov plan` shows them: the instance chosen and the candidates,
refusals (field and alternative), the step list in order with its summaries, the guard settings and what a
guard's shutdown does, the budget's deadline and the cost estimate. Fast (no shellcheck, no SSH), so mutmut
can run them for every plan.py mutant; test_templates.py and test_guardrails.py render and lint whole plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.errors import UserInputError
from gpuprov.plan import catalog, compat
from gpuprov.plan import plan as P
from gpuprov.plan.spec import load_playbook
from gpuprov.plan.stack import StackPins

CAT = catalog.load()
STACK_STEPS = ["kernel-headers", "nouveau-off", "nvidia-driver"]
PYTORCH_TAIL = ["persistence", "python-env", "pytorch", "verify"]


def names(plan_or_steps) -> list[str]:
    steps = plan_or_steps.steps if isinstance(plan_or_steps, P.Plan) else plan_or_steps
    return [s.name for s in steps]


def summary_of(plan: P.Plan, name: str) -> str:
    return next(s.summary for s in plan.steps if s.name == name)


def refusal(fn, *args, **kw) -> UserInputError:
    with pytest.raises(UserInputError) as exc:
        fn(*args, **kw)
    return exc.value


def autostop_conf(text: str) -> list[str]:
    """The /etc/gpuprov/autostop.conf a rendered autostop step writes (what the check reads every minute)."""
    body = text.split('/etc/gpuprov/autostop.conf" 644 <<\'GPUPROV_EOF\'\n', 1)[1].split("\nGPUPROV_EOF", 1)[0]
    return [line for line in body.splitlines() if not line.startswith("# written")]


def playbook_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "mine.yml"
    path.write_text(text)
    return str(path)


# --- defaults a user relies on -------------------------------------------------------------------------------

def test_a_bare_request_is_one_on_demand_gpu_in_us_east_1_with_the_pytorch_playbook_on_ubuntu_24_04():
    plan = P.make_plan(P.NodeRequest(gpu="T4"))
    out = plan.summary()
    assert (out["count"], out["market"], out["region"], out["playbook"], out["os"]) == (
        1, "on-demand", "us-east-1", "pytorch", "ubuntu-24.04")
    assert out["env_path"] == "/opt/gpuprov/env"
    assert out["guards"] == {"autostop_seconds": None, "idle_threshold_pct": 10, "ttl_seconds": None,
                             "interrupt_watch": False, "on_interrupt": None, "save_on_interrupt": False,
                             "metadata_url": "http://169.254.169.254",
                             "shutdown_action": "stop", "budget_usd": None, "budget_price": None,
                             "block_end": None}
    assert names(plan) == [*STACK_STEPS, *PYTORCH_TAIL]  # no guard asked for: no guard step
    assert plan.guards.any is False
    assert P.NodeRequest(gpu="T4").can_stop and P.NodeRequest(gpu="T4", spot=True, persistent=True).can_stop
    assert not P.NodeRequest(gpu="T4", spot=True).can_stop


# --- which instance --------------------------------------------------------------------------------------------

def test_the_cheapest_type_that_carries_the_gpus_is_chosen_and_every_fit_is_listed_cheapest_first():
    plan = P.make_plan(P.NodeRequest(gpu="T4"))
    t4 = sorted(CAT.instance_types_for(CAT.gpu("T4")), key=lambda it: it.price_usd_hour or 0)
    assert plan.instance == t4[0] and plan.instance.name == "g4dn.xlarge"
    assert [c["instance_type"] for c in plan.summary()["candidates"]] == [it.name for it in t4]
    assert plan.summary()["candidates"][0] == {"instance_type": "g4dn.xlarge", "gpus": 1, "price_usd_hour": 0.526}
    assert plan.price_usd_hour == 0.526 == plan.summary()["price_usd_hour_on_demand"]
    four = P.make_plan(P.NodeRequest(gpu="T4", count=4))  # only types with at least 4 GPUs
    assert [c.name for c in four.candidates] == ["g4dn.12xlarge", "g4dn.metal"]
    assert four.count == 4 and four.summary()["count"] == 4


def test_a_type_without_a_price_comes_last_and_the_priced_one_is_chosen():
    plan = P.make_plan(P.NodeRequest(gpu="H200:8"))
    assert [c.name for c in plan.candidates] == ["p5en.48xlarge", "p5e.48xlarge"]  # p5e: no on-demand price
    assert plan.instance.name == "p5en.48xlarge"


def test_types_at_one_price_put_fewer_gpus_first(monkeypatch):
    # no two catalog types of one GPU share a price today; the tie-break still decides what a user pays for
    gpu = CAT.gpu("T4")
    base = CAT.instance_types_for(gpu)[0]
    same = (base.model_copy(update={"name": "big", "gpus": 8}), base.model_copy(update={"name": "small", "gpus": 4}))
    monkeypatch.setattr(catalog, "load", lambda: CAT.model_copy(update={"instance_types": same}))
    assert [it.name for it in P.choose_instances(gpu, 2)] == ["small", "big"]
    monkeypatch.setattr(catalog, "load", lambda: CAT.model_copy(update={"instance_types": ()}))
    err = refusal(P.choose_instances, gpu, 1)  # a catalog GPU no type carries (yet)
    assert (err.problem, err.hint) == ("no instance type carries 1× T4", "the most on one instance is 0")


def test_a_count_no_type_carries_is_refused_with_the_most_there_is():
    err = refusal(P.make_plan, P.NodeRequest(gpu="B200:16"))
    assert (err.field, err.problem, err.hint) == ("--gpu", "no instance type carries 16× B200",
                                                  "the most on one instance is 8")
    assert P.make_plan(P.NodeRequest(gpu="B200:8")).instance.name == "p6-b200.48xlarge"  # the limit itself


@pytest.mark.parametrize(("instance_type", "count", "ok"), [
    ("g4dn.12xlarge", 4, True),  # exactly its GPUs
    ("g4dn.12xlarge", 5, False),
    ("g5.xlarge", 1, False),  # another GPU
])
def test_an_instance_type_asked_for_must_carry_the_gpus(instance_type, count, ok):
    request = P.NodeRequest(gpu="T4", count=count, instance_type=instance_type)
    if ok:
        plan = P.make_plan(request)
        assert plan.instance.name == instance_type and [c.name for c in plan.candidates] == [instance_type]
        return
    err = refusal(P.make_plan, request)
    it = CAT.instance_type(instance_type)
    assert (err.field, err.problem) == ("--instance-type", f"{instance_type} carries {it.gpus}× {it.gpu}, not {count}× T4")


def test_count_and_region_and_budget_refusals_name_their_flag():
    err = refusal(P.make_plan, P.NodeRequest(gpu="T4", count=0))
    assert (err.field, err.problem, err.hint) == ("--count", "0 GPUs", "at least 1, e.g. --count 8")
    err = refusal(P.make_plan, P.NodeRequest(gpu="A100:8", count=4))
    assert (err.field, err.problem) == ("--count", "--count 4 conflicts with --gpu A100:8")
    assert err.hint == "give the count once: --gpu A100:4, or --gpu A100 --count 4"
    assert P.make_plan(P.NodeRequest(gpu="A100:8", count=8)).count == 8  # the same count twice is fine
    assert P.make_plan(P.NodeRequest(gpu="T4", count=4)).count == 4  # a bare name takes --count
    assert refusal(P.make_plan, P.NodeRequest(gpu="T4", region="us-east-9")).field == "--region"
    for budget in (0, -5):
        err = refusal(P.make_plan, P.NodeRequest(gpu="T4", budget_usd=budget))
        assert (err.field, err.problem, err.hint) == ("--budget", f"{budget:g} is not a budget", "dollars above 0, e.g. 50")
    # refused before the price is looked at: a type without a list price turns no budget into a deadline
    err = refusal(P.make_plan, P.NodeRequest(gpu="H200:8", instance_type="p5e.48xlarge", budget_usd=0))
    assert err.field == "--budget"
    assert P.make_plan(P.NodeRequest(gpu="T4", budget_usd=0.5)).guards.ttl_seconds == int(0.5 / 0.526 * 3600)


# --- steps, in order --------------------------------------------------------------------------------------------

def test_fabric_manager_follows_the_instance_and_its_nvswitch_generation():
    h100 = P.make_plan(P.NodeRequest(gpu="H100:8"))
    assert names(h100) == [*STACK_STEPS, "fabric-manager", *PYTORCH_TAIL]
    assert summary_of(h100, "fabric-manager") == "nvidia-fabricmanager at the driver's exact version, held"
    b200 = P.make_plan(P.NodeRequest(gpu="B200:8"))
    assert summary_of(b200, "fabric-manager") == (
        "nvidia-fabricmanager at the driver's exact version, held (+ nvlsm, infiniband-diags; ib_umad, mlx5_ib "
        "loaded at every boot from linux-modules-extra-$(uname -r))")
    for dnf_os in ("amzn-2023", "rocky-9", "rocky-10"):  # the kernel's own modules-extra package, not Ubuntu's
        assert summary_of(P.make_plan(P.NodeRequest(gpu="B200:8", os=dnf_os)), "fabric-manager").endswith(
            "loaded at every boot from kernel-modules-extra-$(uname -r))")
    single = P.make_plan(P.NodeRequest(gpu="H100"))  # p5.4xlarge: no NVSwitch, no Fabric Manager step
    assert "fabric-manager" not in names(single)
    host = P.make_host_plan("H100", "pytorch", "ubuntu-24.04", StackPins())  # unknown: only if the host has it
    assert summary_of(host, "fabric-manager").endswith(", held if the host has NVSwitch")
    assert "fabric-manager" not in names(P.make_host_plan("H100", "pytorch", "ubuntu-24.04", StackPins(), False))


def test_every_step_says_what_it_does():
    plan = P.make_plan(P.NodeRequest(gpu="T4"))
    assert [(s.name, s.kind, s.summary) for s in plan.steps] == [
        ("kernel-headers", "stack", "headers for the running kernel (DKMS builds against them)"),
        ("nouveau-off", "stack", "blacklist nouveau so the NVIDIA module can load"),
        ("nvidia-driver", "stack", "NVIDIA R595 open driver from NVIDIA's CUDA repo, held; reboot if fresh"),
        ("persistence", "stack", "nvidia-persistenced with --persistence-mode (systemd drop-in), enabled and running"),
        ("python-env", "env", "Python 3.12 env at /opt/gpuprov/env (uv)"),
        ("pytorch", "env", "torch==2.15.* from https://download.pytorch.org/whl/cu132"),
        ("verify", "verify", "nvidia-smi + torch.cuda probe, a matmul on every GPU"),
    ]


def test_every_kind_of_step_renders_into_the_bundle_in_plan_order(tmp_path):
    path = playbook_file(tmp_path, """\
name: everything
cuda_toolkit: true
env:
  packages: [numpy]
jupyter: true
steps:
  - name: mine
    run: echo hi
""")
    plan = P.make_plan(P.NodeRequest(gpu="B200:8", playbook=path, spot=True, autostop_seconds=600, ttl_seconds=3600))
    assert names(plan) == ["autostop", "ttl", "spot-interrupt", *STACK_STEPS, "fabric-manager", "persistence",
                           "cuda-toolkit", "python-env", "pytorch", "packages", "mine", "jupyter", "verify"]
    assert [s.kind for s in plan.steps] == ["guard"] * 3 + ["stack"] * 6 + ["env"] * 3 + ["user", "env", "verify"]
    bundle = plan.bundle()
    assert [(s.name, s.kind) for s in bundle.scripts] == [(s.name, s.kind) for s in plan.steps]
    mine = next(s for s in bundle.scripts if s.name == "mine")
    assert "user_command='echo hi'\n" in mine.text  # the user's command, one quoted word


def test_the_driver_step_names_branch_and_kernel_module():
    v100 = P.make_plan(P.NodeRequest(gpu="V100"))
    assert summary_of(v100, "nvidia-driver") == (
        "NVIDIA R580 proprietary driver from NVIDIA's CUDA repo, held; reboot if fresh")
    assert summary_of(P.make_plan(P.NodeRequest(gpu="T4", pins=StackPins(driver="570"))), "nvidia-driver") == (
        "NVIDIA R570 open driver from NVIDIA's CUDA repo, held; reboot if fresh")


def test_the_cuda_dev_playbook_adds_the_toolkit_of_the_wheels_cuda_and_its_packages_and_files():
    plan = P.make_plan(P.NodeRequest(gpu="T4", playbook="cuda-dev"))
    assert names(plan) == [*STACK_STEPS, "persistence", "cuda-toolkit", "python-env", "pytorch", "packages",
                           "nvcc-on-path", "verify"]
    assert plan.stack.torch and plan.stack.cuda_toolkit == plan.stack.torch.cuda == "13.2"
    assert summary_of(plan, "cuda-toolkit") == "cuda-toolkit-13-2 (nvcc)"
    assert summary_of(plan, "packages") == "ninja, setuptools, wheel"
    assert summary_of(plan, "nvcc-on-path") == "write 1 file(s)"
    pinned = P.make_plan(P.NodeRequest(gpu="T4", playbook="cuda-dev", pins=StackPins(cuda="12.8")))
    assert pinned.stack.cuda_toolkit == "12.8" and pinned.stack.torch.cuda.startswith("12.")  # the pin is kept


def test_the_env_gets_the_python_the_torch_release_supports():
    plan = P.make_plan(P.NodeRequest(gpu="T4", pins=StackPins(torch="2.1")))  # torch 2.1 stops at Python 3.11
    assert plan.stack.python == "3.11"
    assert summary_of(plan, "python-env") == "Python 3.11 env at /opt/gpuprov/env (uv)"


def test_a_toolkit_without_torch_is_the_newest_cuda_the_branch_runs(tmp_path):
    path = playbook_file(tmp_path, "name: nvcc-only\nstack: gpu\ntorch: false\ncuda_toolkit: true\nenv: null\n")
    plan = P.make_plan(P.NodeRequest(gpu="V100", playbook=path))
    assert plan.stack.torch is None
    assert plan.stack.cuda_toolkit == compat.newest_cuda(CAT.gpu("V100"), 580) == "12.9"
    assert names(plan) == [*STACK_STEPS, "persistence", "cuda-toolkit", "verify"]


def test_minimal_has_no_env_and_a_driver_only_stack_still_verifies():
    plan = P.make_plan(P.NodeRequest(gpu="T4", playbook="minimal"))
    assert names(plan) == [*STACK_STEPS, "persistence", "verify"]
    assert plan.stack.torch is None and plan.summary()["env_path"] is None


def test_user_steps_say_what_they_do_and_come_after_the_env_and_before_jupyter_and_verify(tmp_path):
    path = playbook_file(tmp_path, """\
name: mine
env:
  packages: [numpy]
jupyter: true
steps:
  - name: cmd
    run: echo hi
  - name: two-files
    files:
      - {path: /etc/a, content: a}
      - {path: /etc/b, content: b}
  - name: both
    run: echo hi
    files:
      - {path: /etc/c, content: c}
""")
    plan = P.make_plan(P.NodeRequest(gpu="T4", playbook=path, pins=StackPins(python="3.11")))
    assert names(plan) == [*STACK_STEPS, "persistence", "python-env", "pytorch", "packages", "cmd", "two-files",
                           "both", "jupyter", "verify"]
    assert [s.summary for s in plan.steps if s.kind == "user"] == [
        "run a command", "write 2 file(s)", "run a command and write 1 file(s)"]
    assert summary_of(plan, "packages") == "numpy"
    assert summary_of(plan, "python-env") == "Python 3.11 env at /opt/gpuprov/env (uv)"  # the pin, via the stack
    assert summary_of(plan, "pytorch") == f"{plan.stack.torch.requirement} from {plan.stack.torch.index_url}"
    assert summary_of(plan, "jupyter") == (
        "JupyterLab from /opt/gpuprov/env on 127.0.0.1:8888 with a token (gpuprov-jupyter.service)")
    assert [s.kind for s in plan.steps] == ["stack"] * 4 + ["env"] * 3 + ["user"] * 3 + ["env", "verify"]


def test_a_cpu_host_gets_no_stack_steps_and_its_python_from_the_pin(tmp_path):
    path = playbook_file(tmp_path, "name: cpu\nstack: none\nenv:\n  manager: conda\n  path: /opt/x\n")
    plan = P.make_host_plan(None, path, "ubuntu-24.04", StackPins(python="3.11"))
    assert plan.gpu is None and plan.stack is None and plan.count == 0 and plan.instance is None
    assert names(plan) == ["python-env"]
    assert summary_of(plan, "python-env") == "Python 3.11 env at /opt/x (conda)"
    assert names(P.make_host_plan(None, path, "ubuntu-24.04", StackPins())) == ["python-env"]
    assert summary_of(P.make_host_plan(None, path, "ubuntu-24.04", StackPins()), "python-env").startswith("Python 3.12 ")
    assert plan.summary()["gpu"] is None and plan.summary()["stack"] is None and plan.summary()["instance_type"] is None
    assert plan.request.gpu == "none" and plan.request.count == 1
    assert plan.unverified == ()


def test_gpu_pins_on_a_stack_less_playbook_or_host_are_refused(tmp_path):
    path = playbook_file(tmp_path, "name: cpu\nstack: none\n")
    err = refusal(P.make_plan, P.NodeRequest(gpu="T4", playbook=path, pins=StackPins(driver="580")))
    assert (err.field, err.hint) == ("--playbook", "drop them, or use a playbook with `stack: gpu`")
    assert "installs no GPU stack" in err.problem and "'cpu'" in err.problem
    cpu = P.make_plan(P.NodeRequest(gpu="T4", playbook=path, pins=StackPins(python="3.11")))
    assert cpu.stack is None and names(cpu) == ["python-env"]
    assert summary_of(cpu, "python-env") == "Python 3.11 env at /opt/gpuprov/env (uv)"
    assert summary_of(P.make_plan(P.NodeRequest(gpu="T4", playbook=path)), "python-env").startswith("Python 3.12 env")
    err = refusal(P.make_host_plan, None, path, "ubuntu-24.04", StackPins(torch="2.9"))
    assert (err.field, err.problem) == ("--playbook", "driver, CUDA and torch pins need a GPU host")
    err = refusal(P.make_host_plan, None, "pytorch", "ubuntu-24.04", StackPins())
    assert (err.field, err.problem, err.hint) == ("--gpu", "no NVIDIA GPU found on the host, and none given",
                                                  "pass --gpu, or use a `stack: none` playbook for CPU hosts")


def test_flags_win_over_the_playbooks_pins_field_by_field(tmp_path):
    path = playbook_file(tmp_path, "name: pinned\npins:\n  driver: '570'\n  torch: '2.9'\n")
    plan = P.make_plan(P.NodeRequest(gpu="T4", playbook=path, pins=StackPins(torch="2.10")))
    assert plan.stack.driver_branch == 570 and plan.stack.torch.version == "2.10"
    merged = P._merge_pins(StackPins(driver="570", torch="2.9"), StackPins(torch="2.10", python="3.11"))
    assert merged == StackPins(driver="570", torch="2.10", python="3.11")


def test_jupyter_flag_adds_the_service_to_a_playbook_with_an_env_and_is_refused_without_one():
    plan = P.make_plan(P.NodeRequest(gpu="T4", jupyter=True))
    assert names(plan)[-2:] == ["jupyter", "verify"]
    assert P.with_jupyter(load_playbook("jupyter"), True) == load_playbook("jupyter")  # already on: unchanged
    assert P.with_jupyter(load_playbook("pytorch"), False).jupyter is False
    err = refusal(P.make_plan, P.NodeRequest(gpu="T4", playbook="minimal", jupyter=True))
    assert err.field == "--jupyter" and err.hint == "use a playbook with an env, e.g. -p pytorch or -p jupyter"
    assert err.problem.startswith("playbook 'minimal': `jupyter: true` needs an `env`")
    host = P.make_host_plan("T4", "pytorch", "ubuntu-24.04", StackPins(), jupyter=True)
    assert "jupyter" in names(host) and host.request.jupyter is True


# --- guards ---------------------------------------------------------------------------------------------------

def test_guard_steps_come_first_in_a_fixed_order_and_say_what_a_shutdown_does():
    plan = P.make_plan(P.NodeRequest(gpu="T4", spot=True, persistent=True, autostop_seconds=1800, ttl_seconds=5400,
                                     on_interrupt="echo bye"))
    assert names(plan)[:3] == ["autostop", "ttl", "spot-interrupt"] and names(plan)[3:] == [*STACK_STEPS, *PYTORCH_TAIL]
    assert summary_of(plan, "autostop") == (
        "shut down after 30m idle: every GPU under 10% and no SSH session (gpuprov-autostop.timer, every minute); "
        "then the instance stops (its disk is kept)")
    assert summary_of(plan, "ttl") == (
        "hard deadline: shut down 1h30m after this step first runs (gpuprov-ttl.timer, survives reboots); "
        "then the instance stops (its disk is kept)")
    assert summary_of(plan, "spot-interrupt") == (
        "watch IMDSv2 spot/instance-action every 5s; on a notice runs the on-interrupt hook once "
        "(gpuprov-interrupt.service)")
    assert plan.guards.on_interrupt == "echo bye" and plan.guards.interrupt_watch and plan.guards.any
    assert {s.kind for s in plan.steps[:3]} == {"guard"}


def test_any_guard_counts():
    assert P.Guards(autostop_seconds=60).any and P.Guards(ttl_seconds=60).any and P.Guards(interrupt_watch=True).any
    assert not P.Guards().any


@pytest.mark.parametrize(("request_kw", "action", "then"), [
    ({}, "stop", "the instance stops (its disk is kept)"),
    ({"spot": True}, "terminate", "the instance terminates (its disk goes with it)"),  # one-time spot cannot stop
    ({"spot": True, "persistent": True}, "stop", "the instance stops (its disk is kept)"),
    ({"autostop_action": "terminate"}, "terminate", "the instance terminates (its disk goes with it)"),
    ({"spot": True, "autostop_action": "terminate"}, "terminate", "the instance terminates (its disk goes with it)"),
])
def test_a_guards_shutdown_stops_a_node_that_can_stop_and_terminates_one_that_cannot(request_kw, action, then):
    plan = P.make_plan(P.NodeRequest(gpu="T4", ttl_seconds=3600, **request_kw))
    assert plan.guards.shutdown_action == action
    assert plan.guards.then == then and summary_of(plan, "ttl").endswith(f"; then {then}")


def test_a_host_gpuprov_did_not_launch_powers_off_and_watches_for_interruptions_only_with_a_hook():
    host = P.make_host_plan("T4", "pytorch", "ubuntu-24.04", StackPins(), guard=P.GuardRequest(autostop_seconds=600))
    assert host.guards.shutdown_action is None and host.guards.then == "the machine powers off"
    assert names(host)[:1] == ["autostop"] and "spot-interrupt" not in names(host)
    assert host.request.autostop_seconds == 600
    hooked = P.make_host_plan("T4", "pytorch", "ubuntu-24.04", StackPins(), guard=P.GuardRequest(on_interrupt="x"))
    assert names(hooked)[:1] == ["spot-interrupt"] and hooked.guards.on_interrupt == "x"
    assert P.make_host_plan("T4:4", "pytorch", "ubuntu-24.04", StackPins()).count == 4
    ttl = P.make_host_plan("T4", "pytorch", "ubuntu-22.04", StackPins(), guard=P.GuardRequest(ttl_seconds=7200))
    assert names(ttl)[:1] == ["ttl"] and ttl.guards.ttl_seconds == 7200
    out = ttl.summary()
    assert (out["gpu"], out["os"], out["stack"]["gpu"], out["stack"]["os"]) == ("T4", "ubuntu-22.04", "T4", "ubuntu-22.04")
    assert (out["instance_type"], out["candidates"], out["price_usd_hour_on_demand"]) == (None, [], None)


def test_a_spot_node_watches_for_interruptions_and_logs_them_without_a_hook(tmp_path):
    plan = P.make_plan(P.NodeRequest(gpu="T4", spot=True))
    assert names(plan)[:1] == ["spot-interrupt"] and plan.summary()["market"] == "spot"
    assert summary_of(plan, "spot-interrupt") == (
        "watch IMDSv2 spot/instance-action every 5s; on a notice logs it (no on-interrupt hook) "
        "(gpuprov-interrupt.service)")
    path = playbook_file(tmp_path, "name: hooked\non_interrupt: echo playbook\n")
    assert P.make_plan(P.NodeRequest(gpu="T4", playbook=path)).guards.on_interrupt == "echo playbook"
    flag = P.make_plan(P.NodeRequest(gpu="T4", playbook=path, on_interrupt="echo flag"))
    assert flag.guards.on_interrupt == "echo flag"  # the flag wins


def test_persistent_and_stop_are_refused_where_ec2_would_refuse_them():
    err = refusal(P.make_plan, P.NodeRequest(gpu="T4", persistent=True))
    assert (err.field, err.problem, err.hint) == ("--persistent", "applies to spot requests only",
                                                  "add --spot, or drop --persistent")
    err = refusal(P.make_plan, P.NodeRequest(gpu="T4", spot=True, autostop_action="stop"))
    assert err.field == "--autostop-action" and "cannot stop" in err.problem
    assert err.hint.startswith("add --persistent") and err.hint.endswith("or --autostop-action terminate")
    assert P.shutdown_action(P.NodeRequest(gpu="T4", spot=True, persistent=True, autostop_action="stop")) == "stop"
    assert P.shutdown_action(P.NodeRequest(gpu="T4", autostop_action="stop")) == "stop"


def test_a_budget_becomes_the_deadline_when_it_runs_out_before_the_ttl():
    guards = P.Guards(ttl_seconds=7200, shutdown_action="stop")
    assert P.with_budget(guards, None, 2.0) is guards
    assert P.with_budget(guards, 10.0, None) is guards and P.with_budget(guards, 10.0, 0.0) is guards
    short = P.with_budget(guards, 1.0, 2.0)  # $1 at $2/h: 30 minutes, sooner than 2h
    assert (short.ttl_seconds, short.budget_usd, short.budget_price) == (1800, 1.0, 2.0)
    long = P.with_budget(guards, 100.0, 2.0)  # 50h: the TTL comes first and stays
    assert (long.ttl_seconds, long.budget_usd) == (7200, 100.0)
    alone = P.with_budget(P.Guards(), 3.0, 2.0)
    assert alone.ttl_seconds == 5400
    assert P.budget_seconds(1.0, 3.0) == 1200 and P.budget_seconds(0.5, 7.0) == 257  # whole seconds, rounded down
    # at launch the price obtained may differ from the list price `plan` checked: the deadline stays where a guard
    # can enforce it, 1m to 90d (as --ttl)
    assert P.budget_seconds(0.01, 7.0) == 60 and P.budget_seconds(1e6, 0.5) == 90 * 86400
    err = refusal(P.budget_seconds, 0.0, 2.0)
    assert (err.field, err.problem, err.hint) == ("--budget", "0 is not a budget", "dollars above 0, e.g. 50")
    for free in (0.0, -1.0, float("nan")):  # no price known: never a budget that lasts for ever
        err = refusal(P.budget_seconds, 50.0, free)
        assert err.field == "--budget" and "no price" in err.problem


def test_a_budget_on_a_launched_node_uses_the_chosen_types_price_and_the_ttl_step_says_so():
    plan = P.make_plan(P.NodeRequest(gpu="H100:8", budget_usd=100))
    assert plan.guards.ttl_seconds == int(100 / 55.04 * 3600) == 6540
    assert (plan.guards.budget_usd, plan.guards.budget_price) == (100, 55.04)
    assert summary_of(plan, "ttl").startswith(
        "hard deadline: shut down 1h49m (when the $100 budget at $55.04/h runs out) after this step first runs")
    assert P.ttl_step(P.Guards(ttl_seconds=60, budget_usd=5)).summary.startswith("hard deadline: shut down 1m after")


def test_replace_guards_puts_the_new_guard_steps_first_and_keeps_the_rest():
    plan = P.make_plan(P.NodeRequest(gpu="T4", ttl_seconds=3600, spot=True))
    assert names(plan)[:2] == ["ttl", "spot-interrupt"]
    guards = P.Guards(autostop_seconds=900, shutdown_action="terminate")
    again = P.replace_guards(plan, guards)
    assert again.guards == guards
    assert names(again) == ["autostop", *STACK_STEPS, *PYTORCH_TAIL]
    assert again.steps[1:] == plan.steps[2:]
    assert names(P.replace_guards(plan, P.NO_GUARDS)) == [*STACK_STEPS, *PYTORCH_TAIL]


def test_autostop_and_ttl_scripts_carry_the_values_asked_for():
    script = P.autostop_script(1800, 25, "terminate")
    assert script.name == "autostop" and script.kind == "guard"
    assert autostop_conf(script.text) == ["IDLE_SECONDS=1800", "UTIL_THRESHOLD=25", "SSH_PORT=22",
                                          "# a shutdown here: the instance terminates (its disk goes with it)"]
    assert autostop_conf(P.autostop_script(600).text) == ["IDLE_SECONDS=600", "UTIL_THRESHOLD=10", "SSH_PORT=22",
                                                          "# a shutdown here: the machine powers off"]
    off = P.autostop_script(None)
    assert off.summary == "autostop off (gpuprov-autostop.timer disabled)"
    assert autostop_conf(off.text)[0] == "IDLE_SECONDS=0"
    ttl = P.ttl_script(7200, "stop")
    assert ttl.name == "ttl" and "\nttl=7200\n" in ttl.text
    assert "# At the deadline: the instance stops (its disk is kept)." in ttl.text
    assert "if false && " in ttl.text  # `gpuprov ttl` starts a new deadline from now, even for the same TTL
    assert "if true && " in P.make_plan(P.NodeRequest(gpu="T4", ttl_seconds=7200)).bundle().scripts[0].text
    assert P.ttl_script(None).summary == "TTL off (gpuprov-ttl.timer disabled, deadline removed)"
    assert 'gp_done "TTL off"' in P.ttl_script(None).text and 'gp_done "TTL off"' not in ttl.text


# --- what it costs, what is unverified, what is recorded -------------------------------------------------------

def test_the_estimate_is_hours_at_the_list_price_and_the_budgets_hours():
    plan = P.make_plan(P.NodeRequest(gpu="H100:8", budget_usd=100))
    assert plan.estimate(3) == {"instance_type": "p5.48xlarge", "usd_hour_on_demand": 55.04, "hours": 3,
                                "usd_on_demand": 165.12, "budget_usd": 100, "budget_hours": 1.82}
    assert plan.estimate(None) == {"instance_type": "p5.48xlarge", "usd_hour_on_demand": 55.04,
                                   "budget_usd": 100, "budget_hours": 1.82}
    assert plan.estimate(2, ("us-east-1a", 20.0)) == {
        "instance_type": "p5.48xlarge", "usd_hour_on_demand": 55.04, "hours": 2, "usd_on_demand": 110.08,
        "budget_usd": 100, "budget_hours": 1.82, "spot_zone": "us-east-1a", "usd_hour_spot": 20.0, "usd_spot": 40.0}
    bare = P.make_plan(P.NodeRequest(gpu="T4"))
    assert bare.estimate(None) is None  # nothing asked
    assert bare.estimate(None, ("us-east-1b", 0.2)) is None
    assert bare.estimate(10, ("us-east-1b", 0.2)) == {"instance_type": "g4dn.xlarge", "usd_hour_on_demand": 0.526,
                                                       "hours": 10, "usd_on_demand": 5.26, "spot_zone": "us-east-1b",
                                                       "usd_hour_spot": 0.2, "usd_spot": 2.0}
    cents = bare.estimate(1.5, ("us-east-1a", 0.1234))  # to the cent
    assert (cents["usd_on_demand"], cents["usd_spot"]) == (0.79, 0.19)
    host = P.make_host_plan("T4", "pytorch", "ubuntu-24.04", StackPins())
    assert host.price_usd_hour is None and host.estimate(5) is None  # no price known


def test_a_budget_with_spot_and_no_hours_gives_no_spot_cost():
    plan = P.make_plan(P.NodeRequest(gpu="T4", budget_usd=5))
    out = plan.estimate(None, ("us-east-1a", 0.25))
    assert out == {"instance_type": "g4dn.xlarge", "usd_hour_on_demand": 0.526, "budget_usd": 5, "budget_hours": 9.51,
                   "spot_zone": "us-east-1a", "usd_hour_spot": 0.25}


def test_unverified_facts_of_the_stack_and_the_instance_are_listed():
    plan = P.make_plan(P.NodeRequest(gpu="H100"))  # p5.4xlarge's NVSwitch-less size is assumed
    it = CAT.instance_type("p5.4xlarge")
    assert plan.unverified == (*plan.stack.unverified, f"p5.4xlarge: {it.unverified}")
    assert plan.summary()["unverified"] == list(plan.unverified)
    assert P.make_plan(P.NodeRequest(gpu="H100:8")).unverified == P.make_plan(P.NodeRequest(gpu="H100:8")).stack.unverified


def test_the_summary_records_what_plan_json_prints():
    plan = P.make_plan(P.NodeRequest(gpu="L4", region="eu-west-1", os="ubuntu-22.04", spot=True))
    out = plan.summary()
    assert (out["gpu"], out["instance_type"], out["region"], out["os"], out["market"]) == (
        "L4", "g6.xlarge", "eu-west-1", "ubuntu-22.04", "spot")
    assert out["stack"] == plan.stack.model_dump(mode="json") and out["stack"]["os"] == "ubuntu-22.04"
    assert out["steps"] == [{"name": s.name, "kind": s.kind, "summary": s.summary} for s in plan.steps]
    assert out["guards"]["interrupt_watch"] is True and out["guards"]["shutdown_action"] == "terminate"
    bundle = plan.bundle()
    assert [s.name for s in bundle.scripts] == names(plan)
    assert bundle.manifest["gpuprov_plan"] == out


def test_a_budget_a_guard_cannot_enforce_is_refused_with_the_budgets_that_would_do():
    short = refusal(P.make_plan, P.NodeRequest(gpu="T4", budget_usd=0.001))  # 6 s at g4dn.xlarge's $0.526/h
    assert short.field == "--budget" and "under the 1m a guard can enforce" in short.problem
    assert short.hint.startswith("at least $0.01 at this price")
    long = refusal(P.make_plan, P.NodeRequest(gpu="T4", budget_usd=1e6))
    assert long.field == "--budget" and "past the 90-day cap" in long.problem and "at most $1,136" in long.hint
    assert P.make_plan(P.NodeRequest(gpu="T4", budget_usd=1136)).guards.ttl_seconds <= 90 * 86400


def test_the_plan_says_whether_the_budget_or_the_ttl_decides():
    by_ttl = P.make_plan(P.NodeRequest(gpu="T4", budget_usd=50, ttl_seconds=3600))  # $50 lasts 95 h
    assert by_ttl.guards.ttl_seconds == 3600 and not P.budget_decides(by_ttl.guards)
    assert summary_of(by_ttl, "ttl").startswith("hard deadline: shut down 1h (--ttl: sooner than the $50 budget, "
                                                "3d23h")
    by_budget = P.make_plan(P.NodeRequest(gpu="T4", budget_usd=1, ttl_seconds=8 * 3600))  # $1 lasts 1h54m
    assert P.budget_decides(by_budget.guards)
    assert "(when the $1 budget at $0.526/h runs out)" in summary_of(by_budget, "ttl")


def test_a_playbook_without_torch_promises_no_matmul_and_r580_is_the_branch_580():
    assert "a matmul on every GPU" not in summary_of(P.make_plan(P.NodeRequest(gpu="T4", playbook="minimal")), "verify")
    assert "a matmul on every GPU" in summary_of(P.make_plan(P.NodeRequest(gpu="T4")), "verify")
    assert P.make_plan(P.NodeRequest(gpu="H100", pins=StackPins(driver="R580"))).stack.driver_branch == 580


def test_a_pin_the_playbook_set_is_blamed_on_the_playbooks_line(tmp_path):
    playbook = tmp_path / "pb.yml"
    playbook.write_text("name: pb\npins:\n  driver: '550'\n")
    err = refusal(P.make_plan, P.NodeRequest(gpu="H100", playbook=str(playbook)))
    assert err.field == f"{playbook}:3: pins.driver"
    overridden = refusal(P.make_plan, P.NodeRequest(gpu="H100", playbook=str(playbook), pins=StackPins(driver="560")))
    assert overridden.field == "--driver"  # the flag overrode the playbook: the flag is what to fix
