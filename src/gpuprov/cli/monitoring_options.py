"""The monitoring options of up, bootstrap, plan and render, apart from common.py's others so that
module stays one idea: `--metrics`, `--health/--no-health`, `--watch-process`, `--on-alert`, `--alert-webhook`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import click

if TYPE_CHECKING:
    from gpuprov.cli.option_sets import MonitorOptions
    from gpuprov.plan.monitoring import Monitoring

F = TypeVar("F", bound=Callable[..., object])


def monitor_options(func: F) -> F:
    """Metrics and the health watch on the node (plan, render, up, bootstrap); cli/metrics.py reads them."""
    options = [
        click.option("--metrics", type=click.Choice(["auto", "dcgm", "textfile"]), is_flag=False, flag_value="auto",
                     default=None, metavar="[dcgm|textfile]",
                     help="GPU and node metrics for Prometheus on the node's 127.0.0.1 (node exporter, plus DCGM's "
                          "exporter where NVIDIA packages DCGM for the OS, else nvidia-smi on a timer); reach them "
                          "with `gpuprov metrics serve`. Turns on --health."),
        click.option("--health/--no-health", default=None,
                     help="A watch on the node for Xid errors, ECC errors, GPUs gone from the bus, thermal slowdown "
                          "[default: on with --metrics or an alert option]."),
        click.option("--watch-process", default=None, metavar="PATTERN",
                     help="Also alert when a process matching PATTERN (pgrep -f), e.g. torchrun, has exited."),
        click.option("--on-alert", default=None, metavar="CMD",
                     help="Command the node runs per health finding (at most hourly each), with GPUPROV_ALERT_KIND, "
                          "_MESSAGE, _GPU, _JSON … in its environment."),
        click.option("--alert-webhook", default=None, metavar="URL",
                     help="POST each finding as JSON: a Slack incoming-webhook URL, or ntfy+https://ntfy.sh/TOPIC."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def monitoring_from(kw: MonitorOptions) -> Monitoring:
    """The Monitoring the monitor options ask for (checked with the playbook in plan/plan.with_monitoring)."""
    from gpuprov.plan.monitoring import Monitoring

    return Monitoring(metrics=kw.get("metrics") or "off", health=kw.get("health"), watch_process=kw.get("watch_process"),
                      on_alert=kw.get("on_alert") or None, alert_webhook=kw.get("alert_webhook"))
