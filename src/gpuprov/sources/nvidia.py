"""NVIDIA's CUDA repository for Ubuntu, from its `Packages` index per OS and architecture
(`<repos>/ubuntu2404/x86_64/Packages.gz`, as apt reads it): which CUDA toolkits each OS's repository carries
(`cuda-toolkit-X-Y`), which driver releases it has (`nvidia-open` and `cuda-drivers` versions), and which
pinning packages (`nvidia-driver-pinning-<branch>` and `-<version>`) exist. These become stack.yaml's
`repo_toolkits`, `driver_versions`, `driver_pinning` and `driver_branches` (family drivers).

Packages.gz is read, else Packages.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from gpuprov.sources import http

# (stack.yaml's OS name, the repository's folder) for the architectures gpuprov plans for
REPOS = (("ubuntu-22.04", "ubuntu2204/x86_64"), ("ubuntu-24.04", "ubuntu2404/x86_64"))
TOOLKIT = re.compile(r"^cuda-toolkit-(\d+)-(\d+)$")
PIN_BRANCH = re.compile(r"^nvidia-driver-pinning-(\d{3})$")
PIN_VERSION = re.compile(r"^nvidia-driver-pinning-(\d{3}\.\d+(?:\.\d+)?)$")
DRIVERS = ("nvidia-open", "cuda-drivers")


@dataclass(frozen=True)
class Stanza:
    package: str
    version: str
    provides: tuple[str, ...]


def parse_packages(text: str) -> list[Stanza]:
    """The stanzas of a Debian `Packages` index (Package, Version, Provides; continuation lines skipped)."""
    out = []
    for block in re.split(r"\n[ \t]*\n", text):
        fields = dict(re.findall(r"^([A-Za-z][A-Za-z0-9-]*):[ \t]*(.*)$", block, re.M))
        if "Package" in fields and "Version" in fields:
            provides = tuple(p.split()[0] for p in re.split(r"\s*,\s*", fields.get("Provides", "")) if p.strip())
            out.append(Stanza(fields["Package"].strip(), fields["Version"].strip(), provides))
    return out


def read_repo(base: str, folder: str) -> tuple[list[Stanza], str]:
    """One repository's index (Packages.gz, else Packages) and the URL it came from."""
    try:
        url = f"{base}/{folder}/Packages.gz"
        return parse_packages(http.get(url).text()), url
    except http.SourceUnreachable as first:
        if first.status != 404:
            raise
    url = f"{base}/{folder}/Packages"
    return parse_packages(http.get(url).text()), url


def upstream(version: str) -> str:
    """'595.71.05-0ubuntu1' -> '595.71.05'."""
    return version.split(":", 1)[-1].rsplit("-", 1)[0]


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def values(base: str, snapshot: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The drivers family's values from every repository's index, and the URLs read; SourceUnreachable if one is not."""
    toolkits: dict[str, list[str]] = {}
    releases: dict[int, set[str]] = defaultdict(set)
    pin_branches: set[int] = set()
    pin_versions: set[str] = set()
    urls = []
    for os_name, folder in REPOS:
        stanzas, url = read_repo(base, folder)
        urls.append(url)
        toolkits[os_name] = sorted({f"{m[1]}.{m[2]}" for s in stanzas if (m := TOOLKIT.match(s.package))}, key=_v)
        for s in stanzas:
            if s.package in DRIVERS:
                releases[int(upstream(s.version).split(".")[0])].add(upstream(s.version))
            elif m := PIN_BRANCH.match(s.package):
                pin_branches.add(int(m[1]))
            elif m := PIN_VERSION.match(s.package):
                pin_versions.add(m[1])
    pinning = dict(snapshot["driver_pinning"])
    first = int(pinning["from_branch"])
    pinning.update(exact_versions=sorted(pin_versions, key=_v), branches=sorted(pin_branches),
                   source=f"the nvidia-driver-pinning-* packages in {', '.join(map(http.described, urls))}",
                   unverified=None)
    return {
        "repo_toolkits": toolkits,
        "repo_toolkits_unverified": None,
        "driver_versions": {b: sorted(v, key=_v) for b, v in sorted(releases.items()) if b >= first},
        "driver_versions_unverified": None,
        "driver_pinning": pinning,
        "driver_branches": sorted(set(snapshot["driver_branches"]) | {b for b in releases if b >= first}),
    }, tuple(urls)
