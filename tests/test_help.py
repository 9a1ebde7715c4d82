"""`--help` as a reader at an 80-column terminal meets it: every line fits, `gpuprov --help` names every command
group, `up`'s options stand under headings with none left out, every command ends with examples that parse as
written, and docs/cli.md (tools/cli_reference.py) is what the commands print now."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path
from types import ModuleType

import click
import pytest
from click.testing import CliRunner

from gpuprov.cli import main
from gpuprov.cli.examples import EXAMPLES
from gpuprov.cli.help import SECTIONS
from gpuprov.cli.lazy import COMMANDS

ROOT = Path(__file__).resolve().parents[1]


def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "tools" / "cli_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PAGES = reference().pages()


@pytest.mark.parametrize(("path", "text"), PAGES, ids=[p for p, _ in PAGES])
def test_every_help_line_fits_80_columns(path: str, text: str) -> None:
    assert [line for line in text.splitlines() if len(line) > 80] == []


def test_a_wide_terminal_still_gets_80_columns() -> None:
    result = CliRunner().invoke(main, ["up", "--help"], env={"COLUMNS": "200"}, prog_name="gpuprov")
    assert result.exit_code == 0
    assert max(len(line) for line in result.output.splitlines()) <= 80


def test_the_top_level_index_names_every_command() -> None:
    text = dict(PAGES)["gpuprov"]
    index = text.split("A day:")[0]
    assert {name for name in COMMANDS if not re.search(rf"\b{name}\b", index)} == set()


def test_up_lists_every_option_under_a_heading() -> None:
    text = dict(PAGES)["gpuprov up"]
    headings = [heading for heading, _ in SECTIONS["up"]]
    assert [h for h in headings if f"\n{h}:\n" not in text] == []
    assert "Other options:" not in text  # every option of up is under one of its headings
    assert "\nOptions:\n" not in text


@pytest.mark.parametrize("path", [p for p, _ in PAGES if p != "gpuprov"])
def test_every_command_has_examples_that_parse(path: str) -> None:
    words = path.split()[1:]
    examples = EXAMPLES.get(" ".join(words), ())
    assert 1 <= len(examples) <= 2, f"{path}: give it one or two examples in gpuprov/cli/examples.py"
    assert "\nExamples:\n" in dict(PAGES)[path]
    for example in examples:
        argv = shlex.split(example, comments=True)
        if argv[0] != "gpuprov":  # a shell line around gpuprov (completion's eval)
            continue
        cut = next((i for i, w in enumerate(argv) if w in (">", "|")), len(argv))
        argv = argv[1:cut]
        ctx = click.Context(main, info_name="gpuprov")
        cmd: click.Command | None = main
        args = argv
        while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
            cmd, args = cmd.get_command(ctx, args[0]), args[1:]
            assert cmd is not None, example
            if isinstance(cmd, click.Group) and args:
                ctx = click.Context(cmd, info_name=argv[0], parent=ctx)
        assert cmd is not None
        with cmd.make_context(cmd.name, list(args), parent=ctx):  # an unknown option or a bad value raises
            pass


def test_the_cli_reference_is_current() -> None:
    assert (ROOT / "docs" / "cli.md").read_text() == reference().render(), (
        "docs/cli.md is stale: run .venv/bin/python tools/cli_reference.py")
