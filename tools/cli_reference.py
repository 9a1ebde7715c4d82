"""Write docs/cli.md, every gpuprov command's `--help` as Click prints it at 80 columns, from the commands
themselves: `.venv/bin/python tools/cli_reference.py` (tests/test_help.py fails when the file is stale).

    tools/cli_reference.py            # rewrite docs/cli.md
    tools/cli_reference.py --check    # exit 1 when docs/cli.md is not what this would write
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "cli.md"


def pages() -> list[tuple[str, str]]:
    """(command path, its help text) for `gpuprov` and every command and subcommand, in listing order."""
    from gpuprov.cli import main
    from gpuprov.cli.lazy import load_all

    load_all()
    found: list[tuple[str, str]] = []

    def walk(cmd: click.Command, path: list[str], parent: click.Context | None) -> None:
        ctx = click.Context(cmd, info_name=path[-1], parent=parent, terminal_width=80, max_content_width=80)
        found.append((" ".join(path), cmd.get_help(ctx)))
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*path, name], ctx)

    walk(main, ["gpuprov"], None)
    return found


def render() -> str:
    found = pages()
    lines = ["# Command reference", "",
             "Every command's `--help`, generated from the commands by `tools/cli_reference.py`; do not edit by hand.",
             ""]
    lines += [f"- [`{path}`](#{path.replace(' ', '-')})" for path, _ in found]
    for path, text in found:
        lines += ["", f"## {path}", "", "```text", text.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if OUT.exists() and OUT.read_text() == text:
            return 0
        print(f"{OUT.relative_to(ROOT)} is stale: run .venv/bin/python tools/cli_reference.py", file=sys.stderr)
        return 1
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
