"""gpuprov/settings.py: the one reader of config.toml and the GPUPROV_* environment, once per process."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov import settings as settings_module
from gpuprov.errors import UserInputError
from gpuprov.settings import settings


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('gpu = "L4"\n\nstate = "s3://team-bucket/gp"\nlease = 30\n')
    for name in ("GPUPROV_STATE", "GPUPROV_LEASE_SECONDS", "GPUPROV_HOME", "GPUPROV_TEST_POLL_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUPROV_CONFIG", str(path))
    return path


def test_each_value_says_where_it_came_from_and_the_environment_wins(config: Path, monkeypatch) -> None:
    found = settings()
    assert found.config.path == config and found.config.named and found.config.kind == "file"
    assert (found.state.text, found.state.where) == ("s3://team-bucket/gp", f"{config}:3: state")
    assert (found.lease.text, found.lease.where) == ("30", f"{config}:4: lease")
    monkeypatch.setenv("GPUPROV_LEASE_SECONDS", "60")
    monkeypatch.setenv("GPUPROV_STATE", "  ")  # blank: as if unset, the file's applies
    found = settings()
    assert (found.lease.text, found.lease.where) == ("60", "GPUPROV_LEASE_SECONDS")
    assert found.state.where == f"{config}:3: state"


def test_the_file_is_read_once_until_the_environment_changes_or_a_reset(config: Path, monkeypatch, reads_of) -> None:
    reads = reads_of(config)
    first = settings()
    config.write_text('gpu = "T4"\n')  # the process keeps what it read
    assert all(settings() is first for _ in range(50))
    assert len(reads) == 1 and first.config.data["gpu"] == "L4"
    monkeypatch.setenv("GPUPROV_HOME", "/tmp/elsewhere")  # the process changed its own environment: read again
    assert settings().config.data == {"gpu": "T4"} and settings().home == Path("/tmp/elsewhere")
    assert len(reads) == 2
    settings_module.reset()
    settings()
    assert len(reads) == 3


def test_a_broken_file_is_kept_as_its_problem_for_the_commands_to_name(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "config.toml"
    path.write_text("state = \n")
    monkeypatch.setenv("GPUPROV_CONFIG", str(path))
    monkeypatch.delenv("GPUPROV_STATE", raising=False)
    found = settings()
    assert found.config.problem is not None and found.config.problem.startswith("not valid TOML")
    assert found.state is None  # the records' place is then the local file's, as without a file
    monkeypatch.setenv("GPUPROV_CONFIG", str(tmp_path / "missing.toml"))
    assert settings().config.kind == "missing" and settings().config.named


@pytest.mark.parametrize(("text", "positive", "words"), [
    ("nan", False, "expected seconds (a number >= 0), got 'nan'"),
    ("-1", False, "expected seconds (a number >= 0), got '-1'"),
    ("0", True, "expected seconds (a number > 0), got '0'"),
])
def test_seconds_refused_name_their_variable(text: str, positive: bool, words: str, monkeypatch) -> None:
    monkeypatch.setenv("GPUPROV_TEST_POLL_SECONDS", text)
    given = settings().test_poll_seconds
    assert given is not None
    with pytest.raises(UserInputError) as exc:
        given.seconds(positive=positive)
    assert (exc.value.field, exc.value.problem) == ("GPUPROV_TEST_POLL_SECONDS", words)
