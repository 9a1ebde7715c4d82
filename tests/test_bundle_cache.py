"""bundle_cache: a rerun of the same plan gets the same bundle without rendering; any change renders afresh."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.hosts import bundle_cache, runner
from gpuprov.hosts.bootstrap import bundle_tar
from gpuprov.plan import plan as plan_module
from gpuprov.plan.plan import make_host_plan
from gpuprov.plan.stack import StackPins


def playbook(tmp_path: Path, command: str) -> str:
    path = tmp_path / "pb.yml"
    path.write_text("name: cached\nstack: none\nenv: null\nsteps:\n  - name: one\n"
                    f"    run: {command!r}\n")
    return str(path)


def no_rendering(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("rendered, though this plan was rendered before")

    monkeypatch.setattr(plan_module, "render_steps", refuse)  # what Plan.bundle calls
    monkeypatch.setattr(runner, "render_runner", refuse)


def test_a_plan_rendered_before_comes_back_byte_for_byte_without_rendering(gp_home, tmp_path, monkeypatch):
    plan = make_host_plan("H100", "pytorch", "ubuntu-24.04", StackPins(), nvswitch=True)
    bundle, runner_text = bundle_cache.bundle_for(plan)
    assert runner_text == runner.render_runner(bundle) and bundle == plan.bundle()
    first_tar = bundle_tar(bundle, runner_text)

    again = make_host_plan("H100", "pytorch", "ubuntu-24.04", StackPins(), nvswitch=True)  # a new process's plan
    no_rendering(monkeypatch)
    cached, cached_runner = bundle_cache.bundle_for(again)
    assert cached == bundle and cached_runner == runner_text
    assert bundle_tar(cached, cached_runner) == first_tar  # what the host receives is the same bytes


def test_a_changed_playbook_or_plan_is_rendered_afresh(gp_home, tmp_path):
    first, _ = bundle_cache.bundle_for(make_host_plan(None, playbook(tmp_path, "echo one"), "ubuntu-24.04", StackPins()))
    edited, _ = bundle_cache.bundle_for(make_host_plan(None, playbook(tmp_path, "echo two"), "ubuntu-24.04", StackPins()))
    assert "echo one" in first.scripts[0].text and "echo two" in edited.scripts[0].text
    other_os, _ = bundle_cache.bundle_for(make_host_plan("T4", "minimal", "ubuntu-22.04", StackPins()))
    same_but_24, _ = bundle_cache.bundle_for(make_host_plan("T4", "minimal", "ubuntu-24.04", StackPins()))
    assert other_os != same_but_24


def test_a_damaged_entry_is_rendered_again_and_the_cache_stays_small(gp_home, tmp_path, monkeypatch):
    plan = make_host_plan(None, playbook(tmp_path, "echo one"), "ubuntu-24.04", StackPins())
    bundle, _ = bundle_cache.bundle_for(plan)
    (entry,) = (gp_home / "cache" / "bundles").glob("*.json")
    entry.write_text('{"scripts": [')  # cut short
    assert bundle_cache.bundle_for(plan)[0] == bundle
    monkeypatch.setattr(bundle_cache, "KEEP", 3)
    for i in range(6):
        bundle_cache.bundle_for(make_host_plan(None, playbook(tmp_path, f"echo {i}"), "ubuntu-24.04", StackPins()))
    assert len(list((gp_home / "cache" / "bundles").glob("*.json"))) == 3
