"""Reaching a launched node: wait for SSH, pin its host key (trusted on first use: gpuprov launched it
moments ago and cannot learn its key first), and bootstrap it with its steps on the timeline.

`pin_host_key` is `--no-bootstrap`'s; `bootstrap_node` is shared with `start`; `StepLines` prints one progress line
per finished step. With team state, the first contact also shares the pinned key and installs the members' keys
(team_keys.after_contact).
"""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING

from gpuprov.cloud import timeline as tl
from gpuprov.errors import GpuprovError
from gpuprov.plan.plan import Plan

if TYPE_CHECKING:
    from gpuprov.cloud.launch import UpOptions
    from gpuprov.hosts import bootstrap as engine
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.plan.inventory import Target
    from gpuprov.say import Say



def made_up_address(address: str) -> bool:
    """A public address handed out by a local endpoint: it was made up, and belongs to a real machine on the
    internet that gpuprov must never try to log in to."""
    import ipaddress

    from gpuprov.cloud.providers import local_endpoint

    if local_endpoint() is None:
        return False
    try:
        return ipaddress.ip_address(address).is_global
    except ValueError:
        return True  # a name, from a local endpoint: not ours to resolve


def check_address(address: str) -> None:
    """Refuse to reach `address` when a local endpoint made it up (see made_up_address)."""
    from gpuprov.cloud.providers import local_endpoint

    local = local_endpoint()
    if local is not None and made_up_address(address):
        cloud, url = local
        raise GpuprovError(f"the address {address} comes from the local {cloud} endpoint {url}, "
                           "which makes public addresses up: it may be a real machine on the internet, so gpuprov "
                           "does not connect to it\n  launch with --connect private and the endpoint's --subnet "
                           "(`make sandbox` sets both in its config)")


def first_contact(opts: UpOptions, key_path: str, address: str, say: Say) -> tuple[Target, HostSettings]:
    """Wait for SSH; the new machine's key is trusted on first use and pinned per node (we launched it
    moments ago and cannot learn its key first)."""
    return new_machine(opts.name, opts.ssh_user, key_path, address, opts.ssh_timeout, say)


def new_machine(name: str, user: str, key_path: str, address: str, timeout: float,
                say: Say) -> tuple[Target, HostSettings]:
    """How to reach a machine gpuprov has just launched for node `name` (by `up`, or a moved node's new
    instance): SSH waited for, any key pinned for the node before voided, the new key trusted on first use."""
    from gpuprov.hosts import sshconfig
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.plan.inventory import Target

    say(f"waiting for SSH on {address}")
    wait_tcp(address, 22, timeout)
    known_hosts = sshconfig.node_known_hosts(name)
    sshconfig.await_new_key(name)  # a new machine: a key pinned for an old one at this address is void
    settings = HostSettings(known_hosts=known_hosts, accept_new_host_key=True, connect_timeout=15)
    return Target(host=address, user=user, key=key_path, label=name), settings


def pin_host_key(opts: UpOptions, key_path: str, address: str, say: Say) -> None:
    pin_new_host_key(opts.name, opts.ssh_user, key_path, address, opts.ssh_timeout, say)


def pin_new_host_key(name: str, user: str, key_path: str, address: str, timeout: float, say: Say) -> None:
    from gpuprov.hosts.remote import Remote

    target, settings = new_machine(name, user, key_path, address, timeout, say)
    deadline = time.monotonic() + timeout
    while True:  # sshd can answer before cloud-init has installed the key: retry the login, bounded
        remote = Remote(target, settings)
        try:
            remote.open()
            remote.run("true")
            say(f"host key pinned for {name}")
            from gpuprov.cloud import team_keys

            team_keys.after_contact(name, target, settings, say)
            return
        except GpuprovError:
            raise
        except Exception as exc:  # paramiko/Fabric raise many types for "not yet": retried, then reported
            if time.monotonic() > deadline:
                raise GpuprovError(f"SSH login to {address} failed: {exc}") from None
            time.sleep(2)
        finally:
            remote.close()


def bootstrap_launched(plan: Plan, opts: UpOptions, key_path: str, address: str, say: Say,
               rec: tl.Recorder | None = None) -> object:
    from gpuprov.hosts import bootstrap as engine

    rec = rec or tl.Recorder("up", opts.name)  # a cluster's node: the cluster's timeline has a row per node instead
    rec.phase(tl.SSH)
    target, settings = first_contact(opts, key_path, address, say)
    say("bootstrapping: " + ", ".join(s.name for s in plan.steps))
    options = engine.Options(reboot_timeout=opts.reboot_timeout, step_silence=opts.step_silence,
                             echo=opts.verbose_echo)
    result = bootstrap_node(plan, target, settings, options, rec, say)
    if result.status not in ("ok", "changed"):
        raise GpuprovError(f"bootstrap {result.summary}: {result.error} (log: {result.log_path})")
    from gpuprov.cloud import team_keys

    team_keys.after_contact(opts.name, target, settings, say)  # team state: the pin shared, the members' keys in
    return result


def bootstrap_node(plan: Plan, target: Target, settings: HostSettings, options: engine.Options, rec: tl.Recorder,
                   say: Say) -> engine.HostResult:
    """A launched node's bootstrap (after `up` or `start`), its steps put on the timeline as they go."""
    from gpuprov.hosts import bootstrap as engine

    rec.phase(tl.BOOTSTRAP)
    (result,) = engine.bootstrap([target], settings, lambda _t, _f: plan, options,
                                 reporter=rec.reporter(StepLines(say)))
    rec.bootstrap_done(result.steps, {s.name for s in plan.steps if s.kind == "verify"},
                       None if result.status in ("ok", "changed") else result.error)
    return result


class StepLines:
    """Bootstrap progress as one line per finished step."""

    def __init__(self, say: Say) -> None:
        self.say = say
        self.last = ""

    def event(self, host: str, step: str, state: str) -> None:
        line = f"  {step}: {state}"
        if step and state != "running" and step not in ("connect", "upload") and line != self.last:
            self.say(line)
            self.last = line


def wait_tcp(address: str, port: int, timeout: float) -> None:
    check_address(address)  # every way to a launched node's SSH starts here
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((address, port), timeout=3).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise GpuprovError(f"SSH on {address}:{port} did not answer within {timeout:.0f}s") from None
            time.sleep(1)

