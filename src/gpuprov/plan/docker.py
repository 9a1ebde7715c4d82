"""Docker with the NVIDIA Container Toolkit (`docker: true` in a playbook, `--docker`): the `docker` step that installs
the engine and NVIDIA's toolkit, points Docker at NVIDIA's runtime (restarting the daemon only when that changed its
config), adds the login user to the docker group and generates the CDI spec (Podman); verify then runs `nvidia-smi -L`
in a container (`docker run --rm --gpus all IMAGE`). Facts in data/docker.yaml with their sources. Pure.

Per family: apt's docker.io, or on dnf Docker's docker-ce repository for Rocky/RHEL 9 and Amazon Linux's own
`docker`, each only where no engine is installed; NVIDIA's toolkit from its apt list or dnf `.repo`;
`nvidia-ctk runtime configure --runtime=docker`; the login user is `SUDO_USER`. The verify's container image is
pinned by digest (`container_image`, `with_docker`), and the probe fails unless the container sees as many GPUs as
the host.
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict

from gpuprov.errors import UserInputError
from gpuprov.plan import oses
from gpuprov.plan.render import StepPlan
from gpuprov.plan.spec import PINNED_IMAGE as PINNED
from gpuprov.plan.spec import Playbook
from gpuprov.resources import load_data


class _AptFacts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    keyring_url: str
    keyring: str
    list_url: str
    list: str
    engine: tuple[str, ...]
    engines_seen: tuple[str, ...]


class _DnfEngine(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    packages: tuple[str, ...]
    repo_url: str | None = None  # Docker's repository file, where the OS's own repositories lack the engine
    repo: str | None = None
    unverified: str | None = None


class _DnfFacts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    toolkit_repo_url: str
    toolkit_repo: str
    engines_seen: tuple[str, ...]
    engines: dict[str, _DnfEngine]


class DockerFacts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    apt: _AptFacts
    dnf: _DnfFacts
    toolkit: tuple[str, ...]
    daemon_json: str
    cdi_spec: str
    cdi_spec_etc: str
    default_image: str
    default_image_unverified: str


@cache
def facts() -> DockerFacts:
    return DockerFacts.model_validate(load_data("docker.yaml"))


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
    """The docker step for a host of `os_name`: apt (Ubuntu, Debian: the distribution's docker.io) or dnf (Docker's
    docker-ce repository on Rocky and RHEL, Amazon Linux's own `docker`), NVIDIA's toolkit repository for either."""
    info = oses.table().oses.get(os_name)
    f = facts()
    family = info.family if info is not None else "apt"
    engine = f.dnf.engines.get(os_name) if family == "dnf" else None
    if family == "dnf" and engine is None:
        raise UserInputError("--docker", f"gpuprov knows no Docker engine for {os_name}",
                             f"leave --docker out on this OS; the docker step knows {', '.join(f.dnf.engines)} on dnf")
    packages = engine.packages if engine else f.apt.engine
    where = (" from Docker's repository" if engine and engine.repo_url else " from the OS's repository") if engine else ""
    return StepPlan("docker", "docker.sh.j2", "env",
                    f"{'/'.join(packages)}{where} + NVIDIA Container Toolkit, nvidia runtime in {f.daemon_json} (the "
                    "daemon restarted only when that changed it), the login user in the docker group, CDI spec "
                    f"{f.cdi_spec}; verify runs nvidia-smi -L in {image.split('@')[0]}",
                    (("docker", f), ("image", image), ("family", family), ("engine", engine),
                     ("os_name", os_name)))


def docker_unverified(os_name: str) -> str | None:
    """What no source read confirms about the engine the docker step installs on `os_name`."""
    engine = facts().dnf.engines.get(os_name)
    return f"docker on {os_name}: {engine.unverified}" if engine and engine.unverified else None
