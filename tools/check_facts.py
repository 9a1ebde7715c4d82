#!/usr/bin/env python3
"""Compare gpuprov's facts with the indexes they come from; print every difference.

    tools/check_facts.py [--torch-index URL|PATH] [--nvidia-index DISTRO/ARCH=URL|PATH ...]
                         [--nvidia-repos BASE_URL]

- PyTorch: the wheel index's `torch/` page (default: `pytorch_index` in src/gpuprov/data/stack.yaml,
  plus `/torch/`) against stack.yaml `torch_releases` (CUDA variants and Python range per release).
- NVIDIA: each repository's `Packages` index against tests/shims/data/nvidia-repo.tsv (the names and
  versions the shims accept) and stack.yaml `driver_branches` (a branch needs its pinning package).
  Give each index with --nvidia-index, or give --nvidia-repos BASE (the URL that ends in
  /compute/cuda/repos) to read BASE/{ubuntu2204,ubuntu2404}/{x86_64,sbsa}/Packages.
  No index host is written in this file: URLs come from arguments or from the data files.

Exit status: 0 no difference, 1 differences printed, 2 an index could not be read.
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
import urllib.request
from collections import defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
STACK = ROOT / "src" / "gpuprov" / "data" / "stack.yaml"
REPO_DATA = ROOT / "tests" / "shims" / "data" / "nvidia-repo.tsv"
REPOS = ("ubuntu2204/x86_64", "ubuntu2204/sbsa", "ubuntu2404/x86_64", "ubuntu2404/sbsa")
WHEEL = re.compile(r"torch-(\d+)\.(\d+)\.\d+(?:\+(\w+))?-cp(\d)(\d+)-cp\d+\w*-(manylinux\w*x86_64|linux_x86_64)\.whl")
# the names whose versions we follow (everything else in NVIDIA's index is ignored)
FOLLOWED = re.compile(r"^(cuda-drivers(-\d+)?|nvidia-open|nvidia-fabricmanager(-\d+)?|libnvidia-nscq(-\d+)?|"
                      r"nvidia-imex(-\d+)?|libnvsdm(-\d+)?|nvidia-driver-pinning-[\d.]+|cuda-toolkit-\d+-\d+|nvlsm|cuda-keyring)$")


class IndexError_(Exception):
    pass


def read(source: str) -> str:
    """Text of a URL (http/https/file) or a local path; .gz is unpacked."""
    try:
        if re.match(r"^(https?|file)://", source):
            with urllib.request.urlopen(source, timeout=60) as r:
                data = r.read()
        else:
            data = Path(source).read_bytes()
    except OSError as e:
        raise IndexError_(f"cannot read {source}: {e}") from e
    if source.endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8", "replace")


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


# --- PyTorch ------------------------------------------------------------------------------------


def torch_index(html: str) -> dict[str, dict[str, set[str]]]:
    """release "2.9" -> {"variants": {"cu126", ...}, "python": {"3.10", ...}} from a wheel listing."""
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: {"variants": set(), "python": set()})
    for m in WHEEL.finditer(html):
        major, minor, local, py_major, py_minor = m.group(1), m.group(2), m.group(3), m.group(4), m.group(5)
        rel = out[f"{major}.{minor}"]
        if local and local.startswith("cu"):
            rel["variants"].add(local)
        rel["python"].add(f"{py_major}.{py_minor}")
    return dict(out)


def check_torch(stack: dict, index: dict[str, dict[str, set[str]]]) -> list[str]:
    diffs: list[str] = []
    known = stack["torch_releases"]
    if not index:
        return ["torch: the index lists no x86_64 torch wheel"]
    oldest = min(index, key=_v)  # an excerpt (or a trimmed index) starts later than stack.yaml
    for rel in sorted(set(known) | set(index), key=_v):
        if _v(rel) < _v(oldest):
            continue
        if rel not in index:
            diffs.append(f"torch {rel}: in stack.yaml, no wheel on the index")
            continue
        seen = index[rel]
        if rel not in known:
            diffs.append(f"torch {rel}: on the index ({', '.join(sorted(seen['variants'], key=_v))}; Python "
                         f"{min(seen['python'], key=_v)}-{max(seen['python'], key=_v)}), not in stack.yaml")
            continue
        want = set(known[rel]["variants"])
        if want - seen["variants"]:
            diffs.append(f"torch {rel}: stack.yaml lists {', '.join(sorted(want - seen['variants'], key=_v))}, "
                         "the index has no such wheel")
        if seen["variants"] - want:
            diffs.append(f"torch {rel}: the index has {', '.join(sorted(seen['variants'] - want, key=_v))}, "
                         "stack.yaml does not list it")
        lo, hi = known[rel]["python"]
        have = (min(seen["python"], key=_v), max(seen["python"], key=_v))
        if (lo, hi) != have:
            diffs.append(f"torch {rel}: stack.yaml says Python {lo}-{hi}, the index has {have[0]}-{have[1]}")
    return diffs


# --- NVIDIA's repository ------------------------------------------------------------------------


def packages_index(text: str) -> dict[str, set[str]]:
    """name -> versions (and virtual name -> {"virtual"}) from a Debian Packages index."""
    out: dict[str, set[str]] = defaultdict(set)
    for stanza in re.split(r"\n\s*\n", text):
        fields = dict(re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, re.M))
        if "Package" in fields and "Version" in fields:
            out[fields["Package"]].add(fields["Version"])
            for virtual in re.split(r"\s*,\s*", fields.get("Provides", "")):
                if virtual:
                    out.setdefault(virtual.split()[0], set())
    return dict(out)


def repo_data(repo: str) -> dict[str, set[str]]:
    """name -> versions ("?" for any) that tests/shims/data/nvidia-repo.tsv gives `repo`."""
    distro, arch = repo.split("/")
    out: dict[str, set[str]] = defaultdict(set)
    for line in REPO_DATA.read_text().splitlines():
        if not line or line.startswith(("#", "@")):
            continue
        repos, name, version, provides, *_ = line.split("\t")
        if repos == "*" or {repo, distro, arch} & set(repos.split(",")):
            out[name].add(version)
            if provides != "-":
                out.setdefault(provides, set())  # a virtual name: no versions of its own
    return dict(out)


def check_nvidia(stack: dict, repo: str, index: dict[str, set[str]]) -> list[str]:
    diffs: list[str] = []
    data = repo_data(repo)
    branches = {str(b) for b in stack["driver_branches"]}
    for name, versions in sorted(data.items()):
        if name not in index:
            diffs.append(f"{repo}: {name}: in nvidia-repo.tsv, not in the index")
            continue
        if not versions:
            continue  # virtual on both sides
        for version in sorted(versions - {"?"}, key=_v):
            if version not in index[name]:
                diffs.append(f"{repo}: {name} {version}: in nvidia-repo.tsv, not in the index")
    for name, versions in sorted(index.items()):
        if not FOLLOWED.match(name):
            continue
        if name not in data:
            diffs.append(f"{repo}: {name}: in the index ({', '.join(sorted(versions, key=_v)[-3:]) or 'virtual'}), "
                         "not in nvidia-repo.tsv")
            continue
        if "?" in data[name] or not versions:
            continue
        new = sorted((v for v in versions - data[name] if v.split(".")[0] in branches), key=_v)
        if new:
            diffs.append(f"{repo}: {name}: in the index, not in nvidia-repo.tsv: {', '.join(new)}")
    for branch in sorted(branches, key=_v):
        if f"nvidia-driver-pinning-{branch}" not in index and int(branch) >= 570:
            diffs.append(f"{repo}: R{branch} is in stack.yaml driver_branches, the index has no "
                         f"nvidia-driver-pinning-{branch}")
    return diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch-index", help="the torch wheel listing (URL or file); default: stack.yaml pytorch_index + /torch/")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    ap.add_argument("--nvidia-index", action="append", default=[], metavar="DISTRO/ARCH=URL|PATH",
                    help="a repository's Packages index (repeat per repository)")
    ap.add_argument("--nvidia-repos", metavar="BASE", help="read BASE/DISTRO/ARCH/Packages for the four repositories")
    args = ap.parse_args(argv)
    stack = yaml.safe_load(STACK.read_text())
    diffs: list[str] = []
    try:
        if not args.no_torch:
            source = args.torch_index or stack["pytorch_index"].rstrip("/") + "/torch/"
            diffs += check_torch(stack, torch_index(read(source)))
        indexes = [tuple(spec.split("=", 1)) for spec in args.nvidia_index]
        if args.nvidia_repos:
            indexes += [(repo, f"{args.nvidia_repos.rstrip('/')}/{repo}/Packages") for repo in REPOS]
        for repo, source in indexes:
            if repo not in REPOS:
                print(f"unknown repository {repo} (one of {', '.join(REPOS)})", file=sys.stderr)
                return 2
            diffs += check_nvidia(stack, repo, packages_index(read(source)))
    except IndexError_ as e:
        print(e, file=sys.stderr)
        return 2
    for line in diffs:
        print(line)
    if not diffs:
        print("no differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
