"""Baked images and Deep Learning AMIs: skip on a new node what an image already holds.

The stack hash names what a node's install steps are: the sha256 of the (name, sha256) of every
install step script (kinds stack, env, user) of its bundle, in order. Guard steps (per node: TTL,
autostop, spot watch) and verify (always runs) are left out. The hash of a plan and the hash of
the bundle a node ran are computed the same way, so an image matches a plan exactly when every
step the plan would run is already on the image, marker and all: those steps find their markers
and do nothing.

A bake (cloud/bake.py) records the image by its name before CreateImage: CreateImage has no ClientToken,
and EC2 requires an image name to be unique per account and region, so the recorded name finds an image
whose answer was lost.

Images outlive nodes: `down` leaves them (their gpuprov:node is IMAGES, never a node's name);
`image rm` deregisters one and deletes its snapshots; `gc` collects images tagged as this
owner's that no local record names, images of a bake that died before it learnt the id, and
snapshots whose image is gone.

`choose` (launch.launchpad, and `plan --live`): without `--image`, this owner's newest available image in the region
with the plan's stack hash, OS and architecture (its instance type's, as EC2 spells it: x86_64, arm64), else the
OS's public image of that architecture (Canonical's Ubuntu; for the other OSes the SSM parameter or the publisher's
account and name pattern in data/os.yaml's `aws`, with its login user, what `up` logs in as without `--ssh-user`;
GPUPROV_TEST_PUBLIC_SSM_ROOT stands for /aws/service in the tests' moto); `fresh`; `dlami` (the public SSM parameter
from data/images.yaml, refused before launch when its recorded driver branch is not the plan's); an AMI id; a baked
image's name. `check_architecture` refuses an image of another architecture than the type's before anything is made.
Snapshots are tagged `gpuprov:image=NAME`, so one whose image is gone is found.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from gpuprov.cloud import destroy
from gpuprov.cloud.providers import CLOUDS, image_ids
from gpuprov.cloud.providers import DEFAULT as DEFAULT_CLOUD
from gpuprov.cloud.providers.base import IMAGES, CloudResource, Image, Provider
from gpuprov.cloud.settle import settle
from gpuprov.errors import UserInputError
from gpuprov.state import locks

if TYPE_CHECKING:
    from gpuprov.plan.plan import Plan
    from gpuprov.say import Say
    from gpuprov.state import Store

ARCH = "x86_64"  # EC2's spelling of a plan's architecture when it names no instance type (ec2_arch)
INSTALL_KINDS = ("stack", "env", "user")
# what belongs to one node and not to an image of it, whose files the clean-up moves aside with their markers: the
# guards (plan.guard_steps' names), the monitoring (plan/monitoring's steps: their settings, the watch's findings,
# the collector's cursor), with their units, the data-save helper (its buckets are the node's) and EFA's settings
# (the instance type's own; the installer stays, so its step is quick); the next node's own `up` installs its own
GUARD_STEPS = ("autostop", "ttl", "spot-interrupt", "metrics", "health", "data-save", "efa")
GUARD_UNITS = ("gpuprov-autostop.timer", "gpuprov-autostop.service", "gpuprov-ttl.timer", "gpuprov-ttl.service",
               "gpuprov-interrupt.service", "gpuprov-health.service", "gpuprov-gpu-metrics.timer",
               "gpuprov-gpu-metrics.service")
AWS_DLAMI_PREFIX = "/aws/service/deeplearning"
_NAME = re.compile(r"[A-Za-z0-9()\[\] ./'@_-]{3,128}")  # EC2's rule for an image name (CreateImage, Name)
Source = Literal["baked", "ubuntu", "public", "dlami", "given"]  # public: another OS's own (data/os.yaml `aws`)


def stack_hash(steps: Iterable[tuple[str, str, str]]) -> str:
    """sha256 over the install steps' (name, script sha256), in order; `steps` are (name, kind, sha256)."""
    lines = [f"{name} {sha}" for name, kind, sha in steps if kind in INSTALL_KINDS]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def plan_stack(plan: Plan) -> str:
    return stack_hash((s.name, s.kind, s.sha256) for s in plan.bundle().scripts)


def install_steps(plan: Plan) -> list[str]:
    return [s.name for s in plan.steps if s.kind in INSTALL_KINDS]


# --- Deep Learning AMI facts (data/images.yaml) -------------------------------------------------


class DlamiDriver(BaseModel):
    model_config = ConfigDict(extra="forbid")
    branch: int
    version: str
    release: str
    source: str
    read: str
    unverified: str | None = None


class Dlami(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    parameter: str
    parameter_source: str
    read: str
    driver: dict[str, DlamiDriver]

    def parameter_for(self, os_name: str, arch: str = ARCH) -> str:
        from gpuprov.settings import settings

        name = self.parameter.format(arch=arch, os=os_name)
        prefix = settings().test_dlami_ssm_prefix  # tests: moto refuses names under /aws/
        return prefix + name.removeprefix(AWS_DLAMI_PREFIX) if prefix else name


def dlami() -> Dlami:
    from gpuprov.resources import load_data

    return Dlami.model_validate(load_data("images.yaml")["dlami"])


# --- which image `up` launches -------------------------------------------------------------------


@dataclass(frozen=True)
class ImageChoice:
    image_id: str | None  # None: not looked up (offline plan)
    source: Source
    name: str | None = None
    stack: str = ""
    on_image: tuple[str, ...] = ()  # install steps the image already holds (their markers match)
    note: str = ""
    user: str | None = None  # an OS's public image: its login user (data/os.yaml), what `up` logs in as by default

    def line(self) -> str:
        what = {"baked": f"baked image {self.name} ({self.image_id}, stack {self.stack[:12]})",
                "ubuntu": f"Canonical's Ubuntu ({self.image_id})",
                "public": f"{self.name} ({self.image_id})",
                "dlami": f"{self.name} ({self.image_id})",
                "given": f"{self.image_id}"}[self.source]
        return f"image: {what}" + (f", login user {self.user}" if self.user else "") + (f"; {self.note}" if self.note else "")

    def summary(self, plan: Plan) -> dict[str, object]:
        steps = install_steps(plan)
        return {"source": self.source, "id": self.image_id, "name": self.name, "stack": self.stack,
                "steps_on_image": list(self.on_image), "steps_to_run": [s for s in steps if s not in self.on_image],
                "note": self.note, **({"user": self.user} if self.user else {})}


def check_image_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise UserInputError("--name", f"{name!r} is not an image name",
                             "3-128 letters, digits, spaces and ( ) [ ] . / ' @ _ -")
    return name


def check_spec(spec: str | None, cloud: str = DEFAULT_CLOUD) -> None:
    """--image before any call to the cloud: fresh, dlami, an image id of the cloud's, or a baked image's name."""
    ids = image_ids(cloud)
    if spec is None or spec in ("fresh", "dlami") or (ids is not None and re.fullmatch(ids.pattern, spec)):
        return
    if not _NAME.fullmatch(spec):
        raise UserInputError("--image", f"{spec!r} is no image", f"fresh, dlami, {ids.words + ', ' if ids else ''}"
                             "or the name of an image you baked (`gpuprov image list`)")


def is_image_id(spec: str, cloud: str) -> bool:
    """Whether --image (or image delete's NAME|ID) names an image by the cloud's id rather than by a name."""
    ids = image_ids(cloud)
    return ids is not None and spec.startswith(ids.prefix)


def ec2_arch(plan: Plan) -> str:
    """The plan's CPU as EC2 spells an image's Architecture (x86_64, arm64): its instance type's."""
    if plan.instance is not None:
        return plan.instance.arch
    return "arm64" if plan.arch == "aarch64" else ARCH


def check_architecture(plan: Plan, image_id: str, architecture: str | None) -> None:
    """An image of another architecture than the instance type's is refused before anything is made (EC2 would
    answer InvalidParameterValue at RunInstances, after the security group)."""
    wanted = ec2_arch(plan)
    if architecture is not None and architecture != wanted:
        it = plan.instance.name if plan.instance else "the plan"
        found = CLOUDS.get(plan.request.cloud)
        source = f" ({found.arch_from})" if found and found.arch_from else ""
        raise UserInputError("--image", f"{image_id} is an {architecture} image and {it} runs {wanted}{source}",
                             f"an {wanted} image of the OS (leave --image out: gpuprov picks it), or another --gpu")


def choose(plan: Plan, spec: str | None, provider: Provider) -> ImageChoice:
    """The image for this plan. None: the newest available baked image of this owner in the region whose stack
    hash and OS match the plan, else Canonical's Ubuntu. "fresh": Ubuntu. "dlami": AWS's Deep Learning Base AMI
    (refused when its driver branch is known and differs from the plan's). An AMI id as given; a name: that
    baked image of this owner."""
    region, os_name, arch = plan.request.region, plan.request.os, ec2_arch(plan)
    check_spec(spec, provider.name)
    stack = plan_stack(plan)
    if spec == "dlami":
        return _dlami(plan, provider)
    if spec == "fresh":
        return _public(provider, region, os_name, stack, "--image fresh: every step runs", arch)
    if spec is not None and is_image_id(spec, provider.name):
        return ImageChoice(spec, "given", stack=stack)
    if spec is not None:
        named = [i for i in provider.images(region, name=spec) if i.state == "available"]
        if not named:
            raise UserInputError("--image", f"no available image called {spec!r} of yours in {region}",
                                 "`gpuprov image list` shows your images; or --image fresh")
        return _baked(named[-1], plan, stack)
    baked = [i for i in provider.images(region) if i.stack == stack and i.os == os_name and i.state == "available"
             and i.architecture in (None, arch)]
    if baked:
        return _baked(baked[-1], plan, stack)
    return _public(provider, region, os_name, stack,
                   f"no baked image of stack {stack[:12]} here (`gpuprov image bake` after this `up`)", arch)


def _public(provider: Provider, region: str, os_name: str, stack: str, note: str, arch: str = ARCH) -> ImageChoice:
    """The OS's own public image for `arch`: Canonical's for Ubuntu, else the one data/os.yaml says where to find."""
    if os_name.startswith("ubuntu-"):
        return ImageChoice(provider.image(region, os_name, arch), "ubuntu", stack=stack, note=note)
    from gpuprov.plan.oses import login_user

    return ImageChoice(provider.image(region, os_name, arch), "public", name=f"{os_name}'s public image", stack=stack,
                       note=note, user=login_user(os_name))


def _baked(image: Image, plan: Plan, stack: str) -> ImageChoice:
    if image.stack != stack:
        return ImageChoice(image.id, "baked", image.name, stack, note=f"its stack {str(image.stack)[:12]} is not "
                           f"the plan's {stack[:12]}: steps whose scripts differ run again")
    return ImageChoice(image.id, "baked", image.name, stack, tuple(install_steps(plan)),
                       "every install step is on it")


def _dlami(plan: Plan, provider: Provider) -> ImageChoice:
    facts = dlami()
    os_name, region = plan.request.os, plan.request.region
    parameter = facts.parameter_for(os_name, ec2_arch(plan))
    image_id = provider.public_image(region, parameter)
    if image_id is None:
        raise UserInputError("--image", f"no {facts.name} for {os_name} in {region} (SSM {parameter})",
                             "--image fresh, or another --region")
    driver = facts.driver.get(os_name)
    wanted = plan.stack.driver_branch if plan.stack else None
    if driver is not None and wanted is not None and int(wanted) != driver.branch:
        raise UserInputError("--image", f"the {facts.name} for {os_name} ships driver R{driver.branch} "
                             f"({driver.version}, release notes), the plan needs R{wanted}",
                             f"--driver {driver.branch} to use its driver, or --image fresh")
    if driver is None:
        note = "its driver branch is not in data/images.yaml: the driver step refuses a different branch"
    else:
        note = f"its driver R{driver.branch} ({driver.version}) is the plan's branch: the driver step finds it"
    return ImageChoice(image_id, "dlami", facts.name, plan_stack(plan), note=note)


# --- list / rm / gc --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Listed:
    image: Image
    recorded: bool  # this machine's state records it (else: another machine's, or a lost record: gc finds it)


def listing(regions: Sequence[str], provider: Provider, store: Store) -> list[Listed]:
    _resolve_intents(regions, provider, store)
    recorded = {r.cloud_id for r in store.resources(None, kind="image") if r.cloud_id}
    return [Listed(i, i.id in recorded) for region in regions for i in provider.images(region)]


def find(spec: str, regions: Sequence[str], provider: Provider) -> Image:
    """An image of this owner by id or name in these regions."""
    for region in regions:
        found = provider.images(region, ids=[spec]) if is_image_id(spec, provider.name) else \
            provider.images(region, name=spec)
        if found:
            return found[-1]
    raise UserInputError("NAME|ID", f"no image {spec!r} of yours in {', '.join(regions)}",
                         "`gpuprov image list` shows them (add --region for another region)")


def remove(image: Image, provider: Provider, store: Store, say: Say) -> list[str]:
    """Deregister the image and delete its snapshots; its record goes once EC2 accepted both. Under the image's
    lock: a bake of it at work is refused, naming who holds it."""
    with locks.hold(locks.image(image.name), "image rm", wait=False, subject=f"image {image.name!r}"):
        removed = destroy.image(provider, image.region, image.id, image.name)
    forget(store, image.region, image.id, image.name)
    for what in removed:
        say(f"  removed {what}")
    return removed


def forget(store: Store, region: str, image_id: str, name: str | None = None) -> None:
    for row in store.resources(None, region=region, kind="image"):
        if row.cloud_id == image_id or (name and row.client_token == name):
            store.deleted(row.id)


def _resolve_intents(regions: Sequence[str], provider: Provider, store: Store) -> list[tuple[int, Image]]:
    """Image records whose CreateImage answer never came (the bake died): found by name, or, past the settle
    time, never made. Returns (row id, image) of those found; their rows stay "intent" (gc collects them)."""
    found = []
    for row in store.resources(None, kind="image"):
        if row.cloud_id is not None or row.region not in regions or row.status != "intent":
            continue
        if not locks.is_free(locks.image(row.client_token or "")):
            continue  # its bake is at work (CreateImage under way): neither interrupted nor never made
        named = provider.images(row.region, name=row.client_token or "")
        if named:
            found.append((row.id, named[-1]))
        elif settle(row) <= 0:
            store.deleted(row.id)
    return found


def orphans(region: str, tagged: Sequence[CloudResource], provider: Provider, store: Store) -> list[CloudResource]:
    """Images and snapshots of this owner here that are nobody's: an image no live record names (another
    machine's lost state), an image of a bake that died before it learnt the id, a snapshot whose image is gone."""
    recorded = {r.cloud_id for r in store.resources(None, region=region, kind="image") if r.cloud_id}
    interrupted = {image.id for _row, image in _resolve_intents([region], provider, store)}
    out = []
    for res in tagged:
        if res.kind == "image" and res.id in interrupted:
            out.append(CloudResource("image", res.id, region, IMAGES, f"{res.state} | its bake was interrupted"))
        elif res.kind == "image" and res.id not in recorded:
            out.append(CloudResource("image", res.id, region, IMAGES, f"{res.state} | no local record"))
        elif res.kind == "snapshot":
            out.append(res)
    return out


def collected(store: Store, res: CloudResource) -> None:
    """gc removed this image: its records go too (by id; an interrupted bake's row by the image's name)."""
    if res.kind != "image":
        return
    forget(store, res.region, res.id, res.state.split(" | ", 1)[0])  # state: "NAME | ..." (providers/aws.py)

