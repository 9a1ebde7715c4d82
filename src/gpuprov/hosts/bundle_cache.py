"""Rendered bundles kept on disk, so a rerun of the same plan sends the same bytes without Jinja.

Rendering a bundle costs Jinja's import and a pass over the templates, several times more when the first
host's facts arrive while dozens of other connections are still being set up (every host alike waits for
that one bundle). Reruns are the common case (a resume after a failure, a verify, the next node of a fleet),
and they ask for the same plan.

The key is the plan (its repr: every value the templates see, the playbook included) and gpuprov itself
(every file of the package, its templates and data, by size and modification time; and Jinja's own), so an
edit to any of them renders afresh. A cache entry that cannot be read or written is ignored: the bundle is
rendered as if there were none.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path

from gpuprov.plan.plan import Plan
from gpuprov.plan.render import Bundle, Script
from gpuprov.resources import templates_dir

KEEP = 64  # entries kept; the oldest go first


def bundle_for(plan: Plan) -> tuple[Bundle, str]:
    """The plan's bundle and the runner rendered for it, from the cache when this plan was rendered before."""
    folder = _folder()
    path = folder / f"{_key(plan)}.json" if folder else None
    cached = _load(path) if path else None
    if cached is not None:
        return cached
    from gpuprov.hosts import runner

    bundle = plan.bundle()
    from gpuprov.plan import noroot

    runner_text = runner.render_runner(bundle, noroot.state_dir(plan.home) if plan.home else runner.STATE_DIR)
    if path is not None:
        _store(path, bundle, runner_text)
    return bundle, runner_text


def _key(plan: Plan) -> str:
    return hashlib.sha256(f"{_installation()}\n{plan!r}".encode()).hexdigest()[:32]


@functools.cache
def _installation() -> str:
    """gpuprov's files (package, templates, data) and Jinja's, by path, size and modification time."""
    package = Path(__file__).resolve().parent
    files = [p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    files += [p for p in templates_dir().rglob("*") if p.is_file()]
    spec = importlib.util.find_spec("jinja2")
    if spec is not None and spec.origin:
        files += [p for p in Path(spec.origin).parent.glob("*.py")]
    lines = []
    for p in sorted(files):
        stat = p.stat()
        lines.append(f"{p}\0{stat.st_size}\0{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _folder() -> Path | None:
    from gpuprov.paths import cache_dir

    base = cache_dir()
    if base is None:
        return None
    folder = base / "bundles"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return None
    return folder


def _load(path: Path) -> tuple[Bundle, str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        scripts = tuple(Script(s["name"], s["filename"], s["kind"], s["summary"], s["text"]) for s in data["scripts"])
        bundle, runner_text = Bundle(scripts, data["manifest"]), str(data["runner"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used: pruned last
    return bundle, runner_text


def _store(path: Path, bundle: Bundle, runner_text: str) -> None:
    data = {"scripts": [{"name": s.name, "filename": s.filename, "kind": s.kind, "summary": s.summary, "text": s.text}
                        for s in bundle.scripts],
            "manifest": bundle.manifest, "runner": runner_text}
    tmp: Path | None = None
    try:
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, suffix=".tmp", delete=False) as f:
            tmp = Path(f.name)
            json.dump(data, f)
        os.replace(tmp, path)
        entries = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:-KEEP]:
            old.unlink(missing_ok=True)
    except (OSError, TypeError, ValueError):  # a full disk or an odd manifest value: no cache, same bundle
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
