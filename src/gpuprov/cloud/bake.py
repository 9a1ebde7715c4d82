"""`image bake`: make an image of a ready node that skips, on the next node, every install step it holds.

In order, holding the node's lock and the image name's (gc never collects a bake at work):
  the node's bundle manifest and markers (every install step must have its marker) -> the clean-up step over
  SSH (`templates/image_clean.sh.j2`: host keys, gpuprov's authorized key, guards, logs, cloud-init instance
  data; the markers stay) -> the image recorded by name -> CreateImage (tagged: stack, OS, owner, the source
  node) -> wait until available -> the node's guards put back over SSH.

The clean-up does not delete what it removes: it moves it to /run/gpuprov-bake, a tmpfs, which no snapshot
holds and the reboot CreateImage makes empties. So when EC2 refuses CreateImage the node is put back as it
was (`templates/image_restore.sh.j2`: host keys, gpuprov's key, the guards with their units enabled again)
over the connection the clean-up ran on (sshd, which re-reads its host keys per connection, would refuse a
new one meanwhile). A CreateImage whose answer was lost is looked up by name before anything is restored:
EC2 may have taken it, and then the node must stay clean for the snapshot.

Once the image is made, the node, rebooted by CreateImage as a first boot (new host keys, its launch key back,
the tmpfs emptied), gets its guards back as its record shows them (cloud/guards.recorded_guards): the autostop,
the spot watch, the TTL or budget deadline recorded (not a new one), and its monitoring (metrics, health watch).
Its new host key is pinned on first contact, as `up` pins a new node's. A node whose guards another member
locked (`--locked`) is not baked at all: the bake lifts them.

A bake is journaled (state/records.py `Journal`, op "bake"), the node `baking`, each step recorded before it is
taken: "clean" before the clean-up, "image" before CreateImage (its id added once answered), "guards" once the
image is available; the journal is cleared, the node `ready`, when the bake ends either way. A bake killed
mid-way (SIGKILL, a lost connection, a second signal) leaves it for the next command (`settle`):
`status --refresh` names the image as EC2 has it and the next step; `start` and `stop` settle it; `down` and `gc`
record the image if EC2 made it (so no image or snapshot of ours is left unrecorded) and `down` goes on; a second
`image bake` is refused naming the step.

Settling never needs the node's SSH, which a killed clean-up may have left refusing every connection (its host
keys and gpuprov's key moved aside, the backup in a tmpfs). Three ways were weighed:
  - keep sshd answering: leave the host keys in place (cloud-init's cc_ssh deletes them and makes new ones on an
    instance's first boot, `ssh_deletekeys` being true by default, once per instance id). But gpuprov's own key
    must leave authorized_keys before the snapshot, or every image would let the baker into its teammates' nodes;
    once it is gone gpuprov cannot log in whatever the host keys, so this alone does not keep the node reachable.
  - RebootInstances: the clean-up ran `cloud-init clean` first, so the next boot is a first boot (new host keys,
    the launch key, gpuprov's, back in authorized_keys). But EC2 answers a reboot at once and the instance stays
    `running` throughout: nothing says when the old sshd is gone, so the next contact could reach it still
    refusing, or pin nothing.
  - StopInstances then StartInstances (chosen): both are seen in EC2's answer (`stopped`, then `running` with its
    address), the start is the path that already follows a new address and puts back every guard and monitoring
    step as the record shows them (stopstart.start's bootstrap), and the boot is the same first boot. So settling a
    bake is: the image looked up (by id, or by name: its answer may be lost) and recorded if EC2 made it, waited
    for until available; else its intended record dropped; then the instance stopped, the node `stopped` with its
    host key awaited anew (sshconfig.await_new_key). `start` then starts it as any stopped node; `stop` leaves it
    stopped. A node that cannot stop (one-time spot) is refused with `gpuprov down` as its next step.
The clean-up runs `cloud-init clean` before it moves anything, so a clean-up killed at any point leaves a node whose
next boot is a first boot.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from gpuprov.cloud.images import GUARD_STEPS, GUARD_UNITS, INSTALL_KINDS, check_image_name, stack_hash
from gpuprov.cloud.providers import service
from gpuprov.cloud.providers.base import Image, ImageRequest, Provider
from gpuprov.cloud.providers.capabilities import title
from gpuprov.cloud.settle import settle_window
from gpuprov.errors import GpuprovError, Interrupted, UserInputError
from gpuprov.state import Journal, NodeState, locks

if TYPE_CHECKING:
    from gpuprov.hosts.remote import HostSettings, Remote
    from gpuprov.plan.inventory import Target
    from gpuprov.say import Say
    from gpuprov.state import Store

BUNDLE_DIR = "/var/lib/gpuprov/bundle"
MARKER_DIR = "/var/lib/gpuprov/markers"
BACKUP_DIR = "/run/gpuprov-bake"  # tmpfs on the node: never in a snapshot, gone at the next boot
WAIT_SECONDS = 3600.0  # an AMI of a 100 GB root volume can take tens of minutes


def bake(node_name: str, store: Store, provider: Provider, target: Target, settings: HostSettings, say: Say,
         name: str | None = None, wait: float = WAIT_SECONDS) -> Image:
    """Clean the node of what is its own, then make an image of it; returns the image once available."""
    image_name = check_image_name(name or f"gpuprov-{node_name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    with locks.hold(locks.node(node_name), "image bake", wait=False, subject=node_name), \
            locks.hold(locks.image(image_name), "image bake", wait=False, subject=f"image {image_name!r}"):
        return _bake(node_name, image_name, store, provider, target, settings, say, wait)


def _bake(node_name: str, image_name: str, store: Store, provider: Provider, target: Target,
          settings: HostSettings, say: Say, wait: float) -> Image:
    from gpuprov.cloud.guards import check_lock
    from gpuprov.hosts.remote import Remote

    node = store.node(node_name)
    if node.journal is not None and node.journal.is_bake:
        raise UserInputError("NODE", f"{node_name}'s last {node.journal.describe()}",
                             f"`gpuprov start {node_name}` first, then bake it again")
    if node.state != "ready":
        raise UserInputError("NODE", f"{node_name} is {node.state}", "bake a node that is ready (`gpuprov status`)")
    check_lock(node, "image bake")  # the clean-up lifts its guards until the image is made
    instances = [r.cloud_id for r in store.resources(node_name, region=node.region, kind="instance") if r.cloud_id]
    if not instances:
        raise GpuprovError(f"{node_name} has no recorded instance")
    if [r for r in store.resources(None, region=node.region, kind="image") if r.client_token == image_name] or \
            provider.images(node.region, name=image_name):
        raise UserInputError("--name", f"an image called {image_name!r} exists in {node.region}",
                             "pick another --name, or `gpuprov image rm` it first")
    os_name = str(node.plan.get("os") or "ubuntu-24.04")
    cloud = title(provider)
    remote = Remote(target, settings)
    remote.open()
    try:
        stack, steps = _installed(remote, node_name)
        say(f"{node_name}: {len(steps)} install steps on it ({', '.join(steps)}), stack {stack[:12]}")
        rid: int | None = None
        journal = _note(store, Journal(op="bake", node=node_name, step="clean", region=node.region, zone=node.zone,
                                       old_instance=instances[-1], image_name=image_name, began_at=time.time()))
        try:
            _run_step(remote, node_name, "image-clean", "image_clean.sh.j2", "the clean-up before the image",
                      _clean_values(node.region, node.ssh_user or "ubuntu"))
            say(f"{node_name}: host keys, gpuprov's authorized key, guards, logs and cloud-init data moved aside "
                f"(put back if {cloud} refuses the image); markers kept")
            journal = _note(store, replace(journal, step="image"))
            rid = store.intend(None, "image", node.region, image_name)
            store.event(node_name, "bake", f"CreateImage {image_name} (stack {stack[:12]})")
            image_id = provider.create_image(ImageRequest(
                region=node.region, instance_id=instances[-1], name=image_name, source_node=node_name, stack=stack,
                os=os_name, description=f"gpuprov: {', '.join(steps)} (stack {stack[:12]}, {os_name})"))
        except (GpuprovError, KeyboardInterrupt) as exc:  # refused, failed, or interrupted (any signal)
            taken = provider.images(node.region, name=image_name) if rid is not None else []
            if not taken:  # EC2 has no image of that name: it never took the request, so the node comes back
                if rid is not None:
                    store.deleted(rid)
                _put_back(remote, node_name, exc, say, cloud)
                _done(store, node_name)
                if isinstance(exc, Interrupted):
                    exc.note = f"no image was made; {node_name} is as it was before the bake"
                raise
            image_id = taken[-1].id  # a lost answer: EC2 took it, the node stays clean for the snapshot
    finally:
        remote.close()
    assert rid is not None  # create_image ran, so the record was written first
    store.created(rid, image_id)
    journal = _note(store, replace(journal, image=image_id))
    say(f"CreateImage {image_id} ({image_name}): {cloud} stops {node_name}, snapshots its disk and starts it again")
    try:
        image = provider.wait_image(node.region, image_id, timeout=wait, settle=settle_window(),
                                    progress=_progress(say, image_id))
    except Interrupted as exc:  # nothing to take back: EC2 makes the image; the record finds it
        exc.note = (f"{cloud} goes on making {image_id} ({image_name}); {node_name} is baking, its guards not back: "
                    f"`gpuprov start {node_name}` settles it once the image is available")
        raise
    store.event(node_name, "baked", f"{image_id} {image_name} available")
    _note(store, replace(journal, step="guards", new_state=image.state))
    _guards_back(node_name, store, target, settings, say)
    _done(store, node_name)
    return image


def _note(store: Store, journal: Journal) -> Journal:
    """The bake's step, recorded before it is taken: the node `baking`, its state saying how far and what next."""
    store.update_node(journal.node, state=NodeState.BAKING, journal_json=journal.to_json(),
                      state_reason=journal.describe())
    return journal


def _done(store: Store, node_name: str) -> None:
    """The bake ended (the image made and the guards back, or the node put back as it was): nothing in flight."""
    store.update_node(node_name, state=NodeState.READY, journal_json=None, state_reason=None)


def made_image(node_name: str, journal: Journal, provider: Provider, store: Store, *, drop: bool = False) -> Image | None:
    """The image a bake's CreateImage made, if EC2 has it: by the id its answer gave, else by its name (the answer
    may be lost), recorded either way so that nothing of ours is left unrecorded; a bake that never sent CreateImage,
    or whose image EC2 does not have (or failed), has none. Its intended record is dropped then only when `drop`
    (the bake is being settled): a look leaves it, for an image EC2 may still list late."""
    if journal.step == "clean" or not journal.image_name:
        return None
    found = provider.images(journal.region, ids=[journal.image]) if journal.image else []
    found = found or provider.images(journal.region, name=journal.image_name)
    image = next((i for i in found if i.state != "failed"), None)
    rows = [r for r in store.resources(None, region=journal.region, kind="image") if r.client_token == journal.image_name]
    for row in rows:
        if image is None and row.cloud_id is None and drop:
            store.deleted(row.id)
        elif image is not None and row.cloud_id is None:
            store.created(row.id, image.id)
    if image is not None and not rows:
        store.created(store.intend(None, "image", journal.region, journal.image_name), image.id)
    return image


def look(node_name: str, provider: Provider, store: Store) -> None:
    """`status --refresh` of a node a killed bake left: the image as EC2 has it, in the node's state."""
    journal = store.node(node_name).journal
    if journal is None or not journal.is_bake:
        return
    image = made_image(node_name, journal, provider, store)
    seen = replace(journal, image=image.id if image else journal.image,
                   new_state=image.state if image else (None if journal.step == "clean" else "not found"))
    _note(store, seen)


def forget(node_name: str, provider: Provider, store: Store, say: Say) -> None:
    """`down` of a node a killed bake left: its image recorded if EC2 made it (images outlive nodes), the journal
    cleared; the node's own teardown follows."""
    journal = store.node(node_name).journal
    if journal is None or not journal.is_bake:
        return
    image = made_image(node_name, journal, provider, store)
    if image is not None:
        say(f"{node_name}: its interrupted bake made {image.id} ({image.name}), kept and recorded")
    store.update_node(node_name, journal_json=None, state_reason=None)
    store.event(node_name, "bake-settled", f"at {journal.step}, for a down")


def settle(node_name: str, provider: Provider, store: Store, say: Say, wait: float = WAIT_SECONDS) -> None:
    """`start`/`stop` of a node a killed bake left (the caller holds its lock): the image found and recorded, and
    waited for, or its record dropped; then the instance stopped, the node `stopped`, its next boot a first boot
    whose new host key is pinned on first contact. `start` then starts it as any stopped node, which puts its
    guards back as its record shows them."""
    from gpuprov.hosts import sshconfig

    node = store.node(node_name)
    journal = node.journal
    if journal is None or not journal.is_bake:
        return
    from gpuprov.cloud.stopstart import stoppable

    if not stoppable(node, provider):
        raise UserInputError("NAME", f"{node_name} is a one-time spot node, which {service(node.provider)} cannot stop, and its "
                             f"{journal.describe()}", f"`gpuprov down {node_name}` (its image, if made, is kept)")
    image = made_image(node_name, journal, provider, store, drop=True)
    if image is not None:
        say(f"{node_name}: its interrupted bake made {image.id} ({image.name}); waiting until it is available")
        image = provider.wait_image(journal.region, image.id, timeout=wait, settle=settle_window(),
                                    progress=_progress(say, image.id))
        store.event(node_name, "baked", f"{image.id} {image.name} available (its bake settled)")
    else:
        say(f"{node_name}: its interrupted bake made no image; the node is stopped and started again to come back")
    (current,) = provider.describe(journal.region, [journal.old_instance], settle=settle_window())
    if current.state in ("terminated", "shutting-down"):  # nothing to bring back: `down` removes what is left
        store.update_node(node_name, state=NodeState.GONE, journal_json=None,
                          state_reason=current.state_reason or "instance terminated")
        return
    say(f"{node_name}: stopping {journal.old_instance}: its next boot is a first boot (new host keys, gpuprov's key "
        "back), and `start` puts its guards back")
    provider.stop(journal.region, [journal.old_instance], settle=settle_window())
    (stopped,) = provider.wait_stopped(journal.region, [journal.old_instance])
    now = time.time()
    sshconfig.await_new_key(node_name)
    store.update_node(node_name, state=NodeState.STOPPED, journal_json=None, stopped_at=now,
                      state_reason=f"its image bake was interrupted at {journal.step}; settled by a stop",
                      **node.stopped_run(now))
    store.event(node_name, "stopped", f"{stopped.id} (an interrupted bake settled)")


def _guards_back(node_name: str, store: Store, target: Target, settings: HostSettings, say: Say) -> None:
    """The node's guards and monitoring, as its record shows them (cloud/guards.recorded_guards), put back on it
    after the image was made. A TTL or budget keeps its recorded deadline: the TTL step is run with its clock at
    the deadline's start. If the node cannot be reached, or a guard step fails, the record says its guards are off,
    so `status` shows no deadline it lacks; a monitoring step that fails after them leaves the guards recorded."""
    from pathlib import Path

    from gpuprov.cloud import team_keys
    from gpuprov.cloud.contact import wait_tcp
    from gpuprov.cloud.guards import recorded_guards, run_step
    from gpuprov.cloud.stopstart import node_plan
    from gpuprov.hosts.hostkeys import await_first_key
    from gpuprov.hosts.remote import Remote
    from gpuprov.plan.render import render_steps

    node = store.node(node_name)
    recorded = recorded_guards(node)
    # the other steps whose files went with the clean-up (the data-save helper, which the TTL's and autostop's
    # stops run; EFA's settings) go back first
    kept = [s for s in node_plan(node).steps if s.name in GUARD_STEPS and s.name not in recorded.names]
    steps = (*kept, *recorded.steps)
    if not steps:
        return
    at_monitoring = False  # every guard step is back: what fails from here is monitoring
    try:
        if target.known_hosts:  # cloud-init's first boot made new host keys: the clean-up removed the old ones
            await_first_key(Path(target.known_hosts), f"node {node_name}: rebooted by `image bake`, new host keys")
        wait_tcp(target.host, target.port or 22, 300)
        remote = Remote(target, settings)
        remote.open()
        try:
            for script in render_steps(steps, {}, {}).scripts:
                at_monitoring = script.kind == "monitor"
                run_step(remote, node_name, script.name, script.text, f"putting its {script.name} step back",
                         recorded.clock(script.name))
        finally:
            remote.close()
    except (GpuprovError, KeyboardInterrupt) as exc:  # a step failed, or interrupted (any signal)
        if isinstance(exc, KeyboardInterrupt) and not at_monitoring:  # the journal stays at "guards": the record
            if isinstance(exc, Interrupted):  # keeps them, and `start` puts them back
                exc.note = (f"the image is made; {node_name}'s guards are not back yet: `gpuprov start {node_name}` "
                            "puts them back (a stop and a start)")
            raise
        if not at_monitoring:
            _guards_lost(node_name, store, exc, say)
        else:
            _monitoring_lost(node_name, store, exc, say)
        if isinstance(exc, KeyboardInterrupt):
            raise
        if at_monitoring:  # it was reached: its new host key goes to the team as on success
            team_keys.after_contact(node_name, target, settings, say)
        return
    team_keys.after_contact(node_name, target, settings, say)
    say(f"{node_name}: its guards are back ({', '.join(s.name for s in steps)}), as its record shows them")


def _guards_lost(node_name: str, store: Store, exc: BaseException, say: Say) -> None:
    """The guards could not all be put back: the record says they are off, and the user hears what to do."""
    store.update_node(node_name, autostop_seconds=None, ttl_seconds=None, ttl_deadline=None, ttl_end=None,
                      budget_usd=None, budget_deadline=None, budget_price=None)
    store.event(node_name, "guards", f"not put back after the bake: {exc or 'interrupted'}")
    lost = (f"{node_name} runs with no autostop, TTL or budget; `gpuprov ttl {node_name} 4h` or "
            f"`gpuprov down {node_name}`")
    if isinstance(exc, Interrupted):
        exc.note = f"the image is made; {lost}"
    if not isinstance(exc, KeyboardInterrupt):
        say(f"{node_name}: its guards could not be put back ({exc}): {lost}")


def _monitoring_lost(node_name: str, store: Store, exc: BaseException, say: Say) -> None:
    """Its guards are back, a monitoring step is not: the guards stay recorded, and the user hears what to do."""
    store.event(node_name, "guards", f"monitoring not put back after the bake: {exc or 'interrupted'}")
    again = f"`gpuprov stop {node_name}` and `gpuprov start {node_name}` install it again"
    if isinstance(exc, Interrupted):
        exc.note = f"the image is made; {node_name} has its guards back, not its monitoring: {again}"
    if not isinstance(exc, KeyboardInterrupt):
        say(f"{node_name}: its guards are back, its monitoring is not ({exc}): {again}")


def _put_back(remote: Remote, node_name: str, exc: BaseException, say: Say, cloud: str) -> None:
    """The cloud refused the image: the node gets back what the clean-up moved aside. If that fails too, the error
    says what the node now lacks, so the user knows before relying on its guards."""
    try:
        _run_step(remote, node_name, "image-restore", "image_restore.sh.j2", "putting the node back",
                  (("backup", BACKUP_DIR), ("guard_units", GUARD_UNITS)))
    except GpuprovError as failed:
        raise GpuprovError(f"{exc}\n  and {node_name} could not be put back as it was ({failed}): it lacks its "
                           "host keys, gpuprov's SSH key and its TTL/budget/autostop guards until they are restored "
                           f"from {BACKUP_DIR} (or `gpuprov down {node_name}`)") from None
    why = f"{cloud} refused the image" if isinstance(exc, GpuprovError) else f"interrupted before {cloud} took the image"
    say(f"{node_name}: {why}; the node is as it was (host keys, gpuprov's key, its guards)")


def _installed(remote: Remote, node_name: str) -> tuple[str, list[str]]:
    """The stack hash of the bundle the node ran, refusing a node whose install steps lack their markers."""
    out = remote.run(
        f"cat {BUNDLE_DIR}/manifest.json && echo GPUPROV_MARKERS && for f in {MARKER_DIR}/*.sha256; do "
        "[ -e \"$f\" ] && printf '%s %s\\n' \"$(basename \"$f\" .sha256)\" \"$(cat \"$f\")\"; done; true", sudo=True)
    text, _, marks = out.stdout.partition("GPUPROV_MARKERS")
    try:
        manifest = json.loads(text)["steps"]
    except (ValueError, KeyError, TypeError):
        raise GpuprovError(f"{node_name} has no gpuprov bundle ({BUNDLE_DIR}/manifest.json): was it bootstrapped?") \
            from None
    markers = dict(line.split(" ", 1) for line in marks.strip().splitlines() if " " in line)
    steps = [(str(s["name"]), str(s["kind"]), str(s["sha256"])) for s in manifest]
    missing = [n for n, kind, sha in steps if kind in INSTALL_KINDS and markers.get(n, "").strip() != sha]
    if missing:
        raise GpuprovError(f"{node_name}: {', '.join(missing)} did not finish (no marker for the script it has); "
                           "an image of it would not skip them: rerun its bootstrap first")
    return stack_hash(steps), [n for n, kind, _ in steps if kind in INSTALL_KINDS]


def _clean_values(region: str, ssh_user: str) -> tuple[tuple[str, object], ...]:
    from gpuprov import paths
    from gpuprov.cloud import keys
    from gpuprov.cloud.tags import owner

    blob = keys.local_key(paths.keys_dir(), region, owner()).public.split()[1]
    return (("key_blob", blob), ("ssh_user", ssh_user), ("guard_units", GUARD_UNITS), ("guard_steps", GUARD_STEPS),
            ("backup", BACKUP_DIR))


def _run_step(remote: Remote, node_name: str, step_name: str, template: str, what: str,
              values: tuple[tuple[str, object], ...]) -> None:
    """One rendered step over the open connection, as root; it must print its GPUPROV_RESULT line."""
    from gpuprov.cloud.guards import run_step
    from gpuprov.plan.render import StepPlan, render_steps

    step = StepPlan(step_name, template, "guard", what, values)
    (script,) = render_steps((step,), {}, {}).scripts
    run_step(remote, node_name, step_name, script.text, what)


def _progress(say: Say, image_id: str) -> Callable[[Image, float], None]:
    last: dict[str, object] = {"state": None, "at": 0.0}

    def show(image: Image, waited: float) -> None:
        if image.state != last["state"] or waited - float(last["at"] or 0.0) >= 30:  # type: ignore[arg-type]
            say(f"  {image_id}: {image.state} ({waited:.0f}s)")
            last.update(state=image.state, at=waited)

    return show
