"""Who owns a cloud resource: the `gpuprov:owner` tag value every resource gpuprov makes carries.

`gc` collects only what carries this owner, and the region's key pair is named after it."""

from __future__ import annotations

import getpass
import socket


def owner() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"
