"""A host where the login has no root: not uid 0, and `sudo -n true` fails (many rented boxes give a user account
only). The facts say so (hosts/detect.py, `## login`); the plan then leaves out every step that needs root, with one
line each saying why, and puts what it installs into the login's home:

  the runner's bundle, markers and lock   ~/.local/state/gpuprov   (root: /var/lib/gpuprov)
  the Python env                          ~/.gpuprov/<the last part of the playbook's env.path>   (/opt/gpuprov/env)
  uv and its Pythons, Miniforge           ~/.local/bin/uv, ~/.local/share/uv/python, ~/miniforge3: the tools' own
                                          defaults for a user

Nothing there is under a test host's sysroot (GPUPROV_SYSROOT): that stands for the system's folders, which this
login cannot write; its home is its own. Only a kept driver (`--keep-driver`) or a `stack: none` playbook can run
without root: installing a driver needs it. Pure, like the rest of plan/.

`without_root` leaves steps out by name (docker, jupyter) and by kind (stack, guard, monitor) as `Plan.skipped`
(step, why), which bootstrap reports as `skipped` steps; templates/lib.sh.j2 then sets no sysroot (`GP_ROOT`
empty). A driver install is refused by the planner (hosts/planner.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import PurePosixPath

from gpuprov.plan.render import StepPlan

USER_STATE_REL = ".local/state/gpuprov"  # under $HOME: the runner's state (hosts/runner.py names it by "$HOME")
NO_ROOT = "needs root, which this login lacks (not uid 0, and `sudo -n true` fails)"

# why each step that needs root does: by step name, else by kind
_BY_NAME = {
    "docker": "it installs Docker and NVIDIA's container toolkit and configures the daemon",
    "jupyter": "it installs a systemd service (gpuprov-jupyter.service)",
}
_BY_KIND = {
    "stack": "it installs system packages",
    "guard": "it installs a systemd timer that shuts the host down",
    "monitor": "it installs system services (exporters, the health watch)",
}


def state_dir(home: str) -> str:
    return f"{home}/{USER_STATE_REL}"


def env_path(home: str, path: str) -> str:
    """Where a playbook's env (`env.path`, /opt/gpuprov/env) goes in the login's home: ~/.gpuprov/env."""
    return f"{home}/.gpuprov/{PurePosixPath(path).name}"


def needs_root(step: StepPlan) -> str | None:
    """Why `step` needs root, or None when the login can run it (the env, torch, packages, verify, user steps: a
    playbook's own commands run as the login and may fail where they need root, as they would by hand)."""
    return _BY_NAME.get(step.name) or _BY_KIND.get(step.kind)


def without_root(steps: tuple[StepPlan, ...]) -> tuple[tuple[StepPlan, ...], tuple[tuple[str, str], ...]]:
    """(the steps a login without root runs, (name, why) of each left out)."""
    kept: list[StepPlan] = []
    skipped: list[tuple[str, str]] = []
    for step in steps:
        why = needs_root(step)
        if why is None:
            kept.append(step)
        else:
            skipped.append((step.name, f"{NO_ROOT}: {why}"))
    if any(name == "docker" for name, _ in skipped):  # no Docker installed: verify runs no container
        kept = [replace(s, summary=s.summary.split(", nvidia-smi -L in a container")[0],
                        extra=(("container_image", None),)) if s.kind == "verify" else s for s in kept]
    return tuple(kept), tuple(skipped)
