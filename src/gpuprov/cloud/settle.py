"""EC2's eventual consistency: how long a fresh resource's NotFound is not believed.

EC2 guide, "Eventual consistency in the Amazon EC2 API": right after a create, a NotFound "does not mean
the resource does not exist". Every operation on a resource gpuprov recorded moments ago looks again
(with backoff) for what is left of this window before it counts a NotFound.
"""

from __future__ import annotations

import time

from gpuprov.state import Resource

SETTLE_SECONDS = 180.0


def settle(row: Resource, now: float | None = None) -> float:
    """Seconds left during which a NotFound for this row is looked at again. A row without a ClientToken
    or name was learned from EC2's own answer about an existing resource (a volume, a spot request of a
    described instance): EC2 knew it then, so its NotFound now is believed at once."""
    if row.client_token is None:
        return 0.0
    return max(0.0, row.created_at + SETTLE_SECONDS - (now or time.time()))
