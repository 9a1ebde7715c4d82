"""`up`'s many options under headings in its `--help` (SectionedCommand); the examples every command's help
ends with are in examples.py.

Click has no option groups: SectionedCommand is Click's own format_options, once per heading.
"""

from __future__ import annotations

import click

from gpuprov.cli.params import Command

# a command's options under headings, in this order; an option no heading names goes under "Other options"
SECTIONS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "up": (
        ("Launch", ("cloud", "gpu", "count", "cpu", "memory_gib", "spot", "persistent", "spot_duration", "fallback",
                    "region", "instance_type", "max_hourly", "max_price", "disk_gb", "image", "reservation",
                    "capacity_block", "wait_for")),
        ("Stack", ("playbook", "os_name", "driver", "cuda", "torch_version", "torch_cuda", "python", "jupyter",
                   "docker", "sources", "arch", "cache_host", "cache_port", "keep_cache")),
        ("Access", ("ssh_cidr", "connect", "subnet", "ssh_user")),
        ("Guards", ("autostop", "autostop_action", "ttl", "budget", "locked", "on_interrupt", "metrics", "health",
                    "watch_process", "on_alert", "alert_webhook")),
        ("Data", ("instance_profile", "s3_access")),
        ("Cluster", ("nodes", "min_nodes")),
        ("Output and flow", ("no_bootstrap", "no_wait", "dry_run", "yes", "step_silence", "verbose", "as_json",
                             "quiet", "help")),
    ),
}


class SectionedCommand(Command):
    """A command whose options `--help` lists under headings (SECTIONS): Click has no option groups, so this
    is Click's own format_options, once per heading."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records = {"help" if "--help" in p.opts else p.name: p.get_help_record(ctx)
                   for p in self.get_params(ctx) if isinstance(p, click.Option)}
        placed: set[str | None] = set()
        for heading, names in SECTIONS.get(self.name or "", ()):
            rows = [r for n in names if (r := records.get(n)) is not None]
            placed.update(names)
            if rows:
                with formatter.section(heading):
                    formatter.write_dl(rows)
        rest = [r for n, r in records.items() if n not in placed and r is not None]
        if rest:
            with formatter.section("Other options"):
                formatter.write_dl(rest)
