"""torch releases from their sources: PyPI's JSON API and the PyTorch wheel index.

PyPI (`/pypi/torch/json`) gives every release's files: the first upload (the release date), Requires-Python
(the lowest Python) and the wheels' CPython tags (the highest); the Requires-Dist of a release's PyPI wheel
names the CUDA it is built with (`nvidia-cuda-runtime-cu12==12.8.90`, from 2.15 `cuda-toolkit[...]==13.2.2`),
which is the release's PyPI-default variant. That comes from the project's `info` for the latest release and
from `/pypi/torch/<version>/json` for the others. The PyTorch wheel index (`<index>/torch/`) lists the CUDA
variants per release (`torch-2.15.0+cu130-...whl`); it is asked for PEP 691 JSON and read as HTML (PEP 503)
when it answers that, as the PyTorch index does.

What a source cannot say is kept from the snapshot, and a row with something kept says so (`unverified`).

A new release's SASS list is carried from the previous release and marked.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from html.parser import HTMLParser
from typing import Any
from urllib.parse import unquote, urlparse

from gpuprov.sources import http

PEP691 = "application/vnd.pypi.simple.v1+json"
ACCEPT_INDEX = f"{PEP691}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
FINAL = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")  # releases, not rc/dev/post builds
LINUX_WHEEL = re.compile(r"^torch-(\d+)\.(\d+)\.(\d+)(?:\+([a-z0-9]+))?-cp(\d)(\d+)-cp\d+t?-(?:manylinux\w*|linux)_x86_64\.whl$")
CUDA_DEP = re.compile(r"^(?:nvidia-cuda-runtime(?:-cu\d+)?|cuda-toolkit(?:\[[^\]]*\])?)\s*==\s*(\d+)\.(\d+)")


@dataclass
class FamilyRead:
    """One release family (2.15) as the sources show it."""

    released: str | None = None  # ISO date of the first upload
    python_min: str | None = None
    python_max: str | None = None
    pypi_default: str | None = None  # "cu132"
    variants: set[str] = field(default_factory=set)
    newest: str = ""  # the newest final release of the family, "2.15.1"


@dataclass
class TorchRead:
    families: dict[str, FamilyRead]
    index_read: bool
    sources: tuple[str, ...]
    notes: list[str]


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def cuda_of(requires_dist: list[str] | None) -> str | None:
    """'cu132' from a wheel's Requires-Dist on Linux, or None when it names no CUDA runtime."""
    for req in requires_dist or []:
        spec, _, marker = req.partition(";")
        if marker and "linux" not in marker.lower():
            continue
        if m := CUDA_DEP.match(spec.strip()):
            return f"cu{m[1]}{m[2]}"
    return None


def _python_min(requires_python: str | None) -> str | None:
    m = re.search(r">=\s*(\d+\.\d+)", requires_python or "")
    return m[1] if m else None


def read_pypi(base: str) -> tuple[dict[str, FamilyRead], list[str], list[str]]:
    """(families, urls read, notes) from PyPI's JSON API."""
    url = f"{base}/pypi/torch/json"
    project = json.loads(http.get(url, "application/json").body)
    families: dict[str, FamilyRead] = defaultdict(FamilyRead)
    for release, files in (project.get("releases") or {}).items():
        if not (m := FINAL.match(release)) or not files or all(f.get("yanked") for f in files):
            continue
        fam = families[f"{m[1]}.{m[2]}"]
        fam.newest = max(fam.newest or release, release, key=_v)
        for f in files:
            if f.get("yanked"):
                continue
            uploaded = (f.get("upload_time_iso_8601") or f.get("upload_time") or "")[:10]
            if uploaded and (fam.released is None or uploaded < fam.released):
                fam.released = uploaded
            if (wheel := LINUX_WHEEL.match(f.get("filename", ""))) and not wheel[4]:
                py = f"{wheel[5]}.{wheel[6]}"
                fam.python_max = max(fam.python_max or py, py, key=_v)
                low = _python_min(f.get("requires_python")) or py
                fam.python_min = min(fam.python_min or low, low, key=_v)
    read = [url]
    notes: list[str] = []
    info = project.get("info") or {}
    for name, fam in sorted(families.items(), key=lambda kv: _v(kv[0])):
        if not fam.python_max:
            continue  # no Linux x86_64 wheel on PyPI (torch before 1.x, or a source-only release)
        if info.get("version") == fam.newest:
            fam.pypi_default = cuda_of(info.get("requires_dist"))
            continue
        release_url = f"{base}/pypi/torch/{fam.newest}/json"
        try:
            release = json.loads(http.get(release_url, "application/json").body)
        except http.SourceUnreachable as exc:
            notes.append(f"torch {name}: its PyPI wheel's Requires-Dist was not read ({exc.why} from "
                         f"{http.described(release_url)})")
            continue
        read.append(release_url)
        fam.pypi_default = cuda_of((release.get("info") or {}).get("requires_dist"))
    return dict(families), read, notes


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href") if tag == "a" else None
        if href:
            self.names.append(unquote(urlparse(href).path.rsplit("/", 1)[-1]))


def index_filenames(answer: http.Response) -> list[str]:
    """The file names a simple index page lists, from PEP 691 JSON or PEP 503 HTML."""
    if answer.content_type == PEP691 or answer.body.lstrip().startswith(b"{"):
        return [str(f["filename"]) for f in json.loads(answer.body).get("files", [])]
    parser = _Anchors()
    parser.feed(answer.text())
    return parser.names


def read_index(base: str) -> dict[str, set[str]]:
    """Release family -> CUDA variants with a Linux x86_64 wheel on the PyTorch wheel index."""
    variants: dict[str, set[str]] = defaultdict(set)
    for name in index_filenames(http.get(f"{base}/torch/", ACCEPT_INDEX)):
        if (m := LINUX_WHEEL.match(name)) and m[4] and m[4].startswith("cu"):
            variants[f"{m[1]}.{m[2]}"].add(m[4])
    return dict(variants)


def read(pypi: str, index: str) -> TorchRead:
    """Both sources; PyPI must answer, the wheel index may not (its variants are then kept from the snapshot)."""
    families, urls, notes = read_pypi(pypi)
    index_read = True
    try:
        by_index = read_index(index)
        urls.append(f"{index}/torch/")
    except http.SourceUnreachable as exc:
        by_index, index_read = {}, False
        notes.append(f"the PyTorch wheel index was not read ({http.described(exc.url)}: {exc.why}): CUDA variants "
                     "kept from the snapshot")
    for name, fam in families.items():
        fam.variants = by_index.get(name, set())
    return TorchRead(families, index_read, tuple(urls), notes)


def releases(read_: TorchRead, snapshot: dict[str, dict[str, Any]], when: datetime) -> dict[str, dict[str, Any]]:
    """stack.yaml's `torch_releases`, as the sources say it: every release family from the snapshot's oldest on."""
    oldest = min(snapshot, key=_v)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(snapshot) | set(read_.families), key=_v):
        if _v(name) < _v(oldest):
            continue
        old = snapshot.get(name, {})
        fam = read_.families.get(name)
        if fam is None or not fam.python_max:
            if old:
                out[name] = old  # PyPI does not show it (it never will lose a release): kept as it was
            continue
        kept: list[str] = []
        variants = sorted(fam.variants, key=_v) or list(old.get("variants") or [])
        if not fam.variants:
            kept.append("CUDA variants" if old else "CUDA variants (only the PyPI default is known)")
        default = fam.pypi_default or old.get("pypi_default")
        if not fam.pypi_default:
            kept.append("PyPI default variant")
        if not variants and default:
            variants = [default]
        if default is None or not variants:
            continue  # a release with no CUDA wheel at all: nothing the resolver could install
        row: dict[str, Any] = {"variants": variants, "pypi_default": default,
                               "python": [fam.python_min or fam.python_max, fam.python_max]}
        if fam.released:
            row["released"] = fam.released
        if kept:
            row["unverified"] = (f"{', '.join(kept)} not read from the sources on {when.date().isoformat()}"
                                 + ("; kept from the shipped snapshot" if old else ""))
        out[name] = row
    return out


def carried_archs(rows: dict[str, dict[str, Any]], archs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`wheel_archs` with a row for each new release's variants: the newest earlier release's list for the same
    variant, carried forward and marked so (no source says which SASS a wheel carries, short of loading it)."""
    out = list(archs)
    for name, row in sorted(rows.items(), key=lambda kv: _v(kv[0])):
        for variant in row["variants"]:
            if any(_v(a["torch"][0]) <= _v(name) <= _v(a["torch"][1]) and variant in a["variants"] for a in out):
                continue
            earlier = [a for a in out if variant in a["variants"] and _v(a["torch"][1]) < _v(name)]
            if not earlier:
                continue  # no earlier wheel of this variant: the resolver refuses it (wheel-no-sass) rather than guess
            base = max(earlier, key=lambda a: _v(a["torch"][1]))
            out.append({"torch": [name, name], "variants": [variant], "sm": list(base["sm"]),
                        "unverified": f"torch {name}+{variant}'s arch list was not read: torch {base['torch'][1]}'s "
                                      "carried forward"})
    return out
