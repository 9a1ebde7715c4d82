"""The guardrails installed on a node (or host) itself: what they are asked to do, as the Plan carries them.

Split from plan/plan.py, which builds the guard steps from this (`guard_steps`).

On the node, templates/guard_*.sh.j2 install systemd timers and small scripts under /usr/local/lib/gpuprov/:
`autostop-check` (every minute; idle = every GPU under the threshold, no `who` session, no established connection
to :22; its config in /etc/gpuprov/autostop.conf), `ttl-check` (the deadline is fixed on the node the first time
the step runs, in /var/lib/gpuprov/ttl-deadline, so scripts render deterministically; `gpuprov ttl` renders the
step with `reset` for a new deadline, or without a TTL to remove it; a machine booted after its deadline passed
gets a new one, one TTL after that boot, instead of shutting down at once) and `interrupt-watch` (IMDSv2 token +
`spot/instance-action` every 5 s on AWS, ECS's `instance/spot/termination-time` on Alibaba Cloud (`NOTICES`); the
hook runs once per notice; with a Capacity Block, BLOCK_WARN_SECONDS before its end it `wall`s and runs the hook
once). Each reads GPUPROV_NOW as its clock, so tests never sleep. The guards call `shutdown`; what that does to a
launched node is its cloud's: on AWS its InstanceInitiatedShutdownBehavior, set at launch to the node's shutdown
action; on Alibaba Cloud the instance stops in ECS's standard mode, whose compute may still be billed, unless the
node asks ECS itself. An Alibaba node's autostop and TTL steps install `ecs-stop` (templates/guard_ecs_stop.py.j2),
which the checks run first: StopInstances in economical mode (StopCharging), signed with the STS credentials of the
instance's RAM role from ECS's metadata; the OS's power-off is the fallback, its reason logged, when the instance has
no role or ECS refuses. gpuprov launches every Alibaba node with that role (cloud/stop_role.py: `stop_role`), so its
guards stop it in economical mode (`then` says which, and the rendered steps with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

DEFAULT_METADATA_URL = "http://169.254.169.254"


@dataclass(frozen=True)
class Notice:
    """Where a cloud's node reads its spot interruption notice, and how long it has to act on it."""

    metadata_url: str
    path: str  # under the metadata URL: 404 while nothing is scheduled, 200 with the notice once it is
    hook_timeout: int  # seconds the hook and the interrupt saves share, inside the notice's warning
    warning: str  # how far ahead the notice comes, in words


# EC2 guide, "Spot Instance interruption notices": IMDSv2's spot/instance-action, {"action": ..., "time": ...}, two
# minutes ahead; poll every 5 s.
# ECS guide, "Detect and respond to spot instance interruption events" (alibabacloud.com/help/ja/ecs/user-guide/
# best-practices-for-preemptible-instances): instance/spot/termination-time at 100.100.100.200 answers 404 while no
# reclaim is scheduled, else the UTC time of the reclaim (2015-01-05T18:02:00Z); a token from PUT /latest/api/token
# (X-aliyun-ecs-metadata-token-ttl-seconds) is sent as X-aliyun-ecs-metadata-token, which the hardened mode
# requires. "ECS updates the instance metadata five minutes before ECS releases a preemptible instance" ("Create a
# preemptible instance", help/en/ecs/user-guide/create-a-preemptible-instance).
NOTICES = {
    "aws": Notice(DEFAULT_METADATA_URL, "/latest/meta-data/spot/instance-action", 100, "two minutes"),
    "alibaba": Notice("http://100.100.100.200", "/latest/meta-data/instance/spot/termination-time", 240,
                      "five minutes"),
}


# EC2 guide, "Capacity Blocks" (capacity-blocks-using): "Thirty minutes before the reservation expires, we begin to
# terminate any instances that are still running in the Capacity Block"; its EventBridge warning comes 40 minutes
# before the end (capacity-blocks-monitor). The node's watch warns and runs the hook then: ten minutes before EC2
# begins.
BLOCK_WARN_SECONDS = 40 * 60


class Guards(BaseModel):
    """Guardrails installed on the node itself, so they hold when the client is gone.

    autostop: shut down after this many seconds with every GPU below `idle_threshold_pct` and no
    SSH session. ttl: shut down this many seconds after the guard step first ran. interrupt:
    poll the cloud's metadata service for a spot interruption notice and run `on_interrupt` once per notice.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    autostop_seconds: int | None = None
    idle_threshold_pct: int = 10
    ttl_seconds: int | None = None
    interrupt_watch: bool = False
    on_interrupt: str | None = None
    save_on_interrupt: bool = False  # the playbook's `data:` uploads for `interrupt` run after the hook (save-data)
    metadata_url: str = DEFAULT_METADATA_URL
    # what a shutdown by a guard does to a node gpuprov launched (its InstanceInitiatedShutdownBehavior):
    # "stop" keeps the disk, "terminate" ends everything; None: a host gpuprov did not launch (it powers off)
    shutdown_action: Literal["stop", "terminate"] | None = None
    # the node's cloud: whose interruption notice the watch reads (NOTICES) and what a shutdown does to it
    cloud: Literal["aws", "alibaba"] = "aws"
    # the instance is launched with a role its guards ask the cloud to stop it with (an Alibaba node's RAM role,
    # cloud/stop_role.py): its stop is economical; False on a node launched before gpuprov gave one, and on a host
    stop_role: bool = False
    budget_usd: float | None = None  # the TTL is this budget at `budget_price` $/h when that is the sooner
    budget_price: float | None = None
    # a Capacity Block's end (epoch seconds): the interrupt watch runs the hook BLOCK_WARN_SECONDS before it
    block_end: int | None = None

    @property
    def any(self) -> bool:
        return self.autostop_seconds is not None or self.ttl_seconds is not None or self.interrupt_watch \
            or self.block_end is not None

    @property
    def block_warn(self) -> int:
        """How long before a Capacity Block's end the watch warns and runs the hook (BLOCK_WARN_SECONDS)."""
        return BLOCK_WARN_SECONDS

    @property
    def notice(self) -> Notice:
        return NOTICES[self.cloud]

    @property
    def then(self) -> str:
        """What the guards' shutdown does, in words."""
        if self.cloud == "alibaba" and self.shutdown_action is not None and self.stop_role:
            # the node's ecs-stop asks StopInstances for StopCharging with the instance's RAM role ("Economical mode":
            # compute stops billing, the disk is kept); only where ECS refuses does the OS power off
            return ("the instance stops in ECS's economical mode: its disk is kept and its compute stops billing (the "
                    "node asks ECS with its RAM role; where ECS refuses, it powers off in ECS's standard mode, whose "
                    "compute may go on billing; `gpuprov down` ends the bill)")
        if self.cloud == "alibaba" and self.shutdown_action is not None:
            # ECS guide, "Economical mode" (help/en/ecs/user-guide/economical-mode): compute stops billing when an
            # instance is stopped in economical mode, which StopInstances' StoppedMode (StopCharging) or the
            # console's Stop dialog asks for; neither names a stop from within the OS. The node's ecs-stop asks for
            # it with the instance's RAM role, and a node without one powers its OS off
            return ("the instance stops in ECS's standard mode: its disk is kept and its compute may go on billing "
                    "(economical mode comes only with a stop asked of ECS's API, as `gpuprov stop` asks, and as the "
                    "node asks when the instance has a RAM role allowed to stop it; `gpuprov down` ends the bill)")
        return {"stop": "the instance stops (its disk is kept)",
                "terminate": "the instance terminates (its disk goes with it)"}.get(self.shutdown_action or "",
                                                                                     "the machine powers off")
