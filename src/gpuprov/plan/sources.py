"""Where a node downloads from: the `sources` map, one key per kind of download, each a URL base that a mirror can
stand in for. Pure.

    nvidia             NVIDIA's CUDA repositories (apt and dnf); the layout under it is NVIDIA's own,
                       {base}/{distro}/{arch}/ (ubuntu2404/x86_64, rhel9/sbsa), as every mirror of it keeps it
    pypi               a simple index (PEP 503) the env's packages and JupyterLab come from
    torch              the PyTorch wheel index; {base}/{variant}/ (cu128) is the simple index of one build
    uv                 uv's releases, {base}/{version}/uv-{arch}-unknown-linux-musl.tar.gz (the pinned release)
    miniforge          Miniforge's releases, {base}/{version}/Miniforge3-{version}-Linux-{arch}.sh (the pinned release)
    docker             Docker's repositories ({base}/centos/docker-ce.repo, {base}/rhel/...)
    container_toolkit  NVIDIA's container toolkit repository ({base}/gpgkey, {base}/stable/deb/..., .../rpm/...)
    epel               EPEL, Fedora's layout ({base}/9/Everything/x86_64/, {base}/epel-release-latest-9.noarch.rpm,
                       {base}/RPM-GPG-KEY-EPEL-9): the driver step's DKMS on Rocky and RHEL
    conda              the conda channels' host ({base}/conda-forge): what `conda create` reads for a conda env
    ubuntu             Ubuntu's own archive (archive, security and EC2's regional copies of it), {base}/dists/...;
    ubuntu_ports       its arm64 counterpart (ports.ubuntu.com/ubuntu-ports); both optional: at their origins the
                       host's apt sources are left as the image has them
    rocky              Rocky Linux's own repositories, {base}/{release}/BaseOS/{arch}/os/ (optional, as above)
    awscli             the AWS CLI's installers, {base}/awscli-exe-linux-{arch}-{version}.zip (the pinned release): the
                       data steps' CLI when a host lacks one; at its origin the snap store installs it instead

Set, lowest first: the built-in origins (DEFAULTS), config.toml's `[sources]`, a playbook's `sources:`, then
`--sources FILE|PRESET`. Each layer sets only the keys it names: a preset without a `pypi` keeps whatever the
layers below it say. Presets ship in data/sources.yaml, each URL with the page that confirms the mirror's layout, or
marked unverified.

The templates never spell a host: every URL they fetch is `sources.rebase(ORIGIN_URL)` or a key's value, so a
rendered script holds no host that is not in the effective map (tests/test_sources.py renders every playbook for
every OS and looks). A mirror's copy of a repository file (NVIDIA's cuda-keyring list, a dnf `.repo`, the toolkit's
list) names the origin inside it; the steps rewrite that file's origin to the mirror, so apt and dnf read the
mirror, while the packages are still checked against the origin's signing keys.

A mirror cannot change what is installed: when a key is not its origin, a signing key it serves (the cuda-keyring's,
a `.repo` file's `gpgkey`, the toolkit's) is used only when its fingerprint is one data/sources.yaml pins for that
origin (`pinned_keys`, the steps' gp_pinned_key), and uv, Miniforge and (behind a mirror) the AWS CLI are pinned
releases checked by sha256 (`installers`; an `installers.yaml` in the facts folder replaces an entry whole).
`--sources FILE|PRESET` is read by spec.load_sources (a file goes through the playbooks' YAML loader).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuprov.errors import UserInputError
from gpuprov.paths import facts_dir
from gpuprov.resources import load_data

# a URL base a shell word can carry, bare or in double quotes: http(s), a host, a path, and nothing a shell or sed
# (`#`) would read
Url = Annotated[str, Field(pattern=r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%+,=@/-]*)?$",
                           max_length=2048)]


class Sources(BaseModel):
    """One layer of the map: the keys it sets (None: the layer below decides)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nvidia: Url | None = None
    pypi: Url | None = None
    torch: Url | None = None
    uv: Url | None = None
    miniforge: Url | None = None
    docker: Url | None = None
    container_toolkit: Url | None = None
    epel: Url | None = None
    conda: Url | None = None
    awscli: Url | None = None
    ubuntu: Url | None = None
    ubuntu_ports: Url | None = None
    rocky: Url | None = None

    @field_validator("*")
    @classmethod
    def _no_trailing_slash(cls, value: str | None) -> str | None:
        return value.rstrip("/") if value else value


KEYS = tuple(Sources.model_fields)

# the origins: what every step fetched before there was a map, and what it fetches when nothing is set
DEFAULTS = Sources(
    nvidia="https://developer.download.nvidia.com/compute/cuda/repos",
    pypi="https://pypi.org/simple",
    torch="https://download.pytorch.org/whl",
    uv="https://github.com/astral-sh/uv/releases/download",
    miniforge="https://github.com/conda-forge/miniforge/releases/download",
    docker="https://download.docker.com/linux",
    container_toolkit="https://nvidia.github.io/libnvidia-container",
    epel="https://dl.fedoraproject.org/pub/epel",
    conda="https://conda.anaconda.org",
    awscli="https://awscli.amazonaws.com",
    ubuntu="http://archive.ubuntu.com/ubuntu",
    ubuntu_ports="http://ports.ubuntu.com/ubuntu-ports",
    rocky="https://dl.rockylinux.org/pub/rocky",
)

# which keys each step's downloads come from (plan shows them): fabric-manager and cuda-toolkit install from the
# repository the driver step sets up; EPEL only where the OS takes DKMS from it, conda only for a conda env, the OS's
# own archive (optional) on the steps that install the OS's packages, only when set and on its distribution
OS_KEYS = ("ubuntu", "ubuntu_ports", "rocky")
STEP_KEYS: dict[str, tuple[str, ...]] = {
    "kernel-headers": OS_KEYS,
    "nvidia-driver": ("nvidia", "epel", *OS_KEYS),
    "fabric-manager": ("nvidia",),
    "cuda-toolkit": ("nvidia",),
    "python-env": ("uv", "miniforge", "conda"),
    "pytorch": ("torch",),
    "packages": ("pypi",),
    "jupyter": ("pypi",),
    "docker": ("docker", "container_toolkit", *OS_KEYS),
    "data-fetch": ("awscli",),
    "data-save": ("awscli",),
}


@dataclass(frozen=True)
class Effective:
    """The map in effect: each key's URL and where it was set (`default`, the config file, the playbook's line,
    `--sources NAME`)."""

    urls: dict[str, str]
    origins: dict[str, str]
    offline: str | None = None  # an offline bundle's folder on the host (plan/offline.py): no Python index at all

    def __getattr__(self, key: str) -> str:
        # the templates read `sources.pypi`; a key that is not in the map is a bug in a template, not a user's
        try:
            return str(self.__dict__["urls"][key])
        except KeyError:
            raise AttributeError(key) from None

    def rebase(self, url: str) -> str:
        """`url` (an origin's, as the facts spell it) as the map serves it: the origin's base swapped for its key's."""
        for key in KEYS:
            origin = getattr(DEFAULTS, key)
            if url == origin or url.startswith(origin + "/"):
                return self.urls[key] + url[len(origin):]
        return url

    @staticmethod
    def origin(key: str) -> str:
        return str(getattr(DEFAULTS, key))

    @property
    def keys(self) -> dict[str, tuple[str, ...]]:
        """The signing keys a mirror's copy must carry (the origins'), per key of the map."""
        return pinned_keys()

    @property
    def installers(self) -> dict[str, Installer]:
        """The installers pinned by release and sha256 (data/sources.yaml)."""
        return installers()

    @property
    def mirrored(self) -> tuple[str, ...]:
        """The keys that are not their origin."""
        return tuple(k for k in KEYS if self.urls[k] != getattr(DEFAULTS, k))

    @property
    def plain_http_hosts(self) -> tuple[str, ...]:
        """The hosts of the Python indexes (pypi, torch) given as http://, which pip must be told to trust."""
        return tuple(sorted({self.urls[k].split("/")[2].split(":")[0] for k in ("pypi", "torch")
                             if self.urls[k].startswith("http://")}))

    def hosts(self) -> set[str]:
        return {u.split("/")[2].split(":")[0] for u in self.urls.values()}

    def os_key_applies(self, key: str, os_name: str, cpu_arch: str) -> bool:
        """An OS archive key (OS_KEYS) is read only when set and only on its distribution (ports: arm64 Ubuntu)."""
        if key not in self.mirrored:
            return False
        if key == "rocky":
            return os_name.startswith("rocky-")
        return os_name.startswith("ubuntu-") and (key == "ubuntu_ports") == (cpu_arch == "aarch64")

    def for_step(self, step: str) -> tuple[tuple[str, str, str], ...]:
        """(key, URL, where set) of each source the step `step` downloads from."""
        return tuple((k, self.urls[k], self.origins[k]) for k in STEP_KEYS.get(step, ()))


def effective(*layers: tuple[Sources | None, str]) -> Effective:
    """The map from `layers` (lowest first, each with where it was set) over the origins."""
    urls = {k: str(getattr(DEFAULTS, k)) for k in KEYS}
    origins = dict.fromkeys(KEYS, "default")
    for layer, where in layers:
        if layer is None:
            continue
        for key in KEYS:
            value = getattr(layer, key)
            if value is not None:
                urls[key], origins[key] = value, where
    return Effective(urls, origins)


ORIGIN = effective()


class _Preset(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    description: str
    urls: Sources
    # key -> the page that confirms the mirror keeps the origin's layout there, or "unverified: why"
    verified: dict[str, str]


@cache
def presets() -> dict[str, _Preset]:
    data: dict[str, Any] = load_data("sources.yaml")
    out = {name: _Preset.model_validate(p) for name, p in data["presets"].items()}
    for name, p in out.items():
        unsourced = [k for k in KEYS if getattr(p.urls, k) and k not in p.verified]
        if unsourced:  # shipped data: a bug, caught by the tests
            raise ValueError(f"sources.yaml: {name}: no `verified` for {', '.join(unsourced)}")
    return out


# The preset a node of a cloud downloads through when neither --sources, a playbook's `sources:` nor config.toml's
# [sources] names a map: on Alibaba Cloud its internal mirror for VPC instances (gpuprov launches into a VPC), which
# spends no public bandwidth. A map the user names replaces it whole.
CLOUD_DEFAULTS = {"alibaba": ("cn-aliyun-vpc", "Alibaba Cloud")}
# `--sources origins`: a map that sets no key, so every download comes from its origin, a cloud's default mirror too
ORIGINS = "origins"


def cloud_default(cloud: str) -> tuple[Sources, str] | None:
    """The default layer of a node on `cloud` (with where it was set), or None: the origins."""
    if cloud not in CLOUD_DEFAULTS:
        return None
    name, title = CLOUD_DEFAULTS[cloud]
    return presets()[name].urls, f"{name} (the default on {title})"


@cache
def pinned_keys() -> dict[str, tuple[str, ...]]:
    """The origins' signing keys (primary key fingerprints) per key of the map, as data/sources.yaml pins them."""
    data: dict[str, Any] = load_data("sources.yaml")
    return {key: tuple(str(f).upper() for f in entry["fingerprints"]) for key, entry in data["keys"].items()}


class Installer(BaseModel):
    """An installer pinned by release and sha256 per CPU architecture (`uname -m`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str
    sha256: dict[str, Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]]
    source: str


@cache
def _shipped_installers() -> dict[str, Installer]:
    data: dict[str, Any] = load_data("sources.yaml")
    return {key: Installer.model_validate(entry) for key, entry in data["installers"].items()}


def installers() -> dict[str, Installer]:
    """The pinned installers: the shipped ones, each replaced whole by the facts folder's `installers.yaml` when it
    names it (a newer release with its sums; a bad file is bad input naming it)."""
    shipped = _shipped_installers()
    path = facts_dir() / "installers.yaml"
    if not path.is_file():
        return shipped
    hint = "keys: " + ", ".join(shipped) + "; each with version, sha256 (per `uname -m`) and source; or delete the file"
    try:
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict):
            raise UserInputError(str(path), "is not a mapping of installers", hint)
        unknown = sorted(set(data) - set(shipped))
        if unknown:
            raise UserInputError(str(path), f"{', '.join(unknown)} is not a pinned installer", hint)
    except (OSError, yaml.YAMLError) as exc:
        raise UserInputError(str(path), f"cannot read it: {exc}", hint) from None
    out = dict(shipped)
    for key, entry in data.items():
        try:
            out[key] = Installer.model_validate(entry)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in (key, *err["loc"]))
            raise UserInputError(f"{path}: {where}", err["msg"], hint) from None
    return out


def check(data: Any, where: str) -> Sources:
    """A `[sources]` table (config.toml) or `sources:` mapping as one layer; a bad key or URL names `where`."""
    try:
        return Sources.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise UserInputError(where, f"{key}: {msg}", f"keys: {', '.join(KEYS)}; each an http(s) URL") from None
