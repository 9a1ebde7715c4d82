"""EC2's eventual consistency: how long a fresh resource's NotFound is not believed.

EC2 guide, "Eventual consistency in the Amazon EC2 API": right after a create, a NotFound "does not mean
the resource does not exist". Every operation on a resource gpuprov recorded moments ago looks again
(with backoff) for what is left of this window before it counts a NotFound.

`SETTLE_SECONDS` is the window; `settle(row)` the seconds left of it for a recorded resource. A row learnt from
EC2's own answer (not made by gpuprov moments ago) settles at once.
"""

from __future__ import annotations

import time

from gpuprov.errors import UserInputError
from gpuprov.settings import settings
from gpuprov.state import Resource

# Three minutes covers what EC2's guide describes (seconds, at most a few minutes). GPUPROV_TEST_SETTLE_SECONDS
# shortens it where the cloud is an imitation whose lag is counted in look-ups, not minutes (the test suite);
# cli/common.py refuses a value that is not a number of seconds.
DEFAULT_SETTLE_SECONDS = 180.0


def window_from_env() -> float | None:
    """GPUPROV_TEST_SETTLE_SECONDS as seconds, None when unset; a UserInputError naming it when it is not a finite
    number >= 0."""
    given = settings().test_settle_seconds
    return given.seconds() if given is not None else None


def settle_window() -> float:
    """The window, read when it is needed: a value read once at import would be the importing process's,
    and a process forked after the import (the tests' fork server) would keep it."""
    try:
        value = window_from_env()
    except UserInputError:
        return DEFAULT_SETTLE_SECONDS  # refused with its name by the CLI before any cloud call
    return DEFAULT_SETTLE_SECONDS if value is None else value  # 0 is a window too: believe every NotFound


def settle(row: Resource, now: float | None = None) -> float:
    """Seconds left during which a NotFound for this row is looked at again. A row without a ClientToken
    or name was learned from EC2's own answer about an existing resource (a volume, a spot request of a
    described instance): EC2 knew it then, so its NotFound now is believed at once."""
    if row.client_token is None:
        return 0.0
    return max(0.0, row.created_at + settle_window() - (now or time.time()))
