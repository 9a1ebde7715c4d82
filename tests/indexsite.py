"""A local stand-in for the facts' public sources, served over HTTP on 127.0.0.1: PyPI's JSON API for torch,
the PyTorch wheel index (PEP 691 JSON or PEP 503 HTML, by the request's Accept), and NVIDIA's CUDA repository
(a `Packages` index per OS). The tests point `gpuprov facts refresh` at it with GPUPROV_PYPI_URL,
GPUPROV_PYTORCH_INDEX_URL and GPUPROV_NVIDIA_REPOS_URL.

Built from recorded real metadata (tests/fixtures/index, provenance in its README): PyPI's answers for torch
(file objects, the 2.15.0 Requires-Dist, every release's upload time, Requires-Python and wheel tags) and the
imitation NVIDIA repository's rows (tests/shims/data/nvidia-repo.tsv). `newer=True` adds torch 2.16.0, a release
newer than the snapshot, INVENTED from 2.15.0's shapes (2.16 is due 2026-12-22). Per-version JSON is served for
2.15.0 only: the recording's other per-version pages answered 404, and so does this server.

The variant indexes of the newest release (/whl/cu132/torch/, /whl/cu132/filelock/) serve tiny REAL wheels, made
here (a torch that needs filelock, for CPython 3.11 and 3.12 on manylinux x86_64 and aarch64), each listed with its
sha256 as the PyTorch wheel index lists them: what `facts refresh` locks and a node installs with --require-hashes.
GitHub's side of the installers (`facts refresh --only installers`, GPUPROV_GITHUB_URL and GPUPROV_GITHUB_API_URL
at the site): the releases API's `latest` of uv and Miniforge, INVENTED releases newer than the shipped pins
(RELEASES), and the `.sha256` file beside each asset, of invented sums (no archive is served).
`changed="filelock"` makes the site a mirror that serves a changed filelock wheel under the same name, its index
listing the changed file's own sha256, as a mirror that rebuilt it would.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import gzip
import hashlib
import html
import io
import json
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent
RECORDED = ROOT / "fixtures" / "index"
REPO_DATA = ROOT / "shims" / "data" / "nvidia-repo.tsv"
PEP691 = "application/vnd.pypi.simple.v1+json"
# the PyTorch wheel index's variants per release, as data/stack.yaml has them (2.16: invented, see above)
VARIANTS = {"2.12.0": ("cu126", "cu130", "cu132"), "2.13.0": ("cu126", "cu130", "cu132"),
            "2.14.0": ("cu126", "cu130", "cu132"), "2.14.1": ("cu126", "cu130", "cu132"),
            "2.15.0": ("cu130", "cu132"), "2.16.0": ("cu130", "cu132")}
REPOS = ("ubuntu2204/x86_64", "ubuntu2204/sbsa", "ubuntu2404/x86_64", "ubuntu2404/sbsa")


def _recorded(name: str) -> Any:
    return json.loads((RECORDED / name).read_text())


def _file(template: dict[str, Any], version: str, tag: str, uploaded: str, requires: str) -> dict[str, Any]:
    """One PyPI file object in the recorded shape, for a manylinux x86_64 wheel of `version` and CPython `tag`."""
    out = copy.deepcopy(template)
    name = f"torch-{version}-{tag}-{tag}-manylinux_2_28_x86_64.whl"
    out.update(filename=name, python_version=tag, requires_python=requires,
               upload_time=uploaded[:19], upload_time_iso_8601=uploaded,
               url=template["url"].rsplit("/", 1)[0] + "/" + name)
    return out


def pypi_project(newer: bool) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(/pypi/torch/json, {version: /pypi/torch/<version>/json}) from the recordings."""
    excerpt = _recorded("pypi-torch-json.excerpt.json")
    summary = {k: v for k, v in _recorded("pypi-torch-releases.summary.json").items() if not k.startswith("_")}
    template = excerpt["urls_excerpt"][0]
    info_215 = {**excerpt["info"]}
    if newer:  # invented: 2.16.0 a month after the recording, shaped like 2.15.0
        summary["2.16.0"] = {**summary["2.15.0"], "first_upload": "2026-12-22T15:00:00Z"}
    releases = {v: [_file(template, v, tag, s["first_upload"], s["requires_python"][0]) for tag in s["python_tags"]]
                for v, s in summary.items()}
    releases["2.16.0rc1"] = [_file(template, "2.16.0rc1", "cp312", "2026-12-01T10:00:00Z", ">=3.11")] if newer else []
    latest = max(summary, key=lambda v: tuple(int(p) for p in v.split(".")))
    info = {**info_215, "version": latest}
    project = {"info": info, "last_serial": excerpt["last_serial"], "releases": releases,
               "urls": releases[latest], "vulnerabilities": []}
    per_version = {"2.15.0": {"info": info_215, "last_serial": excerpt["last_serial"], "urls": releases["2.15.0"],
                              "vulnerabilities": []}}
    return project, per_version


def wheel_index(newer: bool) -> tuple[dict[str, Any], str]:
    """The PyTorch wheel index's torch/ page: PEP 691 JSON (in the recorded PyPI shape) and PEP 503 HTML."""
    summary = _recorded("pypi-torch-releases.summary.json")
    shape = _recorded("pypi-simple-torch-pep691.excerpt.json")
    files = []
    for version, variants in VARIANTS.items():
        if version == "2.16.0" and not newer:
            continue
        tags = summary.get(version, summary["2.15.0"])["python_tags"]
        for variant in variants:
            for tag in tags:
                name = f"torch-{version}+{variant}-{tag}-{tag}-manylinux_2_28_x86_64.whl"
                files.append({"filename": name, "url": f"/whl/{variant}/{name.replace('+', '%2B')}", "hashes": {},
                              "requires-python": summary.get(version, summary["2.15.0"])["requires_python"][0]})
            files.append({"filename": f"torch-{version}+{variant}-cp312-cp312-manylinux_2_28_aarch64.whl",
                          "url": f"/whl/{variant}/torch-{version}%2B{variant}-cp312-cp312-manylinux_2_28_aarch64.whl",
                          "hashes": {}})
    page = {"meta": shape["meta"], "name": "torch", "files": files}
    links = "".join(f'    <a href="{html.escape(f["url"])}">{html.escape(f["filename"])}</a><br/>\n' for f in files)
    return page, f"<!DOCTYPE html>\n<html>\n  <body>\n    <h1>Links for torch</h1>\n{links}  </body>\n</html>\n"


def packages_index(repo: str) -> str:
    """NVIDIA's Packages index for one repository, from the imitation repository's rows (nvidia-repo.tsv)."""
    distro, arch = repo.split("/")
    debian_arch = "amd64" if arch == "x86_64" else "arm64"
    stanzas = []
    for line in REPO_DATA.read_text().splitlines():
        if not line or line.startswith(("#", "@")):
            continue
        repos, name, version, provides, *_ = line.split("\t")
        if repos != "*" and not {repo, distro, arch} & set(repos.split(",")):
            continue
        version = "1.0-1" if version == "?" else version
        fields = [f"Package: {name}", f"Version: {version}", f"Architecture: {debian_arch}"]
        if provides != "-":
            fields.append(f"Provides: {provides}")
        fields.append(f"Filename: ./{name}_{version}_{debian_arch}.deb")
        stanzas.append("\n".join(fields))
    return "\n\n".join(stanzas) + "\n"


WHEEL_TAGS = ("cp311", "cp312")
WHEEL_ARCHS = ("x86_64", "aarch64")
FILELOCK = "3.20.0"


def _wheel(name: str, version: str, tag: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> bytes:
    """A minimal real wheel (PEP 427): the files, METADATA, WHEEL and RECORD, with fixed dates so that the same
    wheel built twice is the same bytes (the same sha256)."""
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    abi = tag.split("-")[1]
    wheel = f"Wheel-Version: 1.0\nGenerator: gpuprov-tests\nRoot-Is-Purelib: {'true' if abi == 'none' else 'false'}\nTag: {tag}\n"
    content = {**files, f"{dist}/METADATA": meta, f"{dist}/WHEEL": wheel}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(text.encode())}\n" for path, text in content.items()) + f"{dist}/RECORD,,\n"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for path, text in {**content, f"{dist}/RECORD": record}.items():
            z.writestr(zipfile.ZipInfo(path, date_time=(2026, 12, 1, 0, 0, 0)), text)
    return out.getvalue()


def _simple_page(folder: Path, project: str, files: dict[str, bytes], prefix: str) -> None:
    """A simple-index page of `project` in `folder` (PEP 691 JSON and PEP 503 HTML), each file with its sha256."""
    rows = [{"filename": n, "url": f"{prefix}/{n.replace('+', '%2B')}", "hashes": {"sha256": hashlib.sha256(b).hexdigest()}}
            for n, b in sorted(files.items())]
    (folder / project).mkdir(parents=True, exist_ok=True)
    (folder / project / "index.json").write_text(json.dumps({"meta": {"api-version": "1.0"}, "name": project, "files": rows}))
    links = "".join(f'<a href="{html.escape(r["url"])}#sha256={r["hashes"]["sha256"]}">{html.escape(r["filename"])}</a><br/>\n'
                    for r in rows)
    (folder / project / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")


def variant_wheels(site: Path, release: str, variants: tuple[str, ...], changed: str | None = None) -> None:
    """The variant indexes' real wheels: torch `release` of each variant and its one dependency, filelock."""
    for variant in variants:
        folder = site / "whl" / variant
        folder.mkdir(parents=True, exist_ok=True)
        torch_files: dict[str, bytes] = {}
        for py in WHEEL_TAGS:
            for arch in WHEEL_ARCHS:
                tag = f"{py}-{py}-manylinux_2_28_{arch}"
                torch_files[f"torch-{release}+{variant}-{tag}.whl"] = _wheel(
                    "torch", f"{release}+{variant}", tag, {"torch/__init__.py": f"__version__ = '{release}+{variant}'\n"},
                    ("filelock",))
        body = "# the stand-in's filelock\n" + ("import os  # a mirror changed this wheel\n" if changed == "filelock" else "")
        lock_files = {f"filelock-{FILELOCK}-py3-none-any.whl": _wheel("filelock", FILELOCK, "py3-none-any",
                                                                    {"filelock/__init__.py": body})}
        for project, files in (("torch", torch_files), ("filelock", lock_files)):
            for name, data in files.items():
                (folder / name).write_bytes(data)
            _simple_page(folder, project, files, f"/whl/{variant}")


# the installers' invented newest releases: (repository, version, asset per CPU)
RELEASES = {"uv": ("astral-sh/uv", "0.13.9", "uv-{arch}-unknown-linux-musl.tar.gz"),
            "miniforge": ("conda-forge/miniforge", "26.1.0-0", "Miniforge3-{version}-Linux-{arch}.sh")}


def release_sha256(key: str, arch: str) -> str:
    """The invented sum the stand-in's `.sha256` file says for `key`'s newest release on `arch`."""
    return hashlib.sha256(f"{key} {RELEASES[key][1]} {arch}".encode()).hexdigest()


def github_releases(site: Path) -> None:
    for key, (repo, version, asset) in RELEASES.items():
        api = site / "repos" / repo / "releases"
        api.mkdir(parents=True, exist_ok=True)
        (api / "latest").write_text(json.dumps({"tag_name": version, "name": version, "draft": False}))
        folder = site / repo / "releases" / "download" / version
        folder.mkdir(parents=True, exist_ok=True)
        for arch in ("x86_64", "aarch64"):
            name = asset.format(arch=arch, version=version)
            (folder / f"{name}.sha256").write_text(f"{release_sha256(key, arch)}  {name}\n")


def build(site: Path, newer: bool = True, changed: str | None = None) -> Path:
    project, per_version = pypi_project(newer)
    (site / "pypi/torch").mkdir(parents=True, exist_ok=True)
    (site / "pypi/torch/json").write_text(json.dumps(project))
    for version, data in per_version.items():
        (site / f"pypi/torch/{version}").mkdir(parents=True, exist_ok=True)
        (site / f"pypi/torch/{version}/json").write_text(json.dumps(data))
    page, page_html = wheel_index(newer)
    (site / "whl/torch").mkdir(parents=True, exist_ok=True)
    (site / "whl/torch/index.json").write_text(json.dumps(page))
    (site / "whl/torch/index.html").write_text(page_html)
    for repo in REPOS:
        folder = site / "repos" / repo
        folder.mkdir(parents=True, exist_ok=True)
        text = packages_index(repo)
        (folder / "Packages").write_text(text)
        (folder / "Packages.gz").write_bytes(gzip.compress(text.encode()))
    newest = "2.16.0" if newer else "2.15.0"
    variant_wheels(site, newest, VARIANTS[newest], changed)
    github_releases(site)
    return site


def _prefers_json(accept: str) -> bool:
    """PEP 691's negotiation: the JSON type when the client's q for it is at least its q for HTML."""
    q: dict[str, float] = {}
    for part in accept.split(","):
        kind, *params = (p.strip() for p in part.split(";"))
        weight = next((float(p[2:]) for p in params if p.startswith("q=")), 1.0)
        q[kind] = weight
    html_q = max(q.get("text/html", 0.0), q.get("application/vnd.pypi.simple.v1+html", 0.0), q.get("*/*", 0.0))
    return q.get(PEP691, 0.0) > 0 and q.get(PEP691, 0.0) >= html_q


class _Handler(BaseHTTPRequestHandler):
    site: Path
    requests: list[tuple[str, str]]

    def do_HEAD(self) -> None:  # uv asks for a wheel's headers before it reads it
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        accept = self.headers.get("Accept", "")
        self.requests.append((self.path, accept))
        path = self.site / unquote(self.path.split("?")[0]).lstrip("/")
        kind = "application/octet-stream"
        if self.path.endswith("/"):  # a simple-index page: JSON when the client prefers it (PEP 691)
            path, kind = (path / "index.json", PEP691) if _prefers_json(accept) else (path / "index.html", "text/html")
        elif "/pypi/" in f"/{self.path}":
            kind = "application/json"
        if not path.is_file():
            self.send_error(404, "Not Found")
            return
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve(site: Path, host: str = "127.0.0.1", port: int = 0) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """The site on `host`, at `port` (0: a free one): (base URL, the requests it answered)."""
    requests: list[tuple[str, str]] = []
    handler = type("Handler", (_Handler,), {"site": site, "requests": requests})
    server = ThreadingHTTPServer((host, port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()


def env(base: str) -> dict[str, str]:
    """The variables that point gpuprov's sources at the site."""
    return {"GPUPROV_PYPI_URL": base, "GPUPROV_PYTORCH_INDEX_URL": f"{base}/whl",
            "GPUPROV_NVIDIA_REPOS_URL": f"{base}/repos"}
