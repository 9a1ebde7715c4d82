"""`gpuprov facts` and `gpuprov facts refresh` against a local stand-in of the sources (tests/indexsite.py: recorded
PyPI metadata for torch with an invented 2.16.0 newer than the snapshot, the PyTorch wheel index, NVIDIA's
Packages per OS from the imitation repository), over HTTP on 127.0.0.1; the network in tests is loopback only.

What a user would notice: a refresh picks the new release up and the next plan installs it; with the sources
gone the refresh says which one did not answer, plans keep to the shipped snapshot and say once, past 90 days,
that its facts are old; a facts folder that does not read is one error line naming the file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov.sources import nvidia, torch
from tests import forkcli, indexsite


def gp(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return indexsite.build(tmp_path / "site", newer=True)


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "GPUPROV_HOME": str(tmp_path / "home"), "GPUPROV_FACTS_DIR": str(tmp_path / "facts"),
            "COLUMNS": "200", "NO_COLOR": "1"}


def test_a_refresh_picks_up_a_newer_release_and_the_plan_installs_it(site: Path, base_env: dict[str, str]) -> None:
    before = json.loads(gp(base_env, "plan", "--gpu", "H100", "--json").stdout)
    assert before["stack"]["torch"]["version"] == "2.15"  # the shipped snapshot's newest
    asked = gp(base_env, "plan", "--gpu", "H100", "--torch", "2.16.0")  # 2.16 is due 2026-12-22: not known yet
    assert asked.returncode == 2 and asked.stderr.startswith("error: --torch: unknown torch release '2.16.0'")
    with indexsite.serve(site) as (base, requests):
        env = {**base_env, **indexsite.env(base)}
        run = gp(env, "facts", "refresh", "--only", "torch", "--only", "drivers")
    assert run.returncode == 0, run.stderr
    assert "torch_releases 2.16: new {variants: [cu130, cu132], pypi_default: cu132, python: ['3.11', '3.15'], " \
           "released: '2026-12-22'}" in run.stdout
    # the PyTorch wheel index was asked for PEP 691 JSON first, PyPI's JSON API for the project and 2.15.0
    assert ("/whl/torch/", torch.ACCEPT_INDEX) in requests
    assert {"/pypi/torch/json", "/pypi/torch/2.15.0/json"} <= {path for path, _ in requests}
    after = json.loads(gp(base_env, "plan", "--gpu", "H100", "--json").stdout)  # offline again: the overlay is kept
    assert after["stack"]["torch"] == {"version": "2.16", "variant": "cu132", "cuda": "13.2",
                                       "index_url": "https://download.pytorch.org/whl/cu132"}
    # what no source says is marked: 2.16's SASS list, carried from 2.15's
    assert "torch 2.16+cu132's arch list was not read: torch 2.15's carried forward" in after["unverified"]
    # asked for by name, with the index's other variant: the refreshed row's cu130 wheels, on R580
    pinned = json.loads(gp(base_env, "plan", "--gpu", "H100", "--torch", "2.16.0", "--torch-cuda", "cu130",
                           "--driver", "580", "--json").stdout)
    assert (pinned["stack"]["torch"]["version"], pinned["stack"]["torch"]["variant"], pinned["stack"]["python"]) == (
        "2.16.0", "cu130", "3.12")
    assert "torch 2.16+cu130's arch list was not read: torch 2.15's carried forward" in pinned["unverified"]
    shown = json.loads(gp(base_env, "facts", "--json").stdout)
    torch_family = next(f for f in shown["families"] if f["name"] == "torch")
    assert torch_family["origin"] == "refreshed" and torch_family["source"].startswith(f"{base}/pypi/torch/json")
    # 2.12-2.14's per-version PyPI pages answered 404 (as in the recording): their PyPI default kept, and said so
    assert any(u.startswith("torch 2.14: its PyPI wheel's Requires-Dist was not read (HTTP 404")
               for u in torch_family["unverified"])


def _no_lock_row(plan: str) -> str:
    """The plan without its `wheels` row, which names `facts refresh` as what makes a wheel lock (test_wheel_lock.py)."""
    return "\n".join(line for line in plan.splitlines() if not line.strip().startswith("wheels "))


def test_with_the_sources_gone_the_snapshot_is_used_and_an_old_one_says_so_once(site: Path, base_env: dict[str, str]) -> None:
    with indexsite.serve(site) as (base, _):
        env = {**base_env, **indexsite.env(base)}
    run = gp(env, "facts", "refresh", "--only", "torch", "--only", "drivers")  # the server is gone now
    assert run.returncode == 1
    assert f"torch: not refreshed: {base}/pypi/torch/json: " in run.stderr
    assert f"drivers: not refreshed: {base}/repos/ubuntu2204/x86_64/Packages.gz: " in run.stderr
    assert not (Path(base_env["GPUPROV_FACTS_DIR"]) / "torch.yaml").exists()
    fresh = gp(env, "plan", "--gpu", "H100")
    assert fresh.returncode == 0 and "torch==2.15.*" in fresh.stdout
    assert "facts refresh" not in _no_lock_row(fresh.stdout) + fresh.stderr
    old = gp({**env, "GPUPROV_TEST_TODAY": "2027-03-15"}, "plan", "--gpu", "H100")  # 104 days after the snapshot was read
    assert old.returncode == 0 and "torch==2.15.*" in old.stdout
    said = " ".join((_no_lock_row(old.stdout) + old.stderr).split())
    assert said.count("gpuprov facts refresh") == 1  # once, whatever the families past 90 days
    warning = ("the facts are 104 days old (5 of 5 families past 90 days, the oldest read 2026-12-01 from the shipped "
               "snapshot): `gpuprov facts refresh` reads them again")
    assert f"warning: {warning}" in said
    data = json.loads(gp({**env, "GPUPROV_TEST_TODAY": "2027-03-15"}, "plan", "--gpu", "H100", "--json").stdout)
    assert [w for w in data["warnings"] if "facts refresh" in w] == [warning]


def test_the_repository_index_gives_the_toolkits_per_os_and_the_plan_follows_it(site: Path, base_env: dict[str, str],
                                                                               tmp_path: Path) -> None:
    # NVIDIA's ubuntu2404 index of the imitation repository without 12.5: the refreshed facts say 12.6 is its first
    text = (site / "repos/ubuntu2404/x86_64/Packages").read_text()
    stanzas = [s for s in text.split("\n\n") if "Package: cuda-toolkit-12-5\n" not in s]
    (site / "repos/ubuntu2404/x86_64/Packages").write_text("\n\n".join(stanzas))
    (site / "repos/ubuntu2404/x86_64/Packages.gz").unlink()  # Packages.gz 404s: apt's fallback, Packages
    with indexsite.serve(site) as (base, _):
        run = gp({**base_env, **indexsite.env(base)}, "facts", "refresh", "--only", "drivers")
    assert run.returncode == 0, run.stderr
    assert "repo_toolkits ubuntu-24.04: ['12.5', '12.6'," in run.stdout
    refused = gp(base_env, "plan", "--gpu", "A10G", "--cuda", "12.5")
    assert refused.returncode == 2 and refused.stderr.startswith(
        "error: --cuda: NVIDIA's ubuntu-24.04 repository has no cuda-toolkit-12-5 (CUDA 12.5): its toolkits are 12.6 to 13.5")
    assert "--os ubuntu-22.04 (whose repository has it)" in refused.stderr
    assert gp(base_env, "plan", "--gpu", "A10G", "--cuda", "12.5", "--os", "ubuntu-22.04").returncode == 0


def test_a_bad_source_url_is_one_error_line_naming_its_variable(base_env: dict[str, str]) -> None:
    run = gp({**base_env, "GPUPROV_PYPI_URL": "ftp://mirror.invalid/pypi"}, "facts", "refresh", "--only", "torch")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.splitlines()[0] == "error: GPUPROV_PYPI_URL: 'ftp://mirror.invalid/pypi' is not an http(s) URL"


def test_a_facts_file_that_does_not_read_names_itself(base_env: dict[str, str]) -> None:
    folder = Path(base_env["GPUPROV_FACTS_DIR"])
    folder.mkdir(parents=True)
    (folder / "torch.yaml").write_text("family: torch\nread: yesterday\nsources: []\nvalues: {}\n")
    run = gp(base_env, "plan", "--gpu", "H100")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.startswith(f"error: {folder / 'torch.yaml'}: read: ")
    assert "delete the file to use the shipped facts" in run.stderr


def test_facts_shows_each_family_its_age_and_the_ended_branches(base_env: dict[str, str]) -> None:
    shown = json.loads(gp({**base_env, "GPUPROV_TEST_TODAY": "2026-12-03"}, "facts", "--json").stdout)
    assert [f["name"] for f in shown["families"]] == ["torch", "cuda", "drivers", "driver-lifecycle", "instance-types"]
    assert all(f["origin"] == "snapshot" for f in shown["families"])
    assert {f["name"]: (f["read"], f["age_days"]) for f in shown["families"]} == {
        "torch": ("2026-12-03", 0), "cuda": ("2026-12-03", 0), "drivers": ("2026-12-01", 2),
        "driver-lifecycle": ("2026-12-01", 2), "instance-types": ("2026-12-03", 0)}
    branches = {b["branch"]: b for b in shown["driver_branches"]}
    assert branches[610]["ended"] and branches[610]["end_of_life"] == "2026-08"  # an NFB that ended in August 2026
    assert branches[570]["ended"] and not branches[595]["ended"] and not branches[620]["ended"]
    human = gp({**base_env, "GPUPROV_TEST_TODAY": "2026-12-03", "COLUMNS": "80"}, "facts")
    assert human.returncode == 0 and max(len(line) for line in human.stdout.splitlines()) <= 80
    assert "R610   │ NFB  │ 2026-08     │ ended" in human.stdout


def test_pinning_an_ended_branch_is_allowed_with_a_warning(base_env: dict[str, str]) -> None:
    run = gp({**base_env, "GPUPROV_TEST_TODAY": "2026-12-01"}, "plan", "--gpu", "H100", "--driver", "610")
    assert run.returncode == 0, run.stderr
    assert ("warning: driver R610 (a New Feature Branch) reached its end of life in 2026-08: NVIDIA no longer fixes it; "
            "--driver 620 is supported") in run.stdout


# --- the readers on their own, on recorded shapes ---------------------------------------------------------------------

def test_the_pypi_default_variant_comes_from_the_wheels_cuda_dependency() -> None:
    excerpt = json.loads((indexsite.RECORDED / "pypi-torch-json.excerpt.json").read_text())
    assert torch.cuda_of(excerpt["info"]["requires_dist"]) == "cu132"  # torch 2.15.0: cuda-toolkit[...]==13.2.2
    # torch 2.14's PyPI wheels, as public install logs quote their Requires-Dist: cu130, whatever the RFC planned
    assert torch.cuda_of(['cuda-toolkit[cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3; '
                          'platform_system == "Linux"']) == "cu130"
    assert torch.cuda_of(['nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux"']) == "cu128"
    assert torch.cuda_of(['nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Windows"']) is None
    assert torch.cuda_of(["filelock", "sympy>=1.13.3"]) is None


def test_the_wheel_index_is_read_as_json_or_html() -> None:
    page, html = indexsite.wheel_index(newer=False)
    as_json = torch.index_filenames(torch.http.Response("x", torch.PEP691, json.dumps(page).encode()))
    as_html = torch.index_filenames(torch.http.Response("x", "text/html", html.encode()))
    assert as_json == as_html and "torch-2.15.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl" in as_html


def test_a_packages_index_gives_names_versions_and_virtual_names() -> None:
    stanzas = nvidia.parse_packages(indexsite.packages_index("ubuntu2404/x86_64"))
    fm = [s for s in stanzas if s.package == "nvidia-fabricmanager" and s.version == "580.95.05-1"]
    assert fm and fm[0].provides == ("nvidia-fabricmanager-580",)
    assert nvidia.upstream("595.71.05-0ubuntu1") == "595.71.05"
