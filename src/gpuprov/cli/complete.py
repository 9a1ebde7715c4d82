"""Shell completion (Click's protocol; `gpuprov completion bash|zsh|fish` prints the script): commands,
options, node and cluster names, GPU names, playbooks, OS names, regions, driver branches, torch releases and
wheel variants, each from the same tables the options are checked against."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gpuprov.errors import GpuprovError

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem


def _matching(words: list[str], incomplete: str) -> list[CompletionItem]:
    from click.shell_completion import CompletionItem

    return [CompletionItem(w) for w in words if w.lower().startswith(incomplete.lower())]


def complete_gpu(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from gpuprov.plan import catalog

    return _matching([g.name for g in catalog.load().gpus], incomplete)


def complete_playbook(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from click.shell_completion import CompletionItem

    from gpuprov.plan.spec import shipped_playbooks

    if "/" in incomplete or incomplete.startswith("."):
        return [CompletionItem(incomplete, type="file")]
    return _matching(shipped_playbooks(), incomplete)


def complete_os(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from gpuprov.plan.stack import SUPPORTED_OS

    return _matching(list(SUPPORTED_OS), incomplete)


def complete_region(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from gpuprov.plan import catalog

    return _matching(list(catalog.load().regions), incomplete)


def complete_driver(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from gpuprov.plan.stack import facts

    return _matching([str(b) for b in facts().installable_branches()], incomplete.upper().removeprefix("R"))


def complete_torch(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from gpuprov.plan.stack import facts

    return _matching(list(facts().torch_releases), incomplete)


def complete_torch_cuda(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from gpuprov.plan.stack import facts

    return _matching(sorted({v for r in facts().torch_releases.values() for v in r.variants}), incomplete)


def complete_node(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    try:
        return _matching(node_names() + cluster_names(), incomplete)
    except GpuprovError:  # no readable state: nothing to offer, and no error in the middle of a prompt
        return []


def node_names() -> list[str]:
    """The names of the nodes gpuprov manages: the team bucket's under team state (read each time), else the
    local file's (none without one, which is not made for asking)."""
    from gpuprov.paths import state_folder
    from gpuprov.state.url import configured

    if configured() is None and not (state_folder() / "state.sqlite").exists():
        return []
    from gpuprov.state import open_store

    return [n.name for n in open_store().nodes()]


def cluster_names() -> list[str]:
    from gpuprov.cluster import names

    return names()
