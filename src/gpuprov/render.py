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
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jinja2

from gpuprov.resources import templates_dir

STATE_DIR = "/var/lib/gpuprov"
StepKind = Literal["stack", "env", "user", "verify", "guard"]


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

    def write(self, out: Path) -> list[Path]:
        """Write every script (0755) and manifest.json into `out`; returns the paths written."""
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for script in self.scripts:
            path = out / script.filename
            path.write_text(script.text)
            path.chmod(0o755)
            written.append(path)
        manifest = out / "manifest.json"
        manifest.write_text(json.dumps(self.manifest, indent=2) + "\n")
        written.append(manifest)
        return written


def host_path(path: str) -> str:
    """A path on the host as a shell word, under ${GPUPROV_SYSROOT} like every rendered step
    (empty on real hosts; the test hosts keep their fake root there)."""
    return '"${GPUPROV_SYSROOT:-}"' + shlex.quote(path)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    env.filters["b64"] = _b64
    return env


def render_steps(steps: tuple[StepPlan, ...], context: dict[str, Any], manifest: dict[str, Any]) -> Bundle:
    env = environment()
    scripts = []
    for index, step in enumerate(steps, start=1):
        ctx = {**context, **dict(step.extra), "step_name": step.name, "state_dir": STATE_DIR}
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
