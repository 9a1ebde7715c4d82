"""An offline bundle's wheels pinned by the wheel lock (issue 39 §2 and §4): `bundle --offline`, where a lock that
`facts refresh` made from the origin index fits the plan, downloads exactly the locked wheels in pip's hash-checking
mode from whichever index the sources map names, names the lock in the manifest and copies it into the bundle; a
mirror that serves a changed wheel is refused naming the wheel and the index, and the folder is then no bundle at
all. On the host, the torch step installs the bundle's wheels with `--require-hashes -r wheel-lock.txt --no-index
--find-links`, so pip refuses a wheel swapped in the bundle after it was made. Where no lock fits, the bundle is
made as before and says its wheels are not pinned by hash.

The index is tests/indexsite.py's stand-in of the PyTorch wheel index (tiny real wheels with their sha256, and its
`changed="filelock"` mirror), NVIDIA's repository tests/offlinerepo.py's signed imitation; pip is real, run into a
venv in tmp. Fast lane: CliRunner, local HTTP servers, gpg, pip and bash.
"""

from __future__ import annotations

import hashlib
import json
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from gpuprov.cli import main
from gpuprov.plan import offline
from gpuprov.plan.plan import make_host_plan
from gpuprov.plan.stack import StackPins
from tests.offlinerepo import python_release, served, simple_index, wheel
from tests.shimrun import LOCAL_PYTHON
from tests.test_guardrails import assert_bash_and_shellcheck_pass
from tests.test_offline import _repo, pinned, signer  # noqa: F401  (fixtures)
from tests.test_wheel_lock import PLAYBOOK, _run, locked_facts, sites  # noqa: F401  (fixtures)

TORCH = "2.15.0+cu132"  # what the stand-in's 2.15 release locks for the L4's plan


@pytest.fixture
def aux(tmp_path: Path, pinned: object) -> Iterator[str]:  # noqa: F811
    """The rest of what the L4's pytorch plan downloads: NVIDIA's repository, PyPI's uv, the plan's Python."""
    site = tmp_path / "aux"
    _repo(site, pinned)  # type: ignore[arg-type]
    simple_index(site / "simple", {"uv": [wheel("uv", "0.9.9", tag="py3-none-manylinux_2_17_x86_64")]})
    python_release(site / "pbs", LOCAL_PYTHON)
    with served(site) as base:
        yield base


def _bundle(tmp_path: Path, aux: str, index: str, out: Path, monkeypatch: pytest.MonkeyPatch) -> Result:
    monkeypatch.setenv("UV_PYTHON_INSTALL_MIRROR", f"{aux}/pbs/")
    where = tmp_path / f"sources-{index.rsplit(':', 1)[1]}.yml"
    where.write_text(yaml.safe_dump({"nvidia": f"{aux}/repos", "torch": f"{index}/whl", "pypi": f"{aux}/simple"}))
    return CliRunner().invoke(main, ["bundle", "--offline", "--gpu", "L4", "-p", "pytorch", "--python", LOCAL_PYTHON,
                                     "--sources", str(where), "-o", str(out)])


def test_a_lock_pins_the_bundles_wheels_and_a_mirrors_changed_wheel_is_refused(
        sites: tuple[str, str], locked_facts: Path, aux: str, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    origin, mirror = sites
    monkeypatch.setenv("GPUPROV_FACTS_DIR", str(locked_facts))
    out = tmp_path / "bundle"
    made = _bundle(tmp_path, aux, origin, out, monkeypatch)
    assert made.exit_code == 0, made.output
    manifest = offline.load(out)
    lock = manifest.lock
    assert lock is not None and lock.torch_version == TORCH and lock.index == f"{origin}/whl/cu132"
    assert f"wheels: hash-pinned by {lock.label}" in made.stdout and lock.read.date().isoformat() in lock.label
    assert (out / offline.LOCK_FILE).read_text() == lock.requirements()
    assert [(i.kind, i.path) for i in manifest.items if i.kind == "lock"] == [("lock", offline.LOCK_FILE)]
    held = {(i.name, i.version): i.sha256 for i in manifest.items if i.kind == "wheel"}
    assert {(w.name, w.version): w.sha256 for w in lock.wheels}.items() <= held.items()
    assert set(held) == {("torch", TORCH), ("filelock", "3.20.0"), ("uv", "0.9.9")}

    # the same plan from the mirror that serves a changed filelock (into a folder of its own: a rerun in `out` would
    # keep the origin's files, which have the lock's sha256): refused naming the wheel and the index, nothing kept
    # as a bundle, and the changed wheel nowhere in the folder
    elsewhere = tmp_path / "from-mirror"
    refused = _bundle(tmp_path, aux, mirror, elsewhere, monkeypatch)
    assert refused.exit_code == 1, refused.output
    assert refused.output.splitlines()[-1] == (
        f"error: {mirror}/whl/cu132 served filelock==3.20.0 with a sha256 other than the lock's ({lock.short}, the "
        "origin's): refused, no wheel was kept")
    assert not (elsewhere / offline.MANIFEST).exists() and not list(elsewhere.rglob("*.whl"))
    assert [p.name for p in elsewhere.iterdir() if p.name.startswith(".")] == []

    # no lock fits (a facts folder without one): the bundle as before, said not pinned
    monkeypatch.setenv("GPUPROV_FACTS_DIR", str(tmp_path))
    (tmp_path / "installers.yaml").write_text((locked_facts / "installers.yaml").read_text())
    unpinned = _bundle(tmp_path, aux, origin, out, monkeypatch)
    assert unpinned.exit_code == 0, unpinned.output
    assert "wheels: not pinned by hash (run `gpuprov facts refresh`)" in unpinned.stdout
    again = offline.load(out)
    assert again.lock is None and not (out / offline.LOCK_FILE).exists()
    assert {i.name for i in again.items if i.kind == "wheel"} == {"torch", "filelock", "uv"}


@pytest.fixture
def locked_bundle(sites: tuple[str, str], locked_facts: Path, aux: str, tmp_path: Path,  # noqa: F811
                  monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUPROV_FACTS_DIR", str(locked_facts))
    made = _bundle(tmp_path, aux, sites[0], tmp_path / "bundle", monkeypatch)
    assert made.exit_code == 0, made.output
    return tmp_path / "bundle"


def test_the_offline_torch_step_installs_the_bundles_locked_wheels_and_refuses_one_changed_in_it(
        locked_bundle: Path, sites: tuple[str, str], locked_facts: Path, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The rendered step, with the bundle at its place on a host (here the bundle's own folder), run with real pip
    into a venv: a filelock wheel swapped in the bundle (the mirror's, under the same name) is refused by pip,
    naming it, with nothing installed; the bundle's own installs torch. uv's step: the same flags, shellcheck clean.
    And `bootstrap --offline` refuses, before any host, a manifest whose locked wheel is not its lock's."""
    import urllib.request

    manifest = offline.load(locked_bundle)
    # the machine that bootstraps holds no lock: the step is pinned by the bundle's own
    (tmp_path / "no-locks").mkdir()
    (tmp_path / "no-locks" / "installers.yaml").write_text((locked_facts / "installers.yaml").read_text())
    monkeypatch.setenv("GPUPROV_FACTS_DIR", str(tmp_path / "no-locks"))
    playbook = tmp_path / "locked.yml"
    playbook.write_text(PLAYBOOK)  # conda's env installs with the env's own pip
    steps = {}
    for name, book in (("pip", str(playbook)), ("uv", "pytorch")):
        plan = offline.for_bundle(make_host_plan("L4", book, "ubuntu-24.04", StackPins(python=LOCAL_PYTHON)),
                                  manifest, str(locked_bundle))
        script = next(s for s in plan.bundle().scripts if s.name == "pytorch")
        steps[name] = tmp_path / f"{name}-{script.filename}"
        steps[name].write_text(script.text)
        assert (f"--require-hashes --only-binary{'=' if name == 'pip' else ' '}:all: -r \"$lock_file\" --no-index "
                '--find-links "$wheels_dir"') in script.text
        assert f"lock_file={locked_bundle}/{offline.LOCK_FILE}" in script.text
    assert_bash_and_shellcheck_pass(list(steps.values()))

    root = tmp_path / "root"
    env_dir = root / "opt/gpuprov/env"
    venv.create(env_dir, with_pip=True)
    filelock = locked_bundle / "wheels" / "filelock-3.20.0-py3-none-any.whl"
    original = filelock.read_bytes()
    with urllib.request.urlopen(f"{sites[1]}/whl/cu132/{filelock.name}") as answer:
        filelock.write_bytes(answer.read())
    assert hashlib.sha256(filelock.read_bytes()).hexdigest() != hashlib.sha256(original).hexdigest()
    ran = _run(steps["pip"], root)
    assert ran.returncode == 1
    refusal = [line for line in ran.stderr.splitlines() if "FAILED" in line]
    assert len(refusal) == 1 and refusal[0].endswith(
        f"FAILED: the offline bundle's {locked_bundle}/wheels served filelock==3.20.0 with a sha256 other than the "
        "lock's (the origin's): refused, nothing installed"), ran.stderr[-3000:]
    assert not list((env_dir / "lib").glob("python*/site-packages/torch"))

    filelock.write_bytes(original)
    good = _run(steps["pip"], root)
    assert good.returncode == 0 and good.stdout.strip().endswith("GPUPROV_RESULT=changed"), good.stderr[-3000:]
    assert f"installed torch {TORCH}" in good.stderr

    # before any host: a manifest made to hold the swapped wheel's sha256 (the bundle and its manifest changed after
    # it was made) is refused naming the wheel, as a missing item is
    data = json.loads((locked_bundle / offline.MANIFEST).read_text())
    for item in data["items"]:
        if item["kind"] == "wheel" and item["name"] == "filelock":
            item["sha256"] = "0" * 64
    (locked_bundle / offline.MANIFEST).write_text(json.dumps(data))
    refused = CliRunner().invoke(main, ["bootstrap", "root@127.0.0.1:1", "--gpu", "L4", "-p", "pytorch", "--python",
                                        LOCAL_PYTHON, "--offline", str(locked_bundle)])
    assert refused.exit_code == 2, refused.output
    assert refused.output.startswith("error: --offline: the bundle lacks what the plan needs: wheel filelock==3.20.0 "
                                     "with its lock's sha256 (step pytorch)"), refused.output

