"""The installers' pins read from their origin: uv's and Miniforge's newest GitHub release (the releases API's
`latest`) and the `.sha256` file GitHub serves beside each of its assets, per CPU. `facts refresh --only installers`
keeps them in the facts folder's installers.yaml (plan/sources.installers reads it), each with where and when it was
read. A release the API does not name is looked for at the pinned version; where no sum can be read, the pin in
effect is kept and the refresh says so.

GPUPROV_GITHUB_URL and GPUPROV_GITHUB_API_URL point both elsewhere (the tests' stand-in on 127.0.0.1).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime

from gpuprov.plan.sources import Installer
from gpuprov.sources import http

GITHUB = ("GPUPROV_GITHUB_URL", "https://github.com")
GITHUB_API = ("GPUPROV_GITHUB_API_URL", "https://api.github.com")
# each refreshable installer: its GitHub repository and its release asset per CPU (`uname -m`), as the
# python-env step downloads it (plan/sources.py: the uv and miniforge keys)
RELEASES = {"uv": ("astral-sh/uv", "uv-{arch}-unknown-linux-musl.tar.gz"),
            "miniforge": ("conda-forge/miniforge", "Miniforge3-{version}-Linux-{arch}.sh")}
VERSION = re.compile(r"^[0-9][0-9A-Za-z.+-]{0,40}$")


@dataclass(frozen=True)
class Reading:
    key: str
    installer: Installer | None  # None: no sum could be read, the pin in effect is kept
    note: str = ""


def newest(repo: str) -> str:
    """The tag of the repository's latest release (GitHub's releases API), or SourceUnreachable."""
    url = f"{http.base_url(GITHUB_API)}/repos/{repo}/releases/latest"
    answer = http.get(url, "application/vnd.github+json")
    try:
        tag = str(json.loads(answer.text())["tag_name"])
    except (ValueError, KeyError, TypeError) as exc:
        raise http.SourceUnreachable(url, f"no release tag in its answer ({exc})") from None
    if not VERSION.fullmatch(tag):
        raise http.SourceUnreachable(url, f"{tag!r} is not a release version")
    return tag


def sums(repo: str, asset: str, version: str, archs: list[str]) -> tuple[dict[str, str], str]:
    """Each CPU's sha256 from the release's `<asset>.sha256` file, and the URL pattern they were read at."""
    base = f"{http.base_url(GITHUB)}/{repo}/releases/download/{version}"
    out = {}
    for arch in archs:
        url = f"{base}/{asset.format(arch=arch, version=version)}.sha256"
        words = http.get(url).text().split()
        if not words or not re.fullmatch(r"[0-9a-fA-F]{64}", words[0]):
            raise http.SourceUnreachable(url, "not a sha256 file")
        out[arch] = words[0].lower()
    return out, f"{base}/{asset.format(arch='{arch}', version=version)}.sha256"


def read(key: str, pinned: Installer, now: datetime) -> Reading:
    """`key`'s newest release and its sums, else the pinned release's sums, else the pin kept (said why)."""
    repo, asset = RELEASES[key]
    try:
        version, how = newest(repo), "the latest release"
    except http.SourceUnreachable as exc:
        version, how = pinned.version, f"the pinned release (no latest: {exc})"
    try:
        got, where = sums(repo, asset, version, sorted(pinned.sha256))
    except http.SourceUnreachable as exc:
        return Reading(key, None, f"{key}: not reachable ({exc}): kept the pin, {pinned.version}")
    source = f"{repo} release {version}'s .sha256 files ({where}), {how}, read {now.date().isoformat()}"
    return Reading(key, Installer(version=version, sha256=got, source=source),
                   "" if how == "the latest release" else f"{key}: read at {how}")
