"""Docker with the NVIDIA Container Toolkit (`docker: true` in a playbook, `--docker`): the `docker` step that installs
the engine and NVIDIA's toolkit, points Docker at NVIDIA's runtime (restarting the daemon only when that changed its
config), adds the login user to the docker group and generates the CDI spec (Podman); verify then runs `nvidia-smi -L`
in a container (`docker run --rm --gpus all IMAGE`). Facts in data/docker.yaml with their sources. Pure."""

from __future__ import annotations

from functools import cache

import yaml
from pydantic import BaseModel, ConfigDict

from gpuprov.errors import UserInputError
from gpuprov.plan import oses
from gpuprov.plan.render import StepPlan
from gpuprov.plan.spec import PINNED_IMAGE as PINNED
from gpuprov.plan.spec import Playbook
from gpuprov.resources import data_file


class _AptFacts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    keyring_url: str
    keyring: str
    list_url: str
    list: str
    engine: tuple[str, ...]
    engines_seen: tuple[str, ...]


class DockerFacts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    apt: _AptFacts
    toolkit: tuple[str, ...]
    daemon_json: str
    cdi_spec: str
    cdi_spec_etc: str
    default_image: str
    default_image_unverified: str


@cache
def facts() -> DockerFacts:
    return DockerFacts.model_validate(yaml.safe_load(data_file("docker.yaml").read_text()))


def check_image(image: str, where: str) -> str:
    if not PINNED.fullmatch(image):
        raise UserInputError(where, f"{image!r} is not an image pinned by digest",
                             "NAME:TAG@sha256:<64 hex digits>, e.g. " + facts().default_image)
    return image


def container_image(playbook: Playbook) -> str | None:
    """The image verify's container probe runs, when the playbook asks for Docker (None: no docker step)."""
    if not playbook.docker:
        return None
    return playbook.container_image or facts().default_image


def with_docker(playbook: Playbook, docker: bool) -> Playbook:
    """`playbook` with the docker step (--docker), checked like a playbook that says `docker: true`."""
    if not docker or playbook.docker:
        return playbook
    if playbook.stack == "none":
        raise UserInputError("--docker", f"playbook {playbook.name!r} installs no GPU stack; the NVIDIA Container "
                             "Toolkit needs the driver", "use a playbook with `stack: gpu`")
    return Playbook.model_validate({**playbook.model_dump(), "docker": True})


def docker_step(os_name: str, image: str) -> StepPlan:
    """The docker step for a host of `os_name` (apt family: Ubuntu, Debian)."""
    info = oses.table().oses.get(os_name)
    if info is not None and info.family == "dnf":
        raise UserInputError("--docker", f"gpuprov's docker step installs with apt; {os_name} uses dnf",
                             "leave --docker out on this OS, or use Ubuntu or Debian")
    f = facts()
    return StepPlan("docker", "docker.sh.j2", "env",
                    f"{'/'.join(f.apt.engine)} + NVIDIA Container Toolkit, nvidia runtime in {f.daemon_json} (the daemon "
                    "restarted only when that changed it), the login user in the docker group, CDI spec "
                    f"{f.cdi_spec}; verify runs nvidia-smi -L in {image.split('@')[0]}",
                    (("docker", f), ("image", image)))
