"""Wheels pinned by hash (issue 39 §2): `facts refresh --only wheels` locks torch's wheels with the sha256 the origin
index lists (pip's own installation report, against tests/indexsite.py's stand-in of the PyTorch wheel index, which
serves tiny real wheels); the plan says which lock its wheels are pinned by; the torch step installs them with
`--require-hashes` from whichever index the sources map names, and a mirror that serves a changed wheel under the
same name is refused in one line naming the wheel and the index. pip's refusal is real: the rendered step runs pip
into a venv in tmp. Fast lane: CliRunner, a local HTTP server, pip and bash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gpuprov.cli import main
from tests import indexsite
from tests.shimrun import LOCAL_PYTHON
from tests.test_guardrails import assert_bash_and_shellcheck_pass

PLAYBOOK = "name: locked\nenv: {manager: conda}\n"  # conda's env installs with the env's own pip


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(origin, mirror): the stand-in index, and a mirror of it that serves a changed filelock wheel."""
    root = tmp_path_factory.mktemp("sites")
    origin = indexsite.build(root / "origin", newer=False)
    mirror = indexsite.build(root / "mirror", newer=False, changed="filelock")
    with indexsite.serve(origin) as (origin_url, _), indexsite.serve(mirror) as (mirror_url, _):
        yield origin_url, mirror_url


def _facts_folder(folder: Path) -> Path:
    """A facts folder of its own, with the tests' pinned uv stand-in (tests/conftest.py)."""
    folder.mkdir()
    (folder / "installers.yaml").write_text((Path(os.environ["GPUPROV_FACTS_DIR"]) / "installers.yaml").read_text())
    return folder


@pytest.fixture
def facts_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = _facts_folder(tmp_path / "facts")
    monkeypatch.setenv("GPUPROV_FACTS_DIR", str(folder))
    return folder


@pytest.fixture(scope="module")
def locked_facts(sites: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A facts folder whose wheels `facts refresh` locked from the origin, made once for the tests that use it."""
    folder = _facts_folder(tmp_path_factory.mktemp("locked") / "facts")
    run = refresh(sites[0], GPUPROV_FACTS_DIR=str(folder))
    assert run.exit_code == 0, run.output
    return folder


@pytest.fixture
def locked(locked_facts: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUPROV_FACTS_DIR", str(locked_facts))
    return locked_facts


def gp(*args: str, **env: str) -> Any:
    return CliRunner().invoke(main, list(args), prog_name="gpuprov", env={"COLUMNS": "220", **env})


def refresh(origin: str, **env: str) -> Any:
    return gp("facts", "refresh", "--only", "wheels", "--python", LOCAL_PYTHON, GPUPROV_PYTORCH_INDEX_URL=f"{origin}/whl",
              **env)


def test_the_lock_comes_from_the_origin_and_the_plan_says_it(sites: tuple[str, str], facts_dir: Path,
                                                            gp_home: Path) -> None:
    origin, _ = sites
    before = gp("plan", "--gpu", "H100", "--python", LOCAL_PYTHON, "--region", "us-east-1")
    assert "wheels          not pinned by hash (run `gpuprov facts refresh`)" in before.output
    run = refresh(origin)
    assert run.exit_code == 0, run.output
    assert f"wheels: read from {origin}/whl/cu130, {origin}/whl/cu132" in run.output
    assert f"torch==2.15.* cu132 Python {LOCAL_PYTHON} x86_64: new lock (torch 2.15.0+cu132, 2 wheels)" in run.output
    locks = yaml.safe_load((facts_dir / "wheel-locks.yaml").read_text())["locks"]
    assert {(lk["variant"], lk["arch"]) for lk in locks} == {(v, a) for v in ("cu130", "cu132")
                                                               for a in ("x86_64", "aarch64")}
    one = next(lk for lk in locks if (lk["variant"], lk["arch"]) == ("cu132", "x86_64"))
    assert [w["name"] for w in one["wheels"]] == ["torch", "filelock"]
    assert one["wheels"][0]["url"].startswith(f"{origin}/whl/cu132/torch-2.15.0%2Bcu132-cp")
    assert one["source"].startswith("pip ") and one["index"] == f"{origin}/whl/cu132"
    # the same again changes nothing
    again = refresh(origin)
    assert again.exit_code == 0 and "  no change" in again.output
    plan = gp("plan", "--gpu", "H100", "--python", LOCAL_PYTHON, "--region", "us-east-1", "--json")
    wheels = json.loads(plan.output)["wheels"]
    assert wheels.startswith(f"hash-pinned by wheel-locks.yaml: torch 2.15.0+cu132, Python {LOCAL_PYTHON}, x86_64, "
                             f"2 wheels, read ") and wheels.endswith(f" from {origin}/whl/cu132")
    # a Python no lock was made for: not pinned, and said so
    other = gp("plan", "--gpu", "H100", "--python", "3.13", "--region", "us-east-1", "--json")
    assert json.loads(other.output)["wheels"] == "not pinned by hash (run `gpuprov facts refresh`)"


def test_a_mirror_that_serves_a_changed_wheel_is_refused_and_the_origins_installs(
        sites: tuple[str, str], locked: Path, gp_home: Path, tmp_path: Path) -> None:
    origin, mirror = sites
    playbook = tmp_path / "locked.yml"
    playbook.write_text(PLAYBOOK)
    out = tmp_path / "bundle"
    rendered = gp("render", "--gpu", "H100", "-p", str(playbook), "--python", LOCAL_PYTHON, "--region", "us-east-1",
                  "--sources", str(_sources(tmp_path, mirror)), "-o", str(out))
    assert rendered.exit_code == 0, rendered.output
    step = next(out.glob("*-pytorch.sh"))
    text = step.read_text()
    assert "--require-hashes" in text and "filelock==3.20.0 --hash=sha256:" in text
    assert "index_url=" + f"{mirror}/whl/cu132" in text.replace("'", "")
    assert_bash_and_shellcheck_pass([step])

    root = tmp_path / "root"
    env_dir = root / "opt/gpuprov/env"
    venv.create(env_dir, with_pip=True)
    ran = _run(step, root)
    assert ran.returncode == 1
    refusal = [line for line in ran.stderr.splitlines() if "FAILED" in line]
    assert len(refusal) == 1 and refusal[0].endswith(
        f"FAILED: {mirror}/whl/cu132 served filelock==3.20.0 with a sha256 other than the lock's (the origin's): "
        "refused, nothing installed"), ran.stderr[-3000:]
    assert "attempt 1 failed" not in ran.stderr  # refused at once, not retried
    assert not list((env_dir / "lib").glob("python*/site-packages/torch"))

    # the same plan from the origin installs the locked wheels
    rendered = gp("render", "--gpu", "H100", "-p", str(playbook), "--python", LOCAL_PYTHON, "--region", "us-east-1",
                  "--sources", str(_sources(tmp_path, origin)), "-o", str(tmp_path / "good"))
    assert rendered.exit_code == 0, rendered.output
    good = _run(next((tmp_path / "good").glob("*-pytorch.sh")), root)
    assert good.returncode == 0 and good.stdout.strip().endswith("GPUPROV_RESULT=changed"), good.stderr[-3000:]
    assert "installed torch 2.15.0+cu132" in good.stderr


def _sources(folder: Path, base: str) -> Path:
    path = folder / f"sources-{base.rsplit(':', 1)[1]}.yml"
    path.write_text(yaml.safe_dump({"torch": f"{base}/whl", "pypi": f"{base}/simple"}))
    return path


def _run(step: Path, root: Path) -> subprocess.CompletedProcess[str]:
    """The step as a node runs it, with no pip configuration of this machine's (a constraint, a wheel folder)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV"))}
    env.update(GPUPROV_SYSROOT=str(root), PIP_CONFIG_FILE=os.devnull, GPUPROV_RETRY_DELAY="0",
               PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    return subprocess.run(["bash", str(step)], capture_output=True, text=True, env=env, timeout=120)


def test_the_uv_env_installs_the_lock_with_uv_in_hash_checking_mode(sites: tuple[str, str], locked: Path,
                                                                    gp_home: Path, tmp_path: Path) -> None:
    """The shipped pytorch playbook's env is uv's: `uv pip install --require-hashes` (uv refuses a changed wheel
    with "Hash mismatch for `NAME==VERSION`", which the step reads the same way)."""
    _, mirror = sites
    rendered = gp("render", "--gpu", "H100", "--python", LOCAL_PYTHON, "--region", "us-east-1",
                  "--sources", str(_sources(tmp_path, mirror)), "-o", str(tmp_path / "uv"))
    assert rendered.exit_code == 0, rendered.output
    step = next((tmp_path / "uv").glob("*-pytorch.sh"))
    assert '"$uv_bin" pip install --python "$py" --require-hashes --only-binary :all: -r "$lock_file"' in step.read_text()
    assert_bash_and_shellcheck_pass([step])


def test_the_installers_pins_are_read_from_their_releases_and_kept_when_not_reachable(
        sites: tuple[str, str], facts_dir: Path, gp_home: Path) -> None:
    """`facts refresh --only installers`: uv's and Miniforge's newest releases (GitHub's releases API) and the
    `.sha256` beside each asset, kept in installers.yaml with where and when; the env step then downloads that
    release and checks that sum. With GitHub not answering, each pin is kept and the refresh says so."""
    origin, _ = sites
    github = {"GPUPROV_GITHUB_URL": origin, "GPUPROV_GITHUB_API_URL": origin}
    run = gp("facts", "refresh", "--only", "installers", **github)
    assert run.exit_code == 0, run.output
    assert "uv: 0.12.21 -> 0.13.9" in run.output and "miniforge: 25.11.0-1 -> 26.1.0-0" in run.output
    pins = yaml.safe_load((facts_dir / "installers.yaml").read_text())
    assert pins["uv"]["sha256"] == {a: indexsite.release_sha256("uv", a) for a in ("aarch64", "x86_64")}
    assert pins["uv"]["source"].startswith(f"astral-sh/uv release 0.13.9's .sha256 files ({origin}/astral-sh/uv/"
                                           "releases/download/0.13.9/uv-{arch}-unknown-linux-musl.tar.gz.sha256), "
                                           "the latest release, read 20")
    assert pins["miniforge"]["version"] == "26.1.0-0"
    rendered = gp("plan", "--gpu", "H100", "--region", "us-east-1", "--json")
    assert rendered.exit_code == 0
    from gpuprov.plan import sources

    assert sources.installers()["uv"].sha256["x86_64"] == indexsite.release_sha256("uv", "x86_64")
    # GitHub gone: each pin kept, said, and the refresh is not a failure
    gone = gp("facts", "refresh", "--only", "installers", GPUPROV_GITHUB_URL="http://127.0.0.1:9",
              GPUPROV_GITHUB_API_URL="http://127.0.0.1:9")
    assert gone.exit_code == 0, gone.output
    assert "uv: not reachable (http://127.0.0.1:9/astral-sh/uv/releases/download/0.13.9/" in gone.output
    assert "kept the pin, 0.13.9" in gone.output and "kept the pin, 26.1.0-0" in gone.output
    assert yaml.safe_load((facts_dir / "installers.yaml").read_text()) == pins


def test_a_wheel_the_index_lists_without_a_sha256_is_not_locked() -> None:
    """pip's report carries the sha256 the index listed; a wheel listed without one (the PyTorch index has had such
    gaps) leaves the lock unmade, naming the wheel and the index, rather than hashing a mirror's or a download."""
    from gpuprov.errors import GpuprovError
    from gpuprov.sources import wheel_lock

    def item(name: str, archive: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": name, "version": "1.0"},
                "download_info": {"url": f"https://index.example/whl/{name}-1.0-py3-none-any.whl", "archive_info": archive}}

    sha = "a" * 64
    report = {"install": [item("torch", {"hashes": {"sha256": sha}}), item("filelock", {"hash": f"sha256={sha}"})]}
    assert [(w.name, w.sha256) for w in wheel_lock.from_report(report, "https://index.example/whl/cu132")] == [
        ("torch", sha), ("filelock", sha)]
    report["install"].append(item("triton", {}))
    with pytest.raises(GpuprovError, match=r"^https://index.example/whl/cu132: lists no sha256 for triton 1.0 "):
        wheel_lock.from_report(report, "https://index.example/whl/cu132")
