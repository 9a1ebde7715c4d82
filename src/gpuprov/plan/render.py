"""Render a plan's steps from Jinja templates into a bundle of bash scripts.

Each step script is self-contained (the common library is included into it), so its sha256
covers everything it will run; that hash is the step's resume marker on the host.

Quoting: the environment runs with StrictUndefined and no autoescape; every value that did not
come from gpuprov itself must pass through the `q` filter (shlex.quote). A playbook's `run`
field is the one place user text is a command, by definition.

Result protocol (read by the bootstrap runner): a step prints exactly one line
`GPUPROV_RESULT=unchanged|changed|reboot` as its last act and exits 0; any non-zero exit is a
failure. `reboot` means the step changed the host and the change takes effect after a reboot
(a fresh driver install); the runner reboots, waits, and goes on with the next step.

Every step script starts `set -euo pipefail` and is idempotent: it reads the state first and acts only on the
difference. Everything but the result line goes to stderr, so a user's `run:` cannot fake a result. Paths a
script writes are prefixed with `${GPUPROV_SYSROOT:-}` (empty in production; the test hosts set it so scripts
never touch the test machine's /etc). Jinja also gets `b64`; compiled templates are kept on disk (Jinja's
bytecode cache, `environment`).

`Bundle.write` takes a new or empty folder, or one an earlier render wrote (only the `NN-name.sh` files its
manifest lists are removed first); a file, a path under a file, an unwritable place, a non-empty folder without a
manifest, or a symbolic link at any name the render writes is bad input, before anything changes. Each file is a
new one renamed into place (`files.write_atomic(follow=False)`), so a link planted after that check is replaced,
never written through.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpuprov.errors import UserInputError
from gpuprov.files import write_atomic
from gpuprov.plan.sources import ORIGIN
from gpuprov.resources import templates_dir

if TYPE_CHECKING:
    import jinja2

STATE_DIR = "/var/lib/gpuprov"
StepKind = Literal["stack", "env", "data", "user", "verify", "guard", "monitor"]


@dataclass(frozen=True)
class StepPlan:
    """One step before rendering: which template, with what context beyond the plan's own."""

    name: str
    template: str
    kind: StepKind
    summary: str
    extra: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Script:
    name: str
    filename: str
    kind: StepKind
    summary: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True)
class Bundle:
    scripts: tuple[Script, ...]
    manifest: dict[str, Any]

    def write(self, out: Path | str, field: str = "--output") -> list[Path]:
        """Write every script (0755) and manifest.json into the folder `out`; returns the paths written.

        `out` is new, empty, or a folder an earlier render wrote: then only the scripts its
        manifest.json listed are removed first, so no stale step is left beside the new ones. A
        non-empty folder without a manifest, a file, a place that cannot be written, or a symbolic link
        at a name this render writes is a UserInputError naming `field`, before anything is changed.
        Each file is a new one renamed into place, never an old one rewritten, so a link planted after
        the check is replaced, not followed (it overwrote and chmod'ed whatever it named).
        """
        if not str(out).strip():
            raise UserInputError(field, "an empty path", "name a folder, e.g. -o ./bundle")
        out = Path(out)
        hint = "name a new or empty folder you can write, e.g. -o ./bundle"
        try:
            for place in (out, *out.parents):
                if place.exists() or place.is_symlink():
                    if not place.is_dir():
                        what = "is" if place == out else f"is under {place}, which is"
                        raise UserInputError(field, f"{out} {what} a file, not a folder", hint)
                    break
            files = [(s.filename, s.text, 0o755) for s in self.scripts]
            files.append(("manifest.json", json.dumps(self.manifest, indent=2) + "\n", 0o644))
            for name, _, _ in files:
                if (out / name).is_symlink():
                    raise UserInputError(field, f"{out / name} is a symbolic link (to {os.readlink(out / name)}); "
                                                "render writes no file through a link",
                                         "remove the link, or render into a new folder")
            stale = _previous_scripts(out, field, hint) if out.is_dir() else []
            out.mkdir(parents=True, exist_ok=True)
            for path in stale:
                path.unlink(missing_ok=True)
            written = []
            for name, text, mode in files:
                write_atomic(out / name, text, mode=mode, follow=False)
                written.append(out / name)
        except OSError as exc:
            where = exc.filename or out
            raise UserInputError(field, f"cannot write {where}: {exc.strerror or exc}", hint) from None
        return written


_SCRIPT_NAME = re.compile(r"^[0-9]{2}-[a-z0-9][a-z0-9-]*\.sh$")


def _previous_scripts(out: Path, field: str, hint: str) -> list[Path]:
    """The scripts an earlier render listed in out/manifest.json (plain names only); a non-empty
    folder without a readable gpuprov manifest is refused."""
    manifest = out / "manifest.json"
    if not manifest.exists():
        if any(out.iterdir()):
            raise UserInputError(field, f"{out} is not empty and holds no manifest.json from an earlier render", hint)
        return []
    try:
        steps = json.loads(manifest.read_text())["steps"]
        names = [str(step["file"]) for step in steps]
    except (ValueError, KeyError, TypeError):
        raise UserInputError(field, f"{manifest} is not a manifest gpuprov wrote", hint) from None
    return [out / name for name in names if _SCRIPT_NAME.fullmatch(name) and (out / name).is_file()]


def host_path(path: str) -> str:
    """A path on the host as a shell word, under ${GPUPROV_SYSROOT} like every rendered step
    (empty on real hosts; the test hosts keep their fake root there)."""
    return '"${GPUPROV_SYSROOT:-}"' + shlex.quote(path)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@functools.cache
def environment() -> jinja2.Environment:
    """One per process: Jinja keeps each compiled template, so 32 hosts' bundles do not compile them 32 times
    (and, templates being fixed for the process, does not stat their files on every use either). Compiled
    templates are also kept on disk (Jinja's bytecode cache, keyed by each template's source checksum), so a
    command does not compile again what the last one compiled."""
    import jinja2  # here, not at the top: `exec` and `ssh` use this module's paths and never render

    from gpuprov.paths import cache_dir

    cache = cache_dir()
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
        bytecode_cache=jinja2.FileSystemBytecodeCache(str(cache), "template-%s.cache") if cache else None,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    env.filters["b64"] = _b64
    return env


def render_steps(steps: tuple[StepPlan, ...], context: dict[str, Any], manifest: dict[str, Any]) -> Bundle:
    env = environment()
    scripts = []
    for index, step in enumerate(steps, start=1):
        # a step rendered without a plan's map (a guard's script) downloads from the origins
        ctx = {"state_dir": STATE_DIR, "home": None, "sources": ORIGIN, **context, **dict(step.extra), "step_name": step.name}
        text = env.get_template(step.template).render(ctx)
        scripts.append(Script(step.name, f"{index:02d}-{step.name}.sh", step.kind, step.summary, text))
    manifest = {
        **manifest,
        "steps": [
            {"name": s.name, "file": s.filename, "kind": s.kind, "summary": s.summary, "sha256": s.sha256}
            for s in scripts
        ],
    }
    return Bundle(tuple(scripts), manifest)
