"""The keyword arguments each shared set of options passes a command, as TypedDicts: a command that takes a set
(`stack_options`, `ssh_options`, …) declares `**kw: Unpack[StackOptions]`, and what reads `kw["…"]` is checked
against the option that sets it. Each key is the option's parameter name; each type what its Click type yields.

Types only: the command modules import this under TYPE_CHECKING, so no command pays for it at start-up.
"""

from __future__ import annotations

from typing import Literal, TypedDict


class PinOptions(TypedDict):
    """common.pin_options: what to install."""

    playbook: str
    jupyter: bool
    docker: bool
    sources: str | None
    os_name: str | None
    driver: str | None
    cuda: str | None
    torch_version: str | None
    torch_cuda: str | None
    python: str | None


class GuardOptions(TypedDict):
    """common.guard_options: the guardrails installed on the machine."""

    autostop: str | None
    ttl: str | None
    on_interrupt: str | None


class NodeGuardOptions(TypedDict):
    """common.node_guard_options: guard choices only a launched node has."""

    autostop_action: Literal["stop", "terminate"] | None
    budget: float | None


class MonitorOptions(TypedDict):
    """monitoring_options.monitor_options: metrics and the health watch."""

    metrics: Literal["auto", "dcgm", "textfile"] | None
    health: bool | None
    watch_process: str | None
    on_alert: str | None
    alert_webhook: str | None


class StackOptions(PinOptions, GuardOptions, NodeGuardOptions, MonitorOptions):
    """common.stack_options: what to launch and install (plan, render, up)."""

    gpu: str | None
    count: int | None
    cpu: int | None
    memory_gib: float | None
    spot: bool
    persistent: bool
    spot_duration: str | None
    region: str | None
    instance_type: str | None
    arch: Literal["x86_64", "aarch64"] | None


class _Reach(TypedDict):
    identity: str | None
    ssh_config: str | None
    connect_timeout: float


class ReachOptions(_Reach, total=False):
    """How to reach hosts (access._reach_options, metrics serve); --accept-new-host-key only where the command
    has it."""

    accept_new_host_key: bool


class SshOptions(ReachOptions):
    """common.ssh_options: the hosts, and how to reach them (bootstrap, check, bench, doctor)."""

    hosts: tuple[str, ...]
    inventory: str | None
    parallel: int


class BootstrapOptions(SshOptions, PinOptions, GuardOptions, MonitorOptions):
    """Every shared set `bootstrap` takes."""
