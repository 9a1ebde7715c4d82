"""Baked images and Deep Learning AMIs: skip on a new node what an image already holds (issue 12).

The stack hash names what a node's install steps are: the sha256 of the (name, sha256) of every
install step script (kinds stack, env, user) of its bundle, in order. Guard steps (per node: TTL,
autostop, spot watch) and verify (always runs) are left out. The hash of a plan and the hash of
the bundle a node ran are computed the same way, so an image matches a plan exactly when every
step the plan would run is already on the image, marker and all: those steps find their markers
and do nothing.

bake: read the node's bundle manifest and markers (every install step must have its marker) ->
clean-up step over SSH (host keys, gpuprov's authorized key, guards, logs, cloud-init instance
data; the markers stay) -> record the image by name -> CreateImage (tagged: stack, OS, owner, the
source node) -> wait until available. CreateImage has no ClientToken; EC2 requires an image name
to be unique per account and region, so the recorded name finds an image whose answer was lost.

Images outlive nodes: `down` leaves them (their gpuprov:node is IMAGES, never a node's name);
`image rm` deregisters one and deletes its snapshots; `gc` collects images tagged as this
owner's that no local record names, images of a bake that died before it learnt the id, and
snapshots whose image is gone.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from gpuprov.cloud.providers.base import IMAGES, CloudResource, Image, ImageRequest, Provider
from gpuprov.cloud.settle import SETTLE_SECONDS, settle
from gpuprov.errors import GpuprovError, UserInputError

if TYPE_CHECKING:
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.plan.inventory import Target
    from gpuprov.plan.plan import Plan
    from gpuprov.state import Store

Say = Callable[[str], None]
ARCH = "x86_64"  # gpuprov launches amd64 Ubuntu only (providers/aws.py `image`); an image must match it
INSTALL_KINDS = ("stack", "env", "user")
GUARD_STEPS = ("autostop", "ttl", "spot-interrupt")  # plan.guard_steps' names
GUARD_UNITS = ("gpuprov-autostop.timer", "gpuprov-autostop.service", "gpuprov-ttl.timer", "gpuprov-ttl.service",
               "gpuprov-interrupt.service")
AWS_DLAMI_PREFIX = "/aws/service/deeplearning"
BUNDLE_DIR = "/var/lib/gpuprov/bundle"
MARKER_DIR = "/var/lib/gpuprov/markers"
WAIT_SECONDS = 3600.0  # an AMI of a 100 GB root volume can take tens of minutes
_NAME = re.compile(r"[A-Za-z0-9()\[\] ./'@_-]{3,128}")  # EC2's rule for an image name (CreateImage, Name)
Source = Literal["baked", "ubuntu", "dlami", "given"]


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
        import os

        name = self.parameter.format(arch=arch, os=os_name)
        prefix = os.environ.get("GPUPROV_DLAMI_SSM_PREFIX")  # tests: moto refuses names under /aws/
        return prefix + name.removeprefix(AWS_DLAMI_PREFIX) if prefix else name


def dlami() -> Dlami:
    import yaml

    from gpuprov.resources import data_file

    with data_file("images.yaml").open() as f:
        return Dlami.model_validate(yaml.safe_load(f)["dlami"])


# --- which image `up` launches -------------------------------------------------------------------


@dataclass(frozen=True)
class ImageChoice:
    image_id: str | None  # None: not looked up (offline plan)
    source: Source
    name: str | None = None
    stack: str = ""
    on_image: tuple[str, ...] = ()  # install steps the image already holds (their markers match)
    note: str = ""

    def line(self) -> str:
        what = {"baked": f"baked image {self.name} ({self.image_id}, stack {self.stack[:12]})",
                "ubuntu": f"Canonical's Ubuntu ({self.image_id})",
                "dlami": f"{self.name} ({self.image_id})",
                "given": f"{self.image_id}"}[self.source]
        return f"image: {what}" + (f"; {self.note}" if self.note else "")

    def summary(self, plan: Plan) -> dict[str, object]:
        steps = install_steps(plan)
        return {"source": self.source, "id": self.image_id, "name": self.name, "stack": self.stack,
                "steps_on_image": list(self.on_image), "steps_to_run": [s for s in steps if s not in self.on_image],
                "note": self.note}


def check_spec(spec: str | None) -> None:
    """--image before any AWS call: fresh, dlami, an AMI id, or a baked image's name."""
    if spec is None or spec in ("fresh", "dlami") or re.fullmatch(r"ami-[0-9a-f]{8,17}", spec):
        return
    if not _NAME.fullmatch(spec):
        raise UserInputError("--image", f"{spec!r} is no image", "fresh, dlami, an AMI id (ami-...), or the name "
                             "of an image you baked (`gpuprov image list`)")


def choose(plan: Plan, spec: str | None, provider: Provider) -> ImageChoice:
    """The image for this plan. None: the newest available baked image of this owner in the region whose stack
    hash and OS match the plan, else Canonical's Ubuntu. "fresh": Ubuntu. "dlami": AWS's Deep Learning Base AMI
    (refused when its driver branch is known and differs from the plan's). An AMI id as given; a name: that
    baked image of this owner."""
    region, os_name = plan.request.region, plan.request.os
    check_spec(spec)
    stack = plan_stack(plan)
    if spec == "dlami":
        return _dlami(plan, provider)
    if spec == "fresh":
        return ImageChoice(provider.image(region, os_name), "ubuntu", stack=stack, note="--image fresh: every step runs")
    if spec is not None and spec.startswith("ami-"):
        return ImageChoice(spec, "given", stack=stack)
    if spec is not None:
        named = [i for i in provider.images(region, name=spec) if i.state == "available"]
        if not named:
            raise UserInputError("--image", f"no available image called {spec!r} of yours in {region}",
                                 "`gpuprov image list` shows your images; or --image fresh")
        return _baked(named[-1], plan, stack)
    baked = [i for i in provider.images(region) if i.stack == stack and i.os == os_name and i.state == "available"
             and i.architecture in (None, ARCH)]
    if baked:
        return _baked(baked[-1], plan, stack)
    return ImageChoice(provider.image(region, os_name), "ubuntu", stack=stack,
                       note=f"no baked image of stack {stack[:12]} here (`gpuprov image bake` after this `up`)")


def _baked(image: Image, plan: Plan, stack: str) -> ImageChoice:
    if image.stack != stack:
        return ImageChoice(image.id, "baked", image.name, stack, note=f"its stack {str(image.stack)[:12]} is not "
                           f"the plan's {stack[:12]}: steps whose scripts differ run again")
    return ImageChoice(image.id, "baked", image.name, stack, tuple(install_steps(plan)),
                       "every install step is on it")


def _dlami(plan: Plan, provider: Provider) -> ImageChoice:
    facts = dlami()
    os_name, region = plan.request.os, plan.request.region
    parameter = facts.parameter_for(os_name)
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


# --- bake ----------------------------------------------------------------------------------------


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise UserInputError("--name", f"{name!r} is not an image name",
                             "3-128 letters, digits, spaces and ( ) [ ] . / ' @ _ -")
    return name


def bake(node_name: str, store: Store, provider: Provider, target: Target, settings: HostSettings, say: Say,
         name: str | None = None, wait: float = WAIT_SECONDS) -> Image:
    """Clean the node of what is its own, then make an image of it; returns the image once available."""
    from gpuprov.hosts.remote import Remote

    node = store.node(node_name)
    if node.state != "ready":
        raise UserInputError("NODE", f"{node_name} is {node.state}", "bake a node that is ready (`gpuprov status`)")
    image_name = check_name(name or f"gpuprov-{node_name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    instances = [r.cloud_id for r in store.resources(node_name, region=node.region, kind="instance") if r.cloud_id]
    if not instances:
        raise GpuprovError(f"{node_name} has no recorded instance")
    if [r for r in store.resources(None, region=node.region, kind="image") if r.client_token == image_name] or \
            provider.images(node.region, name=image_name):
        raise UserInputError("--name", f"an image called {image_name!r} exists in {node.region}",
                             "pick another --name, or `gpuprov image rm` it first")
    remote = Remote(target, settings)
    remote.open()
    try:
        stack, steps = _installed(remote, node_name)
        say(f"{node_name}: {len(steps)} install steps on it ({', '.join(steps)}), stack {stack[:12]}")
        _clean(remote, node_name, node.region, node.ssh_user or "ubuntu")
        say(f"{node_name}: host keys, gpuprov's authorized key, guards, logs and cloud-init data removed; "
            "markers kept")
    finally:
        remote.close()
    os_name = str(node.plan.get("os") or "ubuntu-24.04")
    rid = store.intend(None, "image", node.region, image_name)
    store.event(node_name, "bake", f"CreateImage {image_name} (stack {stack[:12]})")
    image_id = provider.create_image(ImageRequest(
        region=node.region, instance_id=instances[-1], name=image_name, source_node=node_name, stack=stack,
        os=os_name, description=f"gpuprov: {', '.join(steps)} (stack {stack[:12]}, {os_name})"))
    store.created(rid, image_id)
    say(f"CreateImage {image_id} ({image_name}): EC2 stops {node_name}, snapshots its disk and starts it again")
    image = provider.wait_image(node.region, image_id, timeout=wait, settle=SETTLE_SECONDS,
                                progress=_progress(say, image_id))
    store.event(node_name, "baked", f"{image_id} {image_name} available")
    return image


def _installed(remote: object, node_name: str) -> tuple[str, list[str]]:
    """The stack hash of the bundle the node ran, refusing a node whose install steps lack their markers."""
    out = remote.run(  # type: ignore[attr-defined]
        f"cat {BUNDLE_DIR}/manifest.json && echo GPUPROV_MARKERS && for f in {MARKER_DIR}/*.sha256; do "
        "[ -e \"$f\" ] && printf '%s %s\\n' \"$(basename \"$f\" .sha256)\" \"$(cat \"$f\")\"; done; true", sudo=True)
    text, _, marks = out.stdout.partition("GPUPROV_MARKERS")
    try:
        manifest = json.loads(text)["steps"]
    except (ValueError, KeyError, TypeError):
        raise GpuprovError(f"{node_name} has no gpuprov bundle ({BUNDLE_DIR}/manifest.json): was it bootstrapped?") \
            from None
    markers = dict(line.split(" ", 1) for line in marks.strip().splitlines() if " " in line)
    steps = [(str(s["name"]), str(s["kind"]), str(s["sha256"])) for s in manifest]
    missing = [n for n, kind, sha in steps if kind in INSTALL_KINDS and markers.get(n, "").strip() != sha]
    if missing:
        raise GpuprovError(f"{node_name}: {', '.join(missing)} did not finish (no marker for the script it has); "
                           "an image of it would not skip them: rerun its bootstrap first")
    return stack_hash(steps), [n for n, kind, _ in steps if kind in INSTALL_KINDS]


def _clean(remote: object, node_name: str, region: str, ssh_user: str) -> None:
    from gpuprov.cloud import keys
    from gpuprov.cloud.tags import owner
    from gpuprov.paths import keys_dir
    from gpuprov.plan.render import StepPlan, render_steps

    blob = keys.local_key(keys_dir(), region, owner()).public.split()[1]
    step = StepPlan("image-clean", "image_clean.sh.j2", "guard", "remove node-specific state before an image",
                    (("key_blob", blob), ("ssh_user", ssh_user), ("guard_units", GUARD_UNITS),
                     ("guard_steps", GUARD_STEPS)))
    (script,) = render_steps((step,), {}, {}).scripts
    path = f"/tmp/gpuprov-image-clean-{uuid.uuid4().hex[:12]}.sh"
    remote.put_bytes(script.text.encode(), path)  # type: ignore[attr-defined]
    result = remote.run(f"bash {shlex.quote(path)}; rc=$?; rm -f {shlex.quote(path)}; exit $rc",  # type: ignore[attr-defined]
                        sudo=True)
    if not result.ok or "GPUPROV_RESULT=" not in result.stdout:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise GpuprovError(f"{node_name}: the clean-up before the image failed (exit {result.exited}): {tail}")


def _progress(say: Say, image_id: str) -> Callable[[Image, float], None]:
    last: dict[str, object] = {"state": None, "at": 0.0}

    def show(image: Image, waited: float) -> None:
        if image.state != last["state"] or waited - float(last["at"] or 0.0) >= 30:  # type: ignore[arg-type]
            say(f"  {image_id}: {image.state} ({waited:.0f}s)")
            last.update(state=image.state, at=waited)

    return show


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
        found = provider.images(region, ids=[spec]) if spec.startswith("ami-") else provider.images(region, name=spec)
        if found:
            return found[-1]
    raise UserInputError("NAME|ID", f"no image {spec!r} of yours in {', '.join(regions)}",
                         "`gpuprov image list` shows them (add --region for another region)")


def remove(image: Image, provider: Provider, store: Store, say: Say) -> list[str]:
    """Deregister the image and delete its snapshots; its record goes once EC2 accepted both."""
    removed = provider.delete_image(image.region, image.id)
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

