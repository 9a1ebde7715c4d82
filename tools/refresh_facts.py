#!/usr/bin/env python3
"""Regenerate gpuprov's shipped snapshot (src/gpuprov/data/stack.yaml, catalog.yaml) from the facts' sources,
with the code `gpuprov facts refresh` runs (gpuprov.sources.refresh), and print the diff.

    tools/refresh_facts.py [--only torch|drivers|instance-types ...] [--region R ...] [--check]

Only the rows a source changed are rewritten (a row's comments stay above it), new rows go at the end of their
block, and `families.<name>` records the new read date and sources. --check writes nothing and exits 1 when
the snapshot differs from the sources. The sources' URLs are gpuprov's own (GPUPROV_PYPI_URL,
GPUPROV_PYTORCH_INDEX_URL, GPUPROV_NVIDIA_REPOS_URL move them); instance types need AWS credentials.
Exit status: 0 nothing to change (or written), 1 differences with --check, 2 a source did not answer.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "gpuprov" / "data"
sys.path.insert(0, str(ROOT / "src"))

import os  # noqa: E402
import tempfile  # noqa: E402

# the snapshot is compared with the sources alone, whatever this machine's own refresh left in its data folder
os.environ["GPUPROV_FACTS_DIR"] = tempfile.mkdtemp(prefix="refresh-facts-")

from gpuprov.plan import facts  # noqa: E402
from gpuprov.sources import refresh  # noqa: E402

ROW_DEFAULTS = {"efa": False, "efa_interfaces": None, "network_cards": 1, "efa_cards": 1, "efa_card0": True}


PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
RESERVED = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"}


def flow(value: Any) -> str:
    """A value as one line of YAML flow style, in the data files' own way: words plain, other strings quoted."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if PLAIN.fullmatch(value) and value.lower() not in RESERVED else json.dumps(value)
    return repr(value)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def block(lines: list[str], key: str, indent: int = 0, start: int = 0, end: int | None = None) -> tuple[int, int]:
    """[first, last) lines of `key:` at `indent` within lines[start:end], trailing comments and blanks left out."""
    end = len(lines) if end is None else end
    head = next(i for i in range(start, end) if lines[i].startswith(" " * indent + f"{key}:")
                and _indent(lines[i]) == indent)
    stop = head + 1
    while stop < end and (not lines[stop].strip() or _indent(lines[stop]) > indent
                          or (lines[stop].lstrip().startswith("#") and indent > 0 and _indent(lines[stop]) >= indent)):
        stop += 1
    while stop > head + 1 and (not lines[stop - 1].strip() or lines[stop - 1].lstrip().startswith("#")):
        stop -= 1
    return head, stop


def children(lines: list[str], head: int, stop: int) -> list[tuple[int, int]]:
    """The entries of a block: each one's first line (indent 2 more than the block's) and its continuation lines."""
    inner = _indent(lines[head]) + 2
    starts = [i for i in range(head + 1, stop) if _indent(lines[i]) == inner and not lines[i].lstrip().startswith("#")
              and lines[i].strip()]
    out = []
    for n, first in enumerate(starts):
        last = starts[n + 1] if n + 1 < len(starts) else stop
        while last > first + 1 and ((lines[last - 1].lstrip().startswith("#") and _indent(lines[last - 1]) == inner)
                                    or not lines[last - 1].strip()):
            last -= 1
        out.append((first, last))
    return out


def edit_mapping(lines: list[str], key: str, value: dict[str, Any]) -> list[str]:
    """Rewrite the entries of `key:` (a mapping of rows) that changed, drop the gone, add the new at the end."""
    head, stop = block(lines, key)
    pad = " " * (_indent(lines[head]) + 2)
    entries = {}
    for first, last in children(lines, head, stop):
        name = re.match(r'\s*"?([^":]+)"?:', lines[first])
        entries[name[1] if name else lines[first]] = (first, last)
    out = lines[:head + 1]
    cursor = head + 1
    for name, (first, last) in entries.items():
        out += lines[cursor:first]
        cursor = last
        want = value.get(name) if name in value else value.get(_as_key(name, value))
        if want is None:
            continue  # gone
        old = yaml.safe_load("\n".join(line[len(pad):] for line in lines[first:last]))
        old_value = next(iter(old.values())) if isinstance(old, dict) else None
        if _same(old_value, want):
            out += lines[first:last]
        else:
            quoted = lines[first].lstrip().startswith('"')
            out.append(f'{pad}{_key(name, quoted)}: {flow(want)}')
    out += lines[cursor:stop]
    known = {str(k) for k in entries}
    out += [f'{pad}{_key(str(k), isinstance(k, str) and "." in k)}: {flow(v)}' for k, v in value.items()
            if str(k) not in known]
    return out + lines[stop:]


def _as_key(name: str, value: dict[Any, Any]) -> Any:
    return next((k for k in value if str(k) == name), name)


def _key(name: str, quoted: bool) -> str:
    return f'"{name}"' if quoted else name


def _same(a: Any, b: Any) -> bool:
    return yaml.safe_load(yaml.safe_dump(a, sort_keys=True)) == yaml.safe_load(yaml.safe_dump(b, sort_keys=True))


def edit_rows(lines: list[str], key: str, rows: list[dict[str, Any]], by: str | None) -> list[str]:
    """A list block of flow-mapping rows: rows (matched by `by`) that changed rewritten, new ones appended."""
    head, stop = block(lines, key)
    pad = " " * (_indent(lines[head]) + 2)
    out = lines[:head + 1]
    cursor = head + 1
    seen = []
    for first, last in children(lines, head, stop):
        out += lines[cursor:first]
        cursor = last
        old = yaml.safe_load("\n".join(line[len(pad):] for line in lines[first:last]))[0]
        seen.append(old)
        new = next((r for r in rows if by and r.get(by) == old.get(by)), old if by else None)
        if new is None and not by:
            new = old
        out += lines[first:last] if new is None or _same(old, new) else [f"{pad}- {flow(new)}"]
    out += lines[cursor:stop]
    out += [f"{pad}- {flow(r)}" for r in rows if not any((by and s.get(by) == r.get(by)) or _same(s, r) for s in seen)]
    return out + lines[stop:]


def edit_scalar(lines: list[str], key: str, value: Any) -> list[str]:
    """`key: value` on one line (a None value removes the key), its block replaced whole."""
    try:
        head, stop = block(lines, key)
    except StopIteration:
        return lines if value is None else [*lines, f"{key}: {flow(value)}"]
    return lines[:head] + ([] if value is None else [f"{key}: {flow(value)}"]) + lines[stop:]


def edit_family(lines: list[str], name: str, overlay: facts.Overlay) -> list[str]:
    head, stop = block(lines, "families")
    sub_head, sub_stop = block(lines, name, indent=2, start=head + 1, end=stop)
    source = "; ".join(overlay.sources)
    new = [f"  {name}:", f'    read: "{overlay.read.date().isoformat()}"', "    source: >-",
           *(f"      {chunk}" for chunk in _wrap(f"{source} (tools/refresh_facts.py)", 110))]
    if overlay.unverified:
        new += ["    unverified: >-", *(f"      {chunk}" for chunk in _wrap("; ".join(overlay.unverified), 110))]
    return lines[:sub_head] + new + lines[sub_stop:]


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]


def apply(text: str, result: refresh.Result) -> str:
    """The data file's text with one family's overlay written into it."""
    assert result.overlay is not None
    lines = text.splitlines()
    for key, value in result.overlay.values.items():
        if key == "instance_types":
            current = yaml.safe_load(text)["instance_types"]
            merged = facts.merge_instance_types(current, value, result.overlay.read)
            compact = [{k: v for k, v in row.items() if not (k in ROW_DEFAULTS and v == ROW_DEFAULTS[k])}
                       for row in merged]
            lines = edit_rows(lines, key, compact, by="name")
        elif key == "wheel_archs":
            lines = edit_rows(lines, key, value, by=None)
        elif key in ("torch_releases", "driver_versions", "repo_toolkits"):
            lines = edit_mapping(lines, key, value)
        elif key == "driver_pinning":
            head, stop = block(lines, key)
            sub = lines[head:stop]
            for name in ("exact_versions", "branches", "unverified", "source"):
                if name in value:
                    sub = _edit_sub(sub, name, value[name])
            lines = lines[:head] + sub + lines[stop:]
        else:
            lines = edit_scalar(lines, key, value)
    lines = edit_family(lines, result.family, result.overlay)
    return "\n".join(lines) + "\n"


def _edit_sub(sub: list[str], name: str, value: Any) -> list[str]:
    try:
        head, stop = block(sub, name, indent=2, start=1)
    except StopIteration:
        return sub if value is None else [*sub, f"  {name}: {flow(value)}"]
    return sub[:head] + ([] if value is None else [f"  {name}: {flow(value)}"]) + sub[stop:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", choices=refresh.REFRESHABLE, help="a family (repeat for more)")
    ap.add_argument("--region", action="append", default=[], help="EC2 region for instance types (default us-east-1)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when the snapshot differs")
    ap.add_argument("--data", type=Path, default=DATA, help="the folder of stack.yaml and catalog.yaml to rewrite")
    args = ap.parse_args(argv)
    names = args.only or list(refresh.REFRESHABLE)

    def provider() -> Any:
        from gpuprov.cloud.providers.aws import AwsProvider

        return AwsProvider("gpuprov-refresh-facts")

    results = refresh.read_all(names, provider, args.region or ["us-east-1"])
    failed = [r for r in results if not r.ok]
    for r in failed:
        print(f"{r.family}: not read: {r.error}", file=sys.stderr)
    texts = {f: (args.data / f).read_text() for f in ("stack.yaml", "catalog.yaml")}
    new = dict(texts)
    for r in results:
        if r.ok:
            file = facts.BY_NAME[r.family].file
            new[file] = apply(new[file], r)
    changed = False
    for file, text in new.items():
        yaml.safe_load(text)  # still YAML
        diff = list(difflib.unified_diff(texts[file].splitlines(), text.splitlines(), f"a/data/{file}", f"b/data/{file}",
                                         lineterm=""))
        if diff:
            changed = True
            print("\n".join(diff))
            if not args.check:
                (args.data / file).write_text(text)
    if not changed:
        print("the snapshot agrees with the sources read")
    if failed:
        return 2
    return 1 if changed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
