"""Where a node downloads from: the `sources` map, one key per kind of download, each a URL base that a mirror can
stand in for. Pure.

    nvidia             NVIDIA's CUDA repositories (apt and dnf); the layout under it is NVIDIA's own,
                       {base}/{distro}/{arch}/ (ubuntu2404/x86_64, rhel9/sbsa), as every mirror of it keeps it
    pypi               a simple index (PEP 503) the env's packages and JupyterLab come from
    torch              the PyTorch wheel index; {base}/{variant}/ (cu128) is the simple index of one build
    uv                 the uv installer script
    miniforge          Miniforge's releases, {base}/{version}/Miniforge3-{version}-Linux-{arch}.sh (the pinned release)
    docker             Docker's repositories ({base}/centos/docker-ce.repo, {base}/rhel/...)
    container_toolkit  NVIDIA's container toolkit repository ({base}/gpgkey, {base}/stable/deb/..., .../rpm/...)

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
origin (`pinned_keys`, the steps' gp_pinned_key), and Miniforge is a pinned release checked by sha256 (`installers`).
`--sources FILE|PRESET` is read by spec.load_sources (a file goes through the playbooks' YAML loader).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuprov.errors import UserInputError
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
    uv="https://astral.sh/uv/install.sh",
    miniforge="https://github.com/conda-forge/miniforge/releases/download",
    docker="https://download.docker.com/linux",
    container_toolkit="https://nvidia.github.io/libnvidia-container",
)

# which keys each step's downloads come from (plan shows them): fabric-manager and cuda-toolkit install from the
# repository the driver step sets up
STEP_KEYS: dict[str, tuple[str, ...]] = {
    "nvidia-driver": ("nvidia",),
    "fabric-manager": ("nvidia",),
    "cuda-toolkit": ("nvidia",),
    "python-env": ("uv", "miniforge"),
    "pytorch": ("torch",),
    "packages": ("pypi",),
    "jupyter": ("pypi",),
    "docker": ("docker", "container_toolkit"),
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
def installers() -> dict[str, Installer]:
    data: dict[str, Any] = load_data("sources.yaml")
    return {key: Installer.model_validate(entry) for key, entry in data["installers"].items()}


def check(data: Any, where: str) -> Sources:
    """A `[sources]` table (config.toml) or `sources:` mapping as one layer; a bad key or URL names `where`."""
    try:
        return Sources.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise UserInputError(where, f"{key}: {msg}", f"keys: {', '.join(KEYS)}; each an http(s) URL") from None
