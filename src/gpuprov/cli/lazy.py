"""`gpuprov`'s commands, each module imported when one of its commands is asked for.

Importing every command module at start made each command pay for all the others' imports and option
decorators: `gpuprov bootstrap`
needs `gpuprov.cli.hosts` only. This is Click's documented lazy loading (a group whose `get_command` imports
on demand and whose `list_commands` names commands not yet imported); the modules still register their
commands with `@main.command()` as they did.
"""

from __future__ import annotations

import importlib

import click

# command name → the module of gpuprov.cli that defines it (tests/test_startup.py checks it against the modules)
COMMANDS: dict[str, str] = {
    "autostop": "guardrails", "ttl": "guardrails",
    "bench": "hosts", "bootstrap": "hosts", "check": "hosts", "doctor": "hosts",
    "capacity": "capacity",
    "cluster": "clusters",
    "completion": "settings", "config": "settings",
    "down": "cloud", "start": "cloud", "status": "cloud", "stop": "cloud", "up": "cloud",
    "exec": "access", "jupyter": "access", "monitor": "access", "ssh": "access", "sync": "access",
    "torchrun": "access", "tunnel": "access",
    "facts": "facts",
    "gc": "gc",
    "gpus": "offline", "plan": "offline", "render": "offline",
    "image": "images",
    "metrics": "metrics",
    "state": "team", "team": "team",
}


def load_all() -> None:
    """Every command module (help listings, completion of command names, the tests)."""
    for module in sorted(set(COMMANDS.values())):
        importlib.import_module(f"gpuprov.cli.{module}")


class LazyGroup(click.Group):
    """A group whose commands' modules are imported when a command is looked up. `gpuprov --help` and the
    completion of command names look every command up (each one's short help is its own docstring), so
    they import them all, as before; running one command imports its own module only."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(f"gpuprov.cli.{COMMANDS[cmd_name]}")  # its decorators add its commands here
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in COMMANDS:
            load_all()  # a name no command has: Click's "did you mean" picks among the commands imported
        return super().resolve_command(ctx, args)
