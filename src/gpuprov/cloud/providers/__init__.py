"""Cloud providers behind one small protocol (base.py); one module per backend, SDKs imported lazily.

A provider makes and removes machines and knows nothing of the records or SSH (import-linter's
`providers-know-no-state`): cloud/ decides, records, and asks. base.py is the core every cloud implements;
capabilities.py the capabilities some declare (cluster placement, an RDMA fabric, static addresses, instance roles,
reservations and blocks, object storage, image copy, stop modes, live offers, a role for the guards' stop), each
asked for through `capabilities.need`.
boto3 is imported here only (and by state/s3.py for the team's bucket). aws.py composes aws_base.py (clients, the
one error path), aws_instances.py and aws_images.py; aws_refusals.py is the table of what each launch refusal
means; aws_iam.py and aws_capacity.py make the IAM and capacity calls; aws_region.py is the AWS CLI's region chain
and AWS's endpoint when it is on this machine, and aws_efa.py AWS's EFA layout and installer, both with no SDK.
Alibaba Cloud ECS, through its own SDK:
alibaba.py on alibaba_base.py (the client, the one error path) and alibaba_images.py; alibaba_ram.py the RAM
role a node's guards stop it with, through RAM's own SDK;
alibaba_refusals.py is what each launch refusal means (the GPU families' documented facts are data, read by
plan/catalog_alibaba.py).

`CLOUDS` is the registry: a cloud's name (what `--cloud` takes and what a node records) to the module and class
that implement it, imported only when a command makes one (`make`), and its name as people write it (`title`);
beside them, what cloud/ reads of a cloud without making one, so that cloud/ names none: its service as its rules
name it (`service`), how its image ids look (`image_ids`), and its endpoint when that is on this machine
(`local_endpoint`, from a module of its own with no SDK).
A cloud whose module is not installed is refused by name, in one line.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuprov.errors import UserInputError

if TYPE_CHECKING:
    from gpuprov.cloud.providers.base import Provider


@dataclass(frozen=True)
class Cloud:
    module: str
    cls: str
    title: str  # as people write it, in messages
    service: str = ""  # its machines' service, as the cloud names it in its own rules ("EC2 cannot stop …")
    # False: the provider is here and tested against its imitation, but up and gc do not use it yet; a command that
    # would is refused by name (`unlaunched`)
    launches: bool = True
    # plan and render plan its nodes on its own catalog (plan/plan.py catalog_for), never on another cloud's
    plans: bool = True
    # its provider declares SPOT_STOP (every spot instance stops, its disk kept): what `status` says of a record
    # without importing the cloud's SDK (tests/test_alibaba_lifecycle.py holds the two together)
    spot_stops: bool = False
    # a module of its own, with no SDK, whose `local_endpoint()` says where its calls go when that is on this
    # machine (a local imitation, whose public addresses are made up); "": gpuprov reads none for it
    local: str = ""
    images: ImageIds | None = None  # how its image ids look, where --image may give one
    arch_from: str = ""  # where its instance types' CPU architectures are read, as a refusal names it


@dataclass(frozen=True)
class ImageIds:
    """How a cloud's image ids look: what --image is held to before anything is asked, and how a hint names one."""

    prefix: str  # an --image that starts so is an id, not a baked image's name
    pattern: str  # the whole id (a regular expression)
    words: str  # a hint's name for one: "an AMI id (ami-...)"


CLOUDS: dict[str, Cloud] = {
    "aws": Cloud("gpuprov.cloud.providers.aws", "AwsProvider", "AWS", "EC2", local="gpuprov.cloud.providers.aws_region",
                 images=ImageIds("ami-", r"ami-[0-9a-f]{8,17}", "an AMI id (ami-...)"),
                 arch_from="EC2's ProcessorInfo.SupportedArchitectures"),
    "alibaba": Cloud("gpuprov.cloud.providers.alibaba", "AlibabaProvider", "Alibaba Cloud", "ECS", spot_stops=True),
}
DEFAULT = "aws"


def title(name: str) -> str:
    """A cloud's name as people write it (its own name when it is not registered)."""
    found = CLOUDS.get(name)
    return found.title if found else name


def service(name: str) -> str:
    """A cloud's machines' service as the cloud names it (EC2, ECS); its title when it is not registered."""
    found = CLOUDS.get(name)
    return found.service if found and found.service else title(name)


def local_endpoint() -> tuple[str, str] | None:
    """(the cloud's title, the URL) of the first cloud whose calls go to an endpoint on this machine (moto, `make
    sandbox`); None when each goes to its cloud. Read from the environment alone, no provider made."""
    for cloud in CLOUDS.values():
        url = importlib.import_module(cloud.local).local_endpoint() if cloud.local else None
        if url:
            return cloud.title, str(url)
    return None


def image_ids(name: str) -> ImageIds | None:
    """How cloud `name`'s image ids look (None: it takes no image id by --image yet)."""
    found = CLOUDS.get(name)
    return found.images if found else None


def unlaunched(name: str, field: str, *, planning: bool = False) -> None:
    """Refuse a cloud whose machines gpuprov does not launch or collect yet, naming what it does offer; `planning`:
    the command only plans offline (plan, render), which a cloud that `plans` lets through."""
    found = CLOUDS.get(name)
    if found is None or (found.plans if planning else found.launches):
        return
    offers = f"`gpuprov plan --cloud {name}` plans on its catalog, " if found.plans else ""
    raise UserInputError(field, f"gpuprov does not launch {found.title} machines yet; nothing was asked of it",
                         f"{offers}`gpuprov gpus --cloud {name}` lists its GPU types; a machine made in its console: "
                         "`gpuprov bootstrap USER@HOST`")


def make(name: str, owner: str, *, field: str = "--cloud", poll: float = 2.0, legacy: str | None = None,
         team: dict[str, str] | None = None) -> Provider:
    """The provider of cloud `name`, its module imported now; an unknown cloud, or one whose module is not
    installed, is one line naming `field` (where the name came from)."""
    found = CLOUDS.get(name)
    if found is None:
        raise UserInputError(field, f"no cloud {name!r}", f"clouds: {', '.join(CLOUDS)}")
    unlaunched(name, field)
    try:
        module = importlib.import_module(found.module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not found.module.startswith(exc.name):
            raise  # the provider's own module is there: something it imports is missing (a bug, said as one)
        raise UserInputError(field, f"{found.title} is not in this gpuprov install yet",
                             f"clouds here: {', '.join(n for n in CLOUDS if _present(n))}") from None
    made: Provider = getattr(module, found.cls)(owner, poll=poll, legacy=legacy, team=team)
    return made


def _present(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(CLOUDS[name].module) is not None
    except ModuleNotFoundError:
        return False
