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
    "gpus": "offline", "plan": "offline", "render": "offline", "bundle": "offline",
    "image": "images",
    "metrics": "metrics",
    "state": "team", "team": "team",
}


# command name → its short help, as `gpuprov --help` lists it (each command's first sentence), so the listing
# imports no command module; tests/test_startup.py checks each against the command's own docstring
SUMMARIES: dict[str, str] = {
    'autostop': ('Change the idle autostop of a running node or a bootstrapped host: `gpuprov autostop NAME 2h`, or '
        '`off`.'
    ),
    'bench': "Did I get what I pay for: measure each GPU and judge it against NVIDIA's published figures.",
    'bootstrap': "Install the playbook's stack on existing hosts over SSH, then verify it.",
    'bundle': 'Download what a plan installs into DIR, for `bootstrap HOST --offline DIR` on a host with no network.',
    'capacity': ("Capacity Blocks for ML (GPU capacity bought ahead for a window) and the account's Capacity "
        'Reservations.'
    ),
    'check': 'Verify hosts: nvidia-smi, /dev/nvidia*, torch.cuda and a matmul on every GPU, judged.',
    'cluster': 'Recorded clusters: those of existing hosts (`bootstrap --cluster`) and launched ones (`up --nodes`).',
    'completion': 'Print the shell completion script: commands, options, node names, GPU names and playbooks.',
    'config': 'Show the defaults in effect and where each comes from: environment, config file, built-in.',
    'doctor': "Find why a host's GPU stack is broken: each finding names the cause and the fix.",
    'down': ('Terminate nodes and remove everything they own: instance, spot request, security group, volumes, ssh'
        " config entry (and the key pair with the region's last node)."
    ),
    'exec': 'Run a command on one or many hosts at once, streaming each line prefixed by its host.',
    'facts': 'The facts gpuprov plans with: each family, where it came from, how old it is, what is unverified.',
    'gc': ("Find resources tagged as yours that no local node owns (left by a crash or another machine's lost "
        'state); list them, and delete them with --yes.'
    ),
    'gpus': 'List the GPUs gpuprov knows, with the AWS instance types that carry them and their prices.',
    'image': "Baked images: a node's installed stack as an AMI, so the next `up` skips those steps.",
    'jupyter': "Open a node's JupyterLab through an SSH tunnel and print its URL with the token.",
    'metrics': 'GPU metrics for Prometheus and Grafana: scrape targets, the tunnels to them, a dashboard.',
    'monitor': 'Live GPU utilisation, memory, temperature and power of several hosts (like `watch nvidia-smi`).',
    'plan': 'Show what `up` would launch and install, without touching the network.',
    'render': 'Write the bootstrap bundle: one script per step plus manifest.json (sha256 + resolved stack).',
    'ssh': 'A shell on a node or host through the system ssh, its host key pinned (`-- CMD` runs CMD).',
    'start': ('Start a stopped node (resized first with --gpu/--instance-type), wait for it, bootstrap and verify '
        'again, and print its new address and $/h.'
    ),
    'state': "Where the records live: the local file, or a team's S3 bucket (config `state`, GPUPROV_STATE).",
    'status': 'Nodes gpuprov manages: state, address, $/h, $ so far, age.',
    'stop': 'Stop nodes: compute billing ends, the disk is kept; `gpuprov start NAME` resumes.',
    'sync': 'Copy files to or from a host with rsync over the same pinned SSH settings.',
    'team': "Working as a team: your public key for everyone's nodes, and the keys pushed to a node again.",
    'torchrun': 'Run torchrun on every node of a cluster, wired for it; output prefixed by node.',
    'ttl': ('Give a running node or a host bootstrapped with --ttl a new deadline: `gpuprov ttl NAME 4h` (from '
        'now), or `off`.'
    ),
    'tunnel': 'Forward a local port to a port on the host (SSH local forwarding) until Ctrl-C.',
    'up': 'Launch a GPU node on AWS, bootstrap and verify it, and print how to connect.',
}


def load_all() -> None:
    """Every command module (help listings, completion of command names, the tests)."""
    for module in sorted(set(COMMANDS.values())):
        importlib.import_module(f"gpuprov.cli.{module}")


class LazyGroup(click.Group):
    """A group whose commands' modules are imported when a command is looked up. `gpuprov --help` lists every
    command from SUMMARIES without importing one; running a command imports its own module only."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(f"gpuprov.cli.{COMMANDS[cmd_name]}")  # its decorators add its commands here
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Click's listing, each short help cut to the terminal's width as Click cuts it, from the table."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            # a command not imported yet stands in by its summary, cut by Click's own rule
            cmd = self.commands.get(name) or click.Command(name, help=SUMMARIES[name])
            if not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in COMMANDS:
            load_all()  # a name no command has: Click's "did you mean" picks among the commands imported
        return super().resolve_command(ctx, args)
