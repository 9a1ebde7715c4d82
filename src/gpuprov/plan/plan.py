"""Build the Plan: which instance, which stack, which steps. Pure: no network, no credentials.

The Plan is what `gpuprov plan` prints and what `up` and `bootstrap` execute, so a dry run
cannot say one thing and do another.

A `NodeRequest` becomes the instance choice (cheapest first), the stack, `Guards` and the ordered `StepPlan`s:
guards first, then the driver stack, the env, the playbook's steps, jupyter, verify. `Guards.shutdown_action` is
what the guards' `shutdown` does to a launched node (stop, unless it is a one-time spot node or `--autostop-action
terminate`; `--autostop-action stop` on one-time spot is refused; on Alibaba Cloud always stop, as ECS does).
`with_budget` turns `--budget` into the TTL at a price (the plan's list price, or in `up` the price obtained at
launch); `replace_guards` swaps the guard steps; `autostop_script` / `ttl_script` render one guard step alone for
`gpuprov autostop` / `gpuprov ttl`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuprov.errors import UserInputError
from gpuprov.plan import cpu, facts, noroot, oses, sources, wheel_lock
from gpuprov.plan.budget import budget_seconds, check_budget
from gpuprov.plan.data import data_steps, saves_on

# the guards' model and the block-end warning live in plan/guards.py (this module passed 500 lines); named here too
from gpuprov.plan.guards import BLOCK_WARN_SECONDS, DEFAULT_METADATA_URL, NOTICES, Guards  # noqa: F401
from gpuprov.plan.monitoring import Monitoring, monitoring_steps
from gpuprov.plan.monitoring import summary as monitoring_summary
from gpuprov.plan.render import STATE_DIR, Bundle, Script, StepPlan, render_steps
from gpuprov.plan.sources import ORIGIN, Effective, Sources
from gpuprov.plan.spec import Playbook, format_duration, load_playbook
from gpuprov.plan.stack import CpuArch, Stack, StackPins, TorchWheel
from gpuprov.plan.stack_steps import check_monitoring_os, driver_stack_steps

# The catalog, the stack solver (compat, kept) and Docker's facts are imported where a plan needs them: a host's
# plan with no GPU named and no Docker (bootstrap of a `stack: none` playbook) uses none of them, and importing
# them was a measurable share of its start-up.
if TYPE_CHECKING:
    from gpuprov.plan import catalog
    from gpuprov.plan.catalog import Gpu, InstanceType

NO_GUARDS = Guards()


class NodeRequest(BaseModel):
    """What the user asked for, from flags and the playbook, before any decision."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: str | None = None  # None: a CPU-only node (`cpu`/`memory_gib`, or a CPU-only `instance_type`)
    count: int | None = None  # --count; None: the count in `gpu` (A100:8), else 1
    cpu: int | None = None  # --cpu: at least this many vCPUs on a CPU-only type
    memory_gib: float | None = None  # --memory: at least this much memory (GiB) on a CPU-only type
    spot: bool = False
    region: str = "us-east-1"
    playbook: str = "pytorch"
    os: str = "ubuntu-24.04"
    pins: StackPins = StackPins()
    instance_type: str | None = None
    autostop_seconds: int | None = None  # --autostop (seconds idle), None: off
    ttl_seconds: int | None = None  # --ttl, None: no deadline
    on_interrupt: str | None = None  # --on-interrupt (wins over the playbook's on_interrupt)
    persistent: bool = False  # --persistent: a persistent spot request (interruption behaviour stop), so it can stop
    spot_duration: Literal[0, 1] | None = None  # --spot-duration: Alibaba Cloud's spot protection period, hours
    autostop_action: Literal["stop", "terminate"] | None = None  # --autostop-action; None: stop when it can
    budget_usd: float | None = None  # --budget: a dollar cap, enforced on the node as a deadline
    arch: CpuArch | None = None  # --arch: the hosts' CPU; None: the instance type's
    cloud: str = "aws"  # --cloud: whose catalog the node is planned on (catalog_for)

    @property
    def can_stop(self) -> bool:
        return not self.spot or self.persistent
    jupyter: bool = False  # --jupyter: JupyterLab too, whatever the playbook says
    docker: bool = False  # --docker: Docker + NVIDIA's container toolkit too (plan/docker.py)
    monitoring: Monitoring = Monitoring()  # --metrics, --health and the alerts (the playbook's `metrics:` merged in)
    sources: Sources | None = None  # --sources: over the playbook's and the config's (plan/sources.py)
    sources_from: str = "--sources"  # how --sources named it: `--sources cn-tuna`, `--sources FILE`


@dataclass(frozen=True)
class Plan:
    request: NodeRequest
    gpu: Gpu | None  # None: a host without a GPU stack (a `stack: none` playbook on a CPU host)
    count: int
    instance: InstanceType | None  # None for hosts gpuprov did not launch
    candidates: tuple[InstanceType, ...]  # every instance type that fits, cheapest first
    playbook: Playbook
    stack: Stack | None
    steps: tuple[StepPlan, ...]
    guards: Guards = NO_GUARDS
    home: str | None = None  # the login's home on a host where it has no root (plan/noroot.py); None: root
    skipped: tuple[tuple[str, str], ...] = ()  # (step, why) of the steps left out for want of root
    sources: Effective = ORIGIN  # where every step downloads from
    cpu_torch: TorchWheel | None = None  # a CPU-only node's torch: the CPU wheel (plan/cpu.py); no GPU stack

    @property
    def cpu_only(self) -> bool:
        """A node launched on a CPU-only type: no driver, toolkit or Fabric Manager; torch's CPU wheel."""
        return self.instance is not None and self.instance.cpu_only

    @property
    def wheels(self) -> str | None:
        """How torch's wheels are pinned: the lock they are checked against, or that none fits (no torch: None)."""
        if self.stack is None or self.stack.torch is None:
            return None
        lock = self.stack.torch.lock
        return f"hash-pinned by {lock.label}" if lock else wheel_lock.NOT_PINNED

    @property
    def price_usd_hour(self) -> float | None:
        return self.instance.price_usd_hour if self.instance else None

    @property
    def arch(self) -> CpuArch:
        """The hosts' CPU (`uname -m`): --arch, else the instance type's, else x86_64."""
        if self.stack is not None:
            return self.stack.cpu_arch
        return self.request.arch or (self.instance.host_arch if self.instance else "x86_64")

    def estimate(self, hours: float | None, spot: tuple[str, float] | None = None) -> dict[str, Any] | None:
        """What `hours` of this plan's instance cost, and how long its --budget lasts, at the on-demand list
        price (spot bills less; on spot the budget's deadline comes from the price obtained at launch).
        `spot`: (zone, $/h) of today's cheapest spot offer, from `plan --live`. None: nothing asked, or no
        price known."""
        price = self.price_usd_hour
        budget = self.request.budget_usd
        if price is None or (hours is None and budget is None):
            return None
        out: dict[str, Any] = {"instance_type": self.instance.name if self.instance else None, "usd_hour_on_demand": price}
        if hours is not None:
            out.update(hours=hours, usd_on_demand=round(price * hours, 2))
        if budget is not None:
            out.update(budget_usd=budget, budget_hours=round(budget / price, 2))
        if spot is not None:
            out.update(spot_zone=spot[0], usd_hour_spot=spot[1])
            if hours is not None:
                out["usd_spot"] = round(spot[1] * hours, 2)
        return out

    @property
    def unverified(self) -> tuple[str, ...]:
        notes = list(self.stack.unverified) if self.stack else []
        if self.cpu_torch is not None:
            notes.append(cpu.CPU_WHEEL_UNVERIFIED)
        if self.instance and self.instance.unverified:
            notes.append(f"{self.instance.name}: {self.instance.unverified}")
        if any(s.name == "docker" for s in self.steps):
            from gpuprov.plan.docker import docker_unverified

            if note := docker_unverified(self.request.os):
                notes.append(note)
        return tuple(notes)

    @property
    def warnings(self) -> tuple[str, ...]:
        """What this plan allows but a user should know: a driver branch NVIDIA has ended, facts gone stale."""
        out = list(self.stack.warnings) if self.stack else []
        used = (("torch", "cuda", "drivers", "driver-lifecycle") if self.stack else ()) + \
            (("instance-types",) if self.instance else ())
        if used and (note := facts.stale_note(used)):
            out.append(note)
        return tuple(out)

    def bundle(self) -> Bundle:
        context = {"plan": self, "stack": self.stack, "playbook": self.playbook, "env": self.playbook.env,
                   "sources": self.sources,
                   "home": self.home, "state_dir": noroot.state_dir(self.home) if self.home else STATE_DIR}
        return render_steps(self.steps, context, {"gpuprov_plan": self.summary()})

    def step_sources(self) -> list[dict[str, str]]:
        """Each download of each step: the step, the sources key, its URL and where that was set."""
        return [{"step": s.name, "key": key, "url": url, "from": where}
                for s in self.steps for key, url, where in self.sources.for_step(s.name)
                if not (s.name == "python-env" and self.playbook.env
                        and key not in (("uv",) if self.playbook.env.manager == "uv" else ("miniforge", "conda")))
                and not (key == "epel" and not (self.stack and oses.info(self.stack.os).epel))
                # at its origin the AWS CLI comes from the snap store, not from the map
                and not (key == "awscli" and key not in self.sources.mirrored)
                and not (key in sources.OS_KEYS and not (self.stack and self.sources.os_key_applies(
                    key, self.stack.os, self.stack.cpu_arch)))]

    def summary(self) -> dict[str, Any]:
        """The plan as JSON-ready data (what `plan --json` prints and manifest.json records)."""
        return {
            "gpu": self.gpu.name if self.gpu else None,
            "count": self.count,
            "market": "spot" if self.request.spot else "on-demand",
            **({"spot_duration_hours": self.request.spot_duration} if self.request.spot_duration is not None else {}),
            "region": self.request.region,
            "instance_type": self.instance.name if self.instance else None,
            "price_usd_hour_on_demand": self.price_usd_hour,
            **({"cloud": self.request.cloud, "price_unknown": catalog_for(self.request.cloud).prices_unknown}
               if self.request.cloud != "aws" else {}),
            "candidates": [
                {"instance_type": c.name, "gpus": c.gpus, "price_usd_hour": c.price_usd_hour} for c in self.candidates
            ],
            **({"cpu_only": {"vcpu": self.instance.vcpu, "ram_gib": self.instance.ram_gib,
                             "torch": self.cpu_torch.model_dump(mode="json") if self.cpu_torch else None,
                             "python": next((dict(s.extra).get("python") for s in self.steps if s.name == "python-env"),
                                            None),
                             "skipped": list(cpu.GPU_STEPS_SKIPPED)}}
               if self.cpu_only and self.instance else {}),
            "playbook": self.playbook.name,
            "env_path": self.playbook.env.path if self.playbook.env else None,
            "os": self.request.os,
            "arch": self.arch,
            **({"ultraserver": self.instance.ultraserver} if self.instance and self.instance.ultraserver else {}),
            "stack": self.stack.model_dump(mode="json") if self.stack else None,
            **({"wheels": self.wheels} if self.wheels else {}),
            "steps": [{"name": s.name, "kind": s.kind, "summary": s.summary} for s in self.steps],
            "sources": self.step_sources(),
            "data": [d.summary() for d in self.playbook.data],
            "guards": self.guards.model_dump(mode="json", exclude={"cloud", "stop_role"} if self.guards.cloud == "aws"
                                             else None),
            "monitoring": monitoring_summary(self.request.monitoring, self.request.os),
            "unverified": list(self.unverified),
            **({"no_root": {"home": self.home, "skipped": [{"name": n, "why": w} for n, w in self.skipped]}}
               if self.home else {}),
        }


def _merge_pins(playbook: StackPins, flags: StackPins) -> StackPins:
    """Flags win over the playbook, field by field."""
    return playbook.model_copy(update={k: v for k, v in flags.model_dump().items() if v is not None})


def choose_instances(gpu: Gpu, count: int, instance_type: str | None = None,
                     cat: catalog.Catalog | None = None, arch: CpuArch | None = None) -> tuple[InstanceType, ...]:
    """Instance types carrying at least `count` of this GPU, cheapest first (unpriced last); with `arch` (`uname -m`
    spelling), only those whose CPU is of it."""
    from gpuprov.plan import catalog

    cat = cat or catalog.load()
    if instance_type:
        it = cat.instance_type(instance_type)
        if it.cpu_only:
            raise UserInputError("--instance-type", f"{it.name} is a CPU-only type: it carries no {gpu.name}",
                                 f"drop --gpu for a CPU-only node on {it.name}, or name a type with {gpu.name}")
        if it.gpu != gpu.name or it.gpus < count:
            raise UserInputError("--instance-type", f"{it.name} carries {it.gpus}× {it.gpu}, not {count}× {gpu.name}")
        refuse_retired(it, cat)
        if arch and it.host_arch != arch:
            said = f" (EC2: {it.arch})" if cat.cloud == "aws" else ""
            raise UserInputError("--arch", f"{it.name} is an {it.host_arch} type{said}, not {arch}",
                                 f"--arch {it.host_arch}, or another --instance-type")
        return (it,)
    if arch and cat.launchable_for(gpu) and not any(it.host_arch == arch for it in cat.launchable_for(gpu)):
        others = sorted({it.host_arch for it in cat.launchable_for(gpu)})
        raise UserInputError("--arch", f"every instance type with {gpu.name} is {' or '.join(others)}, not {arch}",
                             f"--arch {others[0]}, or a GPU AWS sells with {arch} hosts")
    fits = [it for it in cat.launchable_for(gpu) if it.gpus >= count and (not arch or it.host_arch == arch)]
    if not fits:
        most = max((it.gpus for it in cat.launchable_for(gpu)), default=0)
        gone = [it.name for it in cat.instance_types_for(gpu) if it.retired and it.gpus >= count]
        if gone:
            raise UserInputError("--gpu", f"no instance type EC2 still describes carries {count}× {gpu.name}",
                                 f"retired: {', '.join(gone)}; the most on one launchable instance is {most}")
        raise UserInputError("--gpu", f"no instance type carries {count}× {gpu.name}", f"the most on one instance is {most}")
    return tuple(sorted(fits, key=lambda it: (it.price_usd_hour is None, it.price_usd_hour or 0.0, it.gpus)))


def refuse_retired(it: InstanceType, cat: catalog.Catalog, flag: str = "--instance-type") -> None:
    """A type EC2 no longer describes is refused by name, before anything is asked of the cloud, with the types of
    its GPU that EC2 still describes (what replaces it)."""
    if it.retired:
        others = ", ".join(t.name for t in cat.launchable_for(cat.gpu(it.gpu))) if it.gpu else ""
        raise UserInputError(flag, f"{it.name} is retired: {it.retired}", f"other types with {it.gpu}: {others or 'none'}")


def guards_for(request: NodeRequest, playbook: Playbook, launched: bool = False) -> Guards:
    """The guard settings from flags and the playbook (the flag's hook wins over the playbook's)."""
    hook = request.on_interrupt or playbook.on_interrupt
    save = bool(saves_on(playbook.data, "interrupt"))  # a checkpoint to save on the notice: the watch runs for it
    # the watch reads the notice of the node's cloud (NOTICES); on a cloud without one make_plan refused a hook or a
    # save before this, and a spot node there has no watch
    noticed = request.cloud in NOTICES
    cloud = _cloud(request.cloud)
    guards = Guards(autostop_seconds=request.autostop_seconds, ttl_seconds=request.ttl_seconds,
                    interrupt_watch=bool((request.spot and noticed) or hook or save), on_interrupt=hook,
                    save_on_interrupt=save,
                    shutdown_action=shutdown_action(request) if launched else None,
                    # gpuprov launches an Alibaba node with the RAM role its guards' stop asks ECS with
                    stop_role=launched and cloud == "alibaba",
                    cloud=cloud, metadata_url=NOTICES[cloud].metadata_url)  # type: ignore[arg-type]
    return guards


def check_spot_duration(request: NodeRequest) -> None:
    """--spot-duration is a spot request's protection period on Alibaba Cloud (RunInstances' SpotDuration); no other
    cloud has one, and an on-demand node needs none."""
    if request.spot_duration is None:
        return
    if request.cloud != "alibaba":
        raise UserInputError("--spot-duration", f"is Alibaba Cloud's spot protection period; {request.cloud} has none",
                             "drop --spot-duration, or --cloud alibaba")
    if not request.spot:
        raise UserInputError("--spot-duration", "applies to spot requests only", "add --spot, or drop --spot-duration")


def shutdown_action(request: NodeRequest) -> Literal["stop", "terminate"]:
    """What a shutdown on the node does: stop (disk kept) for nodes that can stop, else terminate."""
    if request.persistent and not request.spot:
        raise UserInputError("--persistent", "applies to spot requests only", "add --spot, or drop --persistent")
    if request.cloud == "alibaba":
        # ECS has no shutdown behaviour to set: an instance powered off from within stops, a spot one too, and nothing
        # on the node can release it (Guards.then says what the stop bills)
        if request.autostop_action == "terminate":
            raise UserInputError("--autostop-action", "terminate: an ECS instance powered off from within stops, and "
                                 "nothing on the node can release it", "--autostop-action stop (Alibaba Cloud's only "
                                 "one), and `gpuprov down NAME` to release the node")
        return "stop"
    if request.autostop_action == "stop" and not request.can_stop:
        raise UserInputError("--autostop-action", "a one-time spot instance cannot stop (EC2 refuses to stop it)",
                             "add --persistent (a persistent spot request that stops instead of terminating), "
                             "or --autostop-action terminate")
    if request.autostop_action == "terminate" and request.spot and request.persistent:
        # EC2 user guide, "State changes for a Spot request": terminating an instance of a persistent request opens the
        # request again, and EC2 launches a replacement, one gpuprov never bootstrapped and whose guards are off
        raise UserInputError("--autostop-action", "terminate on a persistent spot request: EC2 would open the request "
                             "again and launch a replacement, with no guards, billing until `gpuprov down`",
                             "--autostop-action stop (the default with --persistent), or drop --persistent for a "
                             "one-time spot node that terminates")
    return request.autostop_action or ("stop" if request.can_stop else "terminate")


def budget_decides(guards: Guards) -> bool:
    """Whether the node's deadline is its budget's (else the --ttl given was sooner)."""
    if guards.budget_usd is None or not guards.budget_price or guards.ttl_seconds is None:
        return False
    return budget_seconds(guards.budget_usd, guards.budget_price) <= guards.ttl_seconds


def with_budget(guards: Guards, budget_usd: float | None, price_usd_hour: float | None) -> Guards:
    """The guards with the budget turned into the TTL when it runs out before the TTL would."""
    if budget_usd is None or not price_usd_hour:
        return guards
    seconds = budget_seconds(budget_usd, price_usd_hour)
    ttl = seconds if guards.ttl_seconds is None else min(seconds, guards.ttl_seconds)
    return guards.model_copy(update={"ttl_seconds": ttl, "budget_usd": budget_usd, "budget_price": price_usd_hour})


def replace_guards(plan: Plan, guards: Guards) -> Plan:
    """The same plan with other guard settings (the guard steps first, as always)."""
    rest = tuple(s for s in plan.steps if s.kind != "guard")
    return replace(plan, guards=guards, steps=(*guard_steps(guards, plan.cpu_only), *rest))


def guard_steps(guards: Guards, cpu_only: bool = False) -> list[StepPlan]:
    """The guard steps, first in the plan: they protect the bill even while the bootstrap runs."""
    steps = []
    if guards.autostop_seconds is not None:
        steps.append(autostop_step(guards, cpu_only))
    if guards.ttl_seconds is not None:
        steps.append(ttl_step(guards))
    if guards.interrupt_watch or guards.block_end is not None:
        hook = "runs the on-interrupt hook once" if guards.on_interrupt else "logs it (no on-interrupt hook)"
        if guards.save_on_interrupt:
            hook += ", then saves the data: uploads (save-data interrupt)"
        block = (f"; {BLOCK_WARN_SECONDS // 60} min before its Capacity Block ends (EC2 ends its instances 30 min "
                 "before) it warns and does the same" if guards.block_end is not None else "")
        watch = ("IMDSv2 spot/instance-action" if guards.cloud == "aws" else
                 f"ECS metadata instance/spot/termination-time (set {guards.notice.warning} ahead)")
        steps.append(StepPlan(
            "spot-interrupt", "guard_interrupt.sh.j2", "guard",
            f"watch {watch} every 5s; on a notice {hook}{block} (gpuprov-interrupt.service)",
            (("guards", guards),),
        ))
    return steps


def autostop_step(guards: Guards, cpu_only: bool = False) -> StepPlan:
    """:param cpu_only: a node with no GPU, whose check judges the CPUs' load instead (same script, same step)."""
    if guards.autostop_seconds is None:
        what = "autostop off (gpuprov-autostop.timer disabled)"
    else:
        busy = ("the 1-minute load under " if cpu_only else "every GPU under ") + f"{guards.idle_threshold_pct}%" + \
            (" of the CPUs (no GPU)" if cpu_only else "")
        what = (f"shut down after {format_duration(guards.autostop_seconds)} idle: {busy} and no SSH session "
                f"(gpuprov-autostop.timer, every minute); then {guards.then}")
    return StepPlan("autostop", "guard_autostop.sh.j2", "guard", what, (("guards", guards),))


def ttl_step(guards: Guards, reset: bool = False) -> StepPlan:
    """The TTL step; `reset` starts a new deadline from now even when the TTL is the same (`gpuprov ttl`)."""
    if guards.ttl_seconds is None:
        what = "TTL off (gpuprov-ttl.timer disabled, deadline removed)"
    else:
        budget = ""
        if guards.budget_usd is not None and guards.budget_price:
            lasts = format_duration(budget_seconds(guards.budget_usd, guards.budget_price))
            budget = (f" (when the ${guards.budget_usd:g} budget at ${guards.budget_price:.4g}/h runs out)"
                      if budget_decides(guards) else
                      f" (--ttl: sooner than the ${guards.budget_usd:g} budget, {lasts} at ${guards.budget_price:.4g}/h)")
        what = (f"hard deadline: shut down {format_duration(guards.ttl_seconds)}{budget} after this step first runs "
                f"(gpuprov-ttl.timer, survives reboots); then {guards.then}")
    return StepPlan("ttl", "guard_ttl.sh.j2", "guard", what, (("guards", guards), ("reset", reset)))


def autostop_script(seconds: int | None, idle_threshold_pct: int = 10, shutdown_action: str | None = None,
                    cloud: str = "aws") -> Script:
    """The autostop step alone (what `gpuprov autostop NAME 2h|off` runs on a live node of `cloud`)."""
    guards = Guards(autostop_seconds=seconds, idle_threshold_pct=idle_threshold_pct,
                    shutdown_action=shutdown_action, cloud=_cloud(cloud))  # type: ignore[arg-type]
    (script,) = render_steps((autostop_step(guards),), {}, {}).scripts
    return script


def ttl_script(seconds: int | None, shutdown_action: str | None = None, cloud: str = "aws") -> Script:
    """The TTL step alone (what `gpuprov ttl NAME 4h|off` runs on a node of `cloud`): a new deadline from now, or
    none."""
    guards = Guards(ttl_seconds=seconds, shutdown_action=shutdown_action, cloud=_cloud(cloud))  # type: ignore[arg-type]
    (script,) = render_steps((ttl_step(guards, reset=True),), {}, {}).scripts
    return script


def _cloud(name: str) -> str:
    """A node's recorded cloud as the guards know it (a host's or an unknown one's guards are AWS's wording)."""
    return name if name in NOTICES else "aws"


def steps_for(
    playbook: Playbook, stack: Stack | None, python: str = "3.12", guards: Guards = NO_GUARDS,
    monitoring: Monitoring | None = None, os_name: str = "ubuntu-24.04", gpus: int = 0,
    cpu_torch: TorchWheel | None = None, cpu_only: bool = False,
) -> tuple[StepPlan, ...]:
    """:param cpu_torch: a CPU-only node's torch wheel (plan/cpu.py): installed like the GPU stack's, checked on the
        CPU instead of the GPU verify.
    :param cpu_only: a node on a CPU-only type (its autostop judges the CPUs)."""
    steps: list[StepPlan] = guard_steps(guards, cpu_only)
    if stack is not None:
        steps += driver_stack_steps(stack)
    check_monitoring_os(monitoring or Monitoring(), os_name)
    # after the driver (the exporters read it), before the env and the playbook's steps (a long `run:` is
    # what the watch is there for)
    steps += monitoring_steps(monitoring or Monitoring(), os_name, gpus)
    image = None
    if stack is not None and playbook.docker:
        from gpuprov.plan.docker import container_image, docker_step

        image = container_image(playbook)
        if image:
            steps.append(docker_step(os_name, image))
    if playbook.env is not None:
        python = stack.python if stack else python
        steps.append(StepPlan(
            "python-env", "python_env.sh.j2", "env",
            f"Python {python} env at {playbook.env.path} ({playbook.env.manager})", (("python", python),),
        ))
        if stack is not None and stack.torch is not None:
            steps.append(StepPlan("pytorch", "torch.sh.j2", "env", f"{stack.torch.requirement} from {stack.torch.index_url}"))
        elif cpu_torch is not None:
            steps.append(cpu.torch_step(cpu_torch))
        if playbook.env.packages:
            steps.append(StepPlan("packages", "packages.sh.j2", "env", ", ".join(playbook.env.packages)))
    steps += data_steps(playbook.data)  # the data the playbook's own steps train on
    for user_step in playbook.steps:
        what = "run a command" if user_step.run else ""
        if user_step.files:
            what = (what + " and " if what else "") + f"write {len(user_step.files)} file(s)"
        steps.append(StepPlan(user_step.name, "user_step.sh.j2", "user", what, (("user_step", user_step),)))
    if playbook.jupyter and playbook.env is not None:
        steps.append(StepPlan("jupyter", "jupyter.sh.j2", "env",
                              f"JupyterLab from {playbook.env.path} on 127.0.0.1:8888 with a token (gpuprov-jupyter.service)"))
    if stack is not None:
        # as templates/verify.sh.j2 does: the torch probe and its matmul only where the stack installs torch
        steps.append(StepPlan("verify", "verify.sh.j2", "verify",
                              ("nvidia-smi + torch.cuda probe, a matmul on every GPU" if stack.torch else
                               "nvidia-smi sees every GPU (this playbook installs no torch, so no matmul)")
                              + (", nvidia-smi -L in a container sees them all" if image else ""),
                              (("container_image", image),)))
    elif cpu_torch is not None and playbook.env is not None:
        steps.append(cpu.verify_step())
    return tuple(steps)


def resolve_stack(
    playbook: Playbook, gpu: Gpu, os_name: str, pins: StackPins, nvswitch: bool | None, kept_driver: str | None = None,
    cpu_arch: CpuArch = "x86_64", default_why: str | None = None,
) -> Stack | None:
    """:param kept_driver: the installed driver a host keeps (--keep-driver, `driver: keep`): plan/kept.py.
    :param cpu_arch: the host's CPU (`uname -m`): the repositories' folder and the wheels depend on it.
    :param default_why: why the default driver branch is the default, in the plan's cloud's words (its catalog's
        `default_branch_why`); None: AWS's, which a host on no cloud is planned with."""
    stack = _resolve_stack(playbook, gpu, os_name, pins, nvswitch, kept_driver, cpu_arch, default_why)
    return stack.model_copy(update={"cpu_arch": cpu_arch}) if stack is not None else None


def _resolve_stack(
    playbook: Playbook, gpu: Gpu, os_name: str, pins: StackPins, nvswitch: bool | None, kept_driver: str | None,
    cpu_arch: CpuArch, default_why: str | None = None,
) -> Stack | None:
    from gpuprov.plan import compat

    why = default_why or compat.DEFAULT_BRANCH_WHY
    if playbook.stack == "none":
        if pins.model_copy(update={"python": None}) != StackPins():
            raise UserInputError("--playbook", f"playbook {playbook.name!r} installs no GPU stack, so driver, CUDA "
                                 "and torch pins do not apply", "drop them, or use a playbook with `stack: gpu`")
        return None
    merged = _merge_pins(playbook.pins, pins)
    try:
        if kept_driver is not None:
            if playbook.cuda_toolkit:
                raise UserInputError("--keep-driver", f"playbook {playbook.name!r} installs the CUDA toolkit, which comes "
                                     "from NVIDIA's repository that only the driver step sets up",
                                     "use a playbook without cuda_toolkit, or drop --keep-driver")
            from gpuprov.plan.kept import resolve_kept

            return resolve_kept(gpu, os_name, merged, kept_driver, playbook.installs_torch, cpu_arch)
        stack = compat.resolve(gpu, os_name, merged, nvswitch=nvswitch, want_torch=playbook.installs_torch,
                               cpu_arch=cpu_arch, default_why=why)
        if playbook.cuda_toolkit and not merged.cuda:
            # the toolkit that matches the wheel keeps nvcc-built extensions ABI-compatible with torch
            cuda = stack.torch.cuda if stack.torch else compat.newest_cuda(gpu, stack.driver_branch, os_name)
            stack = compat.resolve(
                gpu, os_name, merged.model_copy(update={"cuda": cuda}),
                nvswitch=nvswitch, want_torch=playbook.installs_torch, cpu_arch=cpu_arch, default_why=why,
            )
    except UserInputError as exc:
        raise _blame_playbook(exc, playbook, pins) from None
    return stack


PIN_FLAGS = {"--driver": "driver", "--cuda": "cuda", "--torch": "torch", "--torch-cuda": "torch_cuda",
             "--python": "python"}


def _blame_playbook(exc: UserInputError, playbook: Playbook, flags: StackPins) -> UserInputError:
    """A refused pin the playbook set (no flag overrode it) is named where the playbook sets it."""
    pin = PIN_FLAGS.get(exc.field)
    where = playbook.where("pins", pin) if pin and getattr(flags, pin) is None else None
    if where is None:
        return exc
    out = type(exc).__new__(type(exc))  # a StackConflict stays one, with its rule
    out.__dict__.update(vars(exc), field=where)
    Exception.__init__(out, f"{where}: {exc.problem}" + (f"\n  {exc.hint}" if exc.hint else ""))
    return out


def with_monitoring(monitoring: Monitoring, playbook: Playbook) -> Monitoring:
    """The flags' monitoring with the playbook's `metrics:` where no flag said it, checked."""
    if monitoring.metrics == "off" and playbook.metrics != "off":
        monitoring = monitoring.model_copy(update={"metrics": playbook.metrics})
    return monitoring.check()


def with_jupyter(playbook: Playbook, jupyter: bool) -> Playbook:
    """`playbook` with JupyterLab added (--jupyter), checked like a playbook that says `jupyter: true`."""
    if not jupyter or playbook.jupyter:
        return playbook
    try:
        return Playbook.model_validate({**playbook.model_dump(), "jupyter": True})
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise UserInputError("--jupyter", f"playbook {playbook.name!r}: {problem}",
                             "use a playbook with an env, e.g. -p pytorch or -p jupyter") from None


def _with_docker(playbook: Playbook, docker: bool) -> Playbook:
    if not docker:
        return playbook
    from gpuprov.plan.docker import with_docker

    return with_docker(playbook, docker)


def catalog_for(cloud: str) -> catalog.Catalog:
    """The shipped catalog of the cloud a node is planned on: AWS's, or Alibaba Cloud's (plan/catalog_alibaba.py)."""
    if cloud == "alibaba":
        from gpuprov.plan import catalog_alibaba

        return catalog_alibaba.catalog()
    from gpuprov.plan import catalog

    return catalog.load()


def refuse_unpriced(cat: catalog.Catalog, field: str) -> None:
    """An estimate (--budget, --hours) on a catalog that knows no price is refused, naming why there is none."""
    if cat.prices_unknown is not None:
        raise UserInputError(field, f"no {cat.cloud_title} price is known: {cat.prices_unknown}, so nothing can be "
                             "estimated", "leave it out (--ttl sets a deadline without a price)")


def refuse_interrupt_watch(request: NodeRequest, playbook: Playbook, cat: catalog.Catalog) -> None:
    """The interruption watch reads the notices of the clouds in NOTICES: on another cloud a hook or a save on the
    notice is refused (a spot node there runs no watch)."""
    if request.on_interrupt or playbook.on_interrupt or saves_on(playbook.data, "interrupt"):
        field = "--on-interrupt" if request.on_interrupt else playbook.where("on_interrupt" if playbook.on_interrupt
                                                                             else "data") or "--playbook"
        raise UserInputError(field, f"gpuprov does not read {cat.cloud_title}'s interruption notice yet: nothing "
                             "would run on it", "leave the hook and interrupt saves out on this cloud")


def make_plan(request: NodeRequest, cat: catalog.Catalog | None = None) -> Plan:
    """The plan for a node gpuprov launches: instance choice + stack + steps.

    :param cat: the catalog with EC2's own instance-type facts laid over it (`plan --live`, `up`); else the
        catalog of the request's cloud as shipped and refreshed."""
    from gpuprov.plan import catalog

    cat = cat or catalog_for(request.cloud)
    cat.check_region(request.region)
    check_spot_duration(request)
    if request.budget_usd is not None and request.budget_usd <= 0:
        raise UserInputError("--budget", f"{request.budget_usd:g} is not a budget", "dollars above 0, e.g. 50")
    if request.budget_usd is not None:
        refuse_unpriced(cat, "--budget")
    if cat.oses and request.os not in cat.oses:
        raise UserInputError("--os", f"{cat.cloud_title}'s public images gpuprov finds give no {request.os}",
                             f"--os {' or --os '.join(cat.oses)}")
    if cpu.wanted(request, cat):
        if not cat.cpu_types():
            raise UserInputError("--cpu" if request.cpu is not None else "--memory",
                                 f"gpuprov knows no CPU-only {cat.cloud_title} type", "a --gpu it has")
        return _make_cpu_plan(request, cat)
    name, count_in_name = catalog.parse_gpu_request(request.gpu or cpu.gpu_of_type(request, cat))
    gpu = cat.gpu(name)
    count = request.count if request.count is not None else count_in_name
    if count < 1:
        raise UserInputError("--count", f"{count} GPUs", "at least 1, e.g. --count 8")
    if ":" in (request.gpu or "") and count != count_in_name:
        raise UserInputError("--count", f"--count {count} conflicts with --gpu {request.gpu}",
                             f"give the count once: --gpu {name}:{count}, or --gpu {name} --count {count}")
    if gpu.cpu_arch and request.arch and request.arch != gpu.cpu_arch:
        raise UserInputError("--arch", f"{gpu.name} comes only with {gpu.cpu_arch} hosts, not {request.arch}",
                             f"--arch {gpu.cpu_arch}, or leave --arch out")
    request = request.model_copy(update={"arch": request.arch or gpu.cpu_arch})
    if not cat.instance_types_for(gpu) and not request.instance_type:
        return _plan_without_instance(request, gpu, count)
    candidates = choose_instances(gpu, count, request.instance_type, cat, request.arch)
    instance = candidates[0]
    arch = request.arch or instance.host_arch
    playbook = _with_docker(with_jupyter(load_playbook(request.playbook), request.jupyter), request.docker)
    if playbook.driver == "keep":
        raise UserInputError(playbook.where("driver") or "--playbook", "`driver: keep` keeps a host's own driver; a "
                             "node gpuprov launches has none to keep", "bootstrap the host with it, or use a "
                             "playbook that installs the driver")
    request = request.model_copy(update={"monitoring": with_monitoring(request.monitoring, playbook)})
    if cat.cloud not in NOTICES:
        refuse_interrupt_watch(request, playbook, cat)
    where_from = effective_sources(request, playbook)
    stack = with_sources(resolve_stack(playbook, gpu, request.os, request.pins, instance.nvswitch, cpu_arch=arch,
                                       default_why=cat.default_branch_why), where_from)
    if request.budget_usd is not None and instance.price_usd_hour:
        check_budget(request.budget_usd, instance.price_usd_hour)
    guards = with_budget(guards_for(request, playbook, launched=True), request.budget_usd, instance.price_usd_hour)
    steps = steps_for(playbook, stack, request.pins.python or "3.12", guards, request.monitoring, request.os,
                      instance.gpus)
    return Plan(request, gpu, count, instance, candidates, playbook, stack, steps, guards, sources=where_from)


def effective_sources(request: NodeRequest, playbook: Playbook) -> Effective:
    """Where the node downloads from: --sources over the playbook's `sources:` over config.toml's [sources]; where
    none of them is set, the node's cloud's own mirror (sources.CLOUD_DEFAULTS), else the origins."""
    from gpuprov.paths import config_path
    from gpuprov.plan import config

    layers = [(config.load().sources, f"{config_path()}: [sources]"),
              (playbook.sources, playbook.where("sources") or f"playbook {playbook.name}: sources"),
              (request.sources, request.sources_from)]
    # a layer named, even empty (`[sources]` alone keeps the origins), is the user's choice over the cloud's
    if all(layer is None for layer, _ in layers) and (default := sources.cloud_default(request.cloud)) is not None:
        layers.insert(0, default)
    return sources.effective(*layers)


def with_sources(stack: Stack | None, where_from: Effective) -> Stack | None:
    """The stack with its torch index on the map's `torch` source, and the lock of its wheels where `facts refresh`
    made one that fits (plan/wheel_lock.py): the hashes are the origin's whichever index serves the wheels."""
    if stack is None or stack.torch is None:
        return stack
    torch = stack.torch
    lock = wheel_lock.lock_for(torch.version, torch.variant, stack.python, stack.cpu_arch)
    return stack.model_copy(update={"torch": torch.model_copy(
        update={"index_url": where_from.rebase(torch.index_url), "lock": lock})})


def _make_cpu_plan(request: NodeRequest, cat: catalog.Catalog) -> Plan:
    """The plan for a node on a CPU-only type: the cheapest type with the vCPUs and memory asked (or the type named),
    the same guards, env, data and steps as any node, torch's CPU wheel, and no GPU steps (plan/cpu.py)."""
    candidates = cpu.choose_types(request, cat)
    instance = candidates[0]
    playbook = _with_docker(with_jupyter(load_playbook(request.playbook), request.jupyter), request.docker)
    request = request.model_copy(update={"monitoring": with_monitoring(request.monitoring, playbook)})
    cpu.check_playbook(playbook, request, instance.name)
    pins = _merge_pins(playbook.pins, request.pins)
    where_from = effective_sources(request, playbook)
    wheel = cpu.torch_wheel(pins) if playbook.installs_torch else None
    if wheel is not None:  # the CPU wheel's index on the map's `torch` source, as a GPU node's
        wheel = wheel.model_copy(update={"index_url": where_from.rebase(wheel.index_url)})
    python = cpu.python_for(pins, wheel)
    if request.budget_usd is not None and instance.price_usd_hour:
        check_budget(request.budget_usd, instance.price_usd_hour)
    guards = with_budget(guards_for(request, playbook, launched=True), request.budget_usd, instance.price_usd_hour)
    steps = steps_for(playbook, None, python, guards, request.monitoring, request.os, 0, wheel, cpu_only=True)
    return Plan(request, None, 0, instance, candidates, playbook, None, steps, guards, sources=where_from,
                cpu_torch=wheel)


def _plan_without_instance(request: NodeRequest, gpu: Gpu, count: int) -> Plan:
    """The offline plan for a GPU no AWS type carries (GH200): what `render` writes for a host of it; `up` refuses it
    (cloud/launch.check_options)."""
    plan = make_host_plan(request.gpu, request.playbook, request.os, request.pins, None,
                          GuardRequest(request.autostop_seconds, request.ttl_seconds, request.on_interrupt),
                          request.jupyter, request.monitoring, docker=request.docker, arch=request.arch or "x86_64",
                          sources_flag=(request.sources, request.sources_from) if request.sources else None)
    return replace(plan, request=plan.request.model_copy(update={"region": request.region, "spot": request.spot}),
                   count=count)


@dataclass(frozen=True)
class GuardRequest:
    """Guardrails asked for by flags: idle autostop and TTL in seconds, an interruption hook."""

    autostop_seconds: int | None = None
    ttl_seconds: int | None = None
    on_interrupt: str | None = None


def make_host_plan(
    gpu_name: str | None, playbook_name: str, os_name: str, pins: StackPins, nvswitch: bool | None = None,
    guard: GuardRequest | None = None, jupyter: bool = False, monitoring: Monitoring | None = None,
    kept_driver: str | None = None, docker: bool = False, home: str | None = None, arch: CpuArch = "x86_64",
    sources_flag: tuple[Sources, str] | None = None, notice_cloud: str | None = None,
) -> Plan:
    """The plan for an existing host: no instance type; Fabric Manager follows what the host has; `kept_driver`
    the host's installed driver when it keeps it (--keep-driver, `driver: keep`); `notice_cloud` the cloud whose
    interruption notice its watch reads (an ECS instance's facts say alibaba; None: AWS's).

    :param nvswitch: True when the host showed NVSwitch devices; None installs Fabric Manager only
        if the host turns out to have them.
    :param guard: guardrails, as for a launched node (the interruption watcher only with a hook: an
        existing host is not a spot instance gpuprov asked for).
    :param home: the login's home where it has no root (plan/noroot.py): what needs root is left out, the env goes
        there.
    """
    playbook = _with_docker(with_jupyter(load_playbook(playbook_name), jupyter), docker)
    gpu, count = None, 0
    if gpu_name:
        from gpuprov.plan import catalog

        name, count = catalog.parse_gpu_request(gpu_name)
        gpu = catalog.load().gpu(name)
    if gpu is None and playbook.stack != "none":
        raise UserInputError("--gpu", "no NVIDIA GPU found on the host, and none given",
                             "pass --gpu, or use a `stack: none` playbook for CPU hosts")
    stack = resolve_stack(playbook, gpu, os_name, pins, nvswitch, kept_driver, arch) if gpu else None
    if gpu is None and pins.model_copy(update={"python": None}) != StackPins():
        raise UserInputError("--playbook", "driver, CUDA and torch pins need a GPU host")
    guard = guard or GuardRequest()
    wanted = with_monitoring(monitoring or Monitoring(), playbook)
    request = NodeRequest(gpu=gpu_name or "none", count=max(count, 1), playbook=playbook_name, os=os_name, pins=pins,
                          arch=arch, autostop_seconds=guard.autostop_seconds, ttl_seconds=guard.ttl_seconds,
                          on_interrupt=guard.on_interrupt, jupyter=jupyter, monitoring=wanted, docker=docker,
                          sources=sources_flag[0] if sources_flag else None,
                          sources_from=sources_flag[1] if sources_flag else "--sources")
    where_from = effective_sources(request, playbook)
    stack = with_sources(stack, where_from)
    guards = guards_for(request, playbook)
    if notice_cloud in NOTICES:
        guards = guards.model_copy(update={"cloud": notice_cloud, "metadata_url": NOTICES[notice_cloud].metadata_url})
    # the GPU count the watch expects: the one the command line or inventory says (`--gpu A100:8`), else the one
    # the watch sees at its first look on the node
    if home is not None and playbook.env is not None:
        playbook = playbook.model_copy(update={"env": playbook.env.model_copy(
            update={"path": noroot.env_path(home, playbook.env.path)})})
    steps = steps_for(playbook, stack, pins.python or "3.12", guards, wanted, os_name,
                      count if gpu_name and ":" in gpu_name else 0)
    skipped: tuple[tuple[str, str], ...] = ()
    if home is not None:
        steps, skipped = noroot.without_root(steps)
    return Plan(request, gpu, count, None, (), playbook, stack, steps, guards, home, skipped, where_from)
