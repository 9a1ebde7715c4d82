"""The `gpuprov` command line: parse, call the library, print. Decisions live in the library.

One module per group of commands; importing them registers their commands on `main`.
"""

from gpuprov.cli import access, cloud, clusters, hosts, images, offline, settings  # noqa: F401  (registers the commands)
from gpuprov.cli.common import main

__all__ = ["main"]
