"""What users write: playbooks (and, later, inventories) as pydantic models, with every
validation error turned into one short message naming the file, line and field.

A playbook is data, not code. The only fields whose text reaches a shell as a command are the
ones named `run` and `on_interrupt` (the spot-interruption hook); everything else is quoted by the
renderer or rejected here.

User files (playbooks, inventories) are read by `read_text_file`: at most 1 MiB, UTF-8 (BOM or not) or UTF-16
with a BOM, no NULs. Parsing composes the YAML node graph first and refuses alias loops, more than 100,000 values
after alias expansion ("billion laughs") and nesting past 64, before anything is constructed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from gpuprov.errors import UserInputError
from gpuprov.plan import sources
from gpuprov.plan.data import DataSpec
from gpuprov.plan.sources import Sources
from gpuprov.plan.stack import StackPins
from gpuprov.resources import playbooks_dir

StepName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,47}$")]
# A PEP 508 requirement without markers or URLs: name, optional extras, optional version clauses.
_VERSION_CLAUSE = r"[<>=!~]=?[A-Za-z0-9.*+!_-]+"
_REQUIREMENT = re.compile(
    rf"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?({_VERSION_CLAUSE}(,{_VERSION_CLAUSE})*)?$"
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileSpec(_Model):
    """A file the step writes on the host. Its content is written verbatim, never executed."""

    path: Annotated[str, Field(pattern=r"^/[^\x00\n]*$", max_length=4096)]
    content: str
    mode: Annotated[str, Field(pattern=r"^0?[0-7]{3,4}$")] = "0644"

    @field_validator("path")
    @classmethod
    def _no_dot_dot(cls, value: str) -> str:
        if ".." in value.split("/"):
            raise ValueError(f"{value!r}: a file path must not contain '..' components")
        return value


class StepSpec(_Model):
    """A playbook's own step: a shell command (`run`), files to write (`files`), or both.

    `run` is a command by definition and runs as written (as root, in bash with errexit).
    `creates`, when given, makes the step idempotent: it is skipped once that path exists.
    """

    name: StepName
    run: str | None = None
    files: tuple[FileSpec, ...] = ()
    creates: Annotated[str | None, Field(pattern=r"^/[^\x00\n]*$")] = None

    @model_validator(mode="after")
    def _has_work(self) -> StepSpec:
        if self.run is None and not self.files:
            raise ValueError("a step needs `run` or `files`")
        return self


class EnvSpec(_Model):
    """The Python environment PyTorch and the extra packages go into."""

    manager: Literal["uv", "conda"] = "uv"
    path: Annotated[str, Field(pattern=r"^/[A-Za-z0-9._/-]+$")] = "/opt/gpuprov/env"
    packages: tuple[str, ...] = ()

    @field_validator("packages")
    @classmethod
    def _requirements(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for req in value:
            if not _REQUIREMENT.fullmatch(req):
                raise ValueError(f"{req!r} is not a package requirement (e.g. 'transformers>=4.40')")
        return value


# NAME[:TAG]@sha256:<64 hex>: an image reference pinned by digest, as `docker run` takes it
PINNED_IMAGE = re.compile(r"[a-z0-9]+(?:[._/-][a-z0-9]+)*(?::\w[\w.-]{0,127})?@sha256:[0-9a-f]{64}")


class Playbook(_Model):
    """A recipe: the GPU stack (or none), a Python env, and extra steps, in that order."""

    name: StepName
    description: str = ""
    stack: Literal["gpu", "none"] = "gpu"
    torch: bool = True  # install PyTorch into the env (only with stack: gpu)
    cuda_toolkit: bool = False  # install the CUDA toolkit (nvcc) matching the torch wheel
    # install: gpuprov installs and holds the driver; keep: the host's own driver is used as it is (a rented box,
    # a shared server: `bootstrap --keep-driver`), torch chosen to run on it (plan/kept.py)
    driver: Literal["install", "keep"] = "install"
    # Docker with NVIDIA's container toolkit (the docker step, plan/docker.py); verify runs nvidia-smi -L in
    # container_image (NAME:TAG@sha256:…, pinned by digest; default: data/docker.yaml's)
    docker: bool = False
    container_image: Annotated[str | None, Field(min_length=1, max_length=512)] = None
    pins: StackPins = StackPins()
    env: EnvSpec | None = EnvSpec()
    # datasets fetched from S3 before `steps`, checkpoints saved to S3 at an interruption, a shutdown, `down`
    data: tuple[DataSpec, ...] = ()
    steps: tuple[StepSpec, ...] = ()
    jupyter: bool = False  # JupyterLab from the env, on 127.0.0.1:8888 with a token, as a service
    # A command (like `run`) the node runs once when EC2 announces a spot interruption (2 minutes ahead).
    on_interrupt: Annotated[str | None, Field(min_length=1, max_length=65536)] = None
    # GPU and node metrics for Prometheus (`--metrics`): true (DCGM's exporter where NVIDIA packages DCGM for
    # the OS, else nvidia-smi into a textfile), dcgm, textfile, or false; the health watch comes with them
    metrics: Literal["off", "auto", "dcgm", "textfile"] = "off"
    # where the node downloads from (plan/sources.py): over config.toml's [sources], under --sources
    sources: Sources | None = None

    @field_validator("metrics", mode="before")
    @classmethod
    def _metrics_flag(cls, value: object) -> object:
        return {True: "auto", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _consistent(self) -> Playbook:
        if self.stack == "none" and (self.pins != StackPins() or self.cuda_toolkit or self.driver == "keep" or self.docker):
            raise ValueError("`pins`, `cuda_toolkit`, `driver: keep` and `docker` need `stack: gpu`")
        if self.container_image is not None:
            if not self.docker:
                raise ValueError("`container_image` needs `docker: true`")
            if not PINNED_IMAGE.fullmatch(self.container_image):
                raise ValueError(f"container_image {self.container_image!r} is not pinned by digest "
                                 "(NAME:TAG@sha256:<64 hex digits>)")
        names = [s.name for s in self.steps]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"step names must be unique: {', '.join(sorted(dupes))}")
        if self.jupyter and (self.env is None or "jupyter" in names):
            raise ValueError("`jupyter: true` needs an `env` (JupyterLab goes into it) and no own step named jupyter")
        return self

    @property
    def installs_torch(self) -> bool:
        return self.stack == "gpu" and self.torch and self.env is not None

    # where the playbook was read from, and each field's line: an error about a value that came from the
    # file (a pin, say) names `pb.yml:7: pins.driver`, not the flag the user never typed
    _source: str = PrivateAttr("")
    _lines: dict[tuple[Any, ...], int] = PrivateAttr(default_factory=dict)

    def where(self, *path: str) -> str | None:
        """`FILE:LINE: a.b` for the field at `path`, when this playbook came from a file that sets it."""
        if not self._source or tuple(path) not in self._lines:
            return None
        return f"{self._source}:{self._lines[tuple(path)]}: {'.'.join(path)}"


# --- durations (--autostop, --ttl) --------------------------------------------------------------

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
MIN_DURATION_S = 60  # the guard timers tick once a minute
MAX_DURATION_S = 90 * 86400


def parse_duration(text: str | None, flag: str, *, allow_off: bool = True) -> int | None:
    """'30m', '2h', '1h30m', '1d', '90s' -> seconds; 'off' (or None) -> None. Anything else is a
    UserInputError naming `flag` (exit 2)."""
    if text is None:
        return None
    value = text.strip().lower()
    if value in ("off", "none", "no") and allow_off:
        return None
    match = _DURATION.fullmatch(value)
    if not value or not match or not any(match.groups()):
        raise UserInputError(flag, f"{text!r} is not a duration",
                             "e.g. 30m, 2h, 1h30m, 1d" + (", or off" if allow_off else ""))
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    total = days * 86400 + hours * 3600 + minutes * 60 + seconds
    if total < MIN_DURATION_S or total > MAX_DURATION_S:
        raise UserInputError(flag, f"{text!r} is out of range", "between 1m and 90d")
    return total


def format_duration(seconds: float | None) -> str:
    """3600 -> '1h', 5400 -> '1h30m', 45 -> '45s'; None -> 'off'."""
    if seconds is None:
        return "off"
    total = max(int(seconds), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{v}{u}" for v, u in ((days, "d"), (hours, "h"), (minutes, "m")) if v]
    if secs and not days and not hours:
        parts.append(f"{secs}s")
    return "".join(parts) or "0s"


# --- loading with line numbers -----------------------------------------------------------------

M = TypeVar("M", bound=BaseModel)


def _line_index(node: yaml.Node, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], int]:
    """Map each value's path (keys and list indexes) to its 1-based line in the YAML text."""
    lines = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = (*path, key.value)
            lines[child] = key.start_mark.line + 1
            lines.update({k: v for k, v in _line_index(value, child).items() if k != child})
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_line_index(item, (*path, i)))
    return lines


MAX_FILE_BYTES = 1 << 20  # a playbook or inventory is a few KiB; anything past 1 MiB is a mistake or an attack
MAX_YAML_VALUES = 100_000  # values after alias expansion: "billion laughs" stops here, before it is built
MAX_YAML_DEPTH = 64


def read_text_file(path: Path, field: str, what: str) -> str:
    """A user's YAML file as text: UTF-8 (with or without a BOM) or UTF-16 with a BOM, at most
    MAX_FILE_BYTES; anything else (binary, a folder, unreadable, too big) is a UserInputError."""
    try:
        if not path.is_file():
            raise UserInputError(field, f"{path}: not a file", f"give the path of a {what} (.yml)")
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise UserInputError(field, f"{path}: cannot read it ({exc.strerror or exc})",
                             f"give the path of a {what} you can read") from None
    if len(raw) > MAX_FILE_BYTES:
        raise UserInputError(field, f"{path}: larger than {MAX_FILE_BYTES // (1 << 20)} MiB; a {what} is a few KiB",
                             "is this the right file?")
    try:
        text = raw.decode("utf-16") if raw.startswith((b"\xff\xfe", b"\xfe\xff")) else raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserInputError(field, f"{path}: not text (byte {exc.start} is not UTF-8); a {what} is YAML text",
                             "save it as UTF-8") from None
    if "\x00" in text:
        raise UserInputError(field, f"{path}: not text (it holds NUL bytes); a {what} is YAML text", "save it as UTF-8")
    return text


def _expanded_size(root: yaml.Node) -> int:
    """How many values `root` stands for once every alias is expanded, stopping past MAX_YAML_VALUES;
    a value that contains itself (`a: &a [*a]`) is a ValueError, nesting past MAX_YAML_DEPTH a
    RecursionError. Linear in the distinct nodes."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node, depth: int = 0) -> int:
        if depth > MAX_YAML_DEPTH:
            raise RecursionError
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise ValueError("an alias refers to a value that contains it (a loop)")
        open_nodes.add(key)
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        total = 1
        for child in children:
            total = min(total + size(child, depth + 1), MAX_YAML_VALUES + 1)
        open_nodes.discard(key)
        sizes[key] = total
        return total

    return size(root)


def _parse_yaml(text: str, source: str, field: str) -> tuple[Any, yaml.Node | None]:
    """YAML text → (data, node tree), bounded: aliases may not loop or expand past MAX_YAML_VALUES."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            try:
                values = _expanded_size(node)
            except ValueError as exc:
                raise UserInputError(field, f"{source}: {exc}", "write the value out instead of aliasing it") from None
            if values > MAX_YAML_VALUES:
                raise UserInputError(field, f"{source}: its aliases expand to more than {MAX_YAML_VALUES:,} values",
                                     "write the values out; a playbook or inventory needs a few hundred")
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise UserInputError(field, f"{where}: not valid YAML ({problem})", "check indentation and quoting") from None
    except RecursionError:
        raise UserInputError(field, f"{source}: nested too deeply to be a playbook or inventory",
                             "is this the right file?") from None
    finally:
        loader.dispose()
    return data, node


def load_model(text: str, model: type[M], source: str, field: str) -> M:
    """Parse YAML text into `model`, or raise UserInputError naming source:line and the field path."""
    if len(text) > MAX_FILE_BYTES:
        raise UserInputError(field, f"{source}: larger than 1 MiB", "is this the right file?")
    data, node = _parse_yaml(text, source, field)
    if not isinstance(data, dict):
        raise UserInputError(field, f"{source}: expected a mapping of fields at the top level", f"see {model.__name__}'s fields")
    lines = _line_index(node) if node is not None else {}
    try:
        loaded = model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        line = next((lines[loc[:i]] for i in range(len(loc), -1, -1) if loc[:i] in lines), None)
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        where = f"{source}:{line}" if line else source
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            parent = model
            allowed = _allowed_fields(parent, loc[:-1])
            msg = f"unknown field {loc[-1]!r}" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
        # a list whose item failed also reports itself too short: that is the same problem
        others = [e for e in exc.errors()[1:] if tuple(e["loc"]) != loc[:len(tuple(e["loc"]))]]
        more = f" (and {len(others)} more problem(s))" if others else ""
        raise UserInputError(field, f"{where}: {dotted}: {msg}{more}") from None
    if isinstance(loaded, Playbook):
        loaded._source, loaded._lines = source, lines
    return loaded


def _allowed_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names valid at `loc` inside `model`, for 'unknown field' messages."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        info = current.model_fields.get(part) if isinstance(current, type) and issubclass(current, BaseModel) else None
        if info is None:
            return []
        current = _model_in(info.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [info.alias or name for name, info in current.model_fields.items()]  # as written: `from`, not `source`
    return []


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def load_sources(value: str, field: str = "--sources") -> tuple[Sources, str]:
    """`--sources FILE|PRESET`: a preset's name, `origins` (no key set), or a YAML file of the map's keys; with where
    to blame it."""
    if value == sources.ORIGINS:
        return Sources(), f"{field} {value}"
    if value in sources.presets():
        return sources.presets()[value].urls, f"{field} {value}"
    path = Path(value)
    if not path.is_file():
        raise UserInputError(field, f"{value!r} is neither a preset nor a file",
                             f"presets: {', '.join(sources.presets())}, or {sources.ORIGINS}; or a YAML file with keys "
                             f"{', '.join(sources.KEYS)}")
    return load_model(read_text_file(path, field, "sources file"), Sources, str(path), field), f"{field} {path}"



def shipped_playbooks() -> list[str]:
    return sorted(p.stem for p in playbooks_dir().glob("*.yml"))


def playbook_file(name_or_path: str) -> Path | None:
    """The user's playbook file `name_or_path` names, or None for a shipped playbook's name."""
    path = Path(name_or_path)
    return path if path.suffix in (".yml", ".yaml") or "/" in name_or_path else None


def load_playbook(name_or_path: str) -> Playbook:
    """A shipped playbook by name ('pytorch'), or a YAML file by path."""
    path = Path(name_or_path)
    if playbook_file(name_or_path) is None:
        path = playbooks_dir() / f"{name_or_path}.yml"
        if not path.is_file():
            raise UserInputError(
                "--playbook", f"unknown playbook {name_or_path!r}",
                f"shipped playbooks: {', '.join(shipped_playbooks())}; or give a path to your own .yml",
            )
    if not path.exists():
        raise UserInputError("--playbook", f"no such file: {path}", f"shipped playbooks: {', '.join(shipped_playbooks())}")
    return load_model(read_text_file(path, "--playbook", "playbook"), Playbook, str(path), "--playbook")
