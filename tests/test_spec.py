"""Playbook loading in-process: the file, line and field of the first problem (the CLI tests show the same through
`gpuprov plan`; these pin each rule where mutation testing can see it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.errors import UserInputError
from gpuprov.plan.spec import Playbook, format_duration, load_playbook, shipped_playbooks


def _load_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "p.yml"
    path.write_text(text)
    with pytest.raises(UserInputError) as exc:
        load_playbook(str(path))
    assert exc.value.field == "--playbook"
    return exc.value.problem


def test_a_bad_value_names_its_file_line_and_dotted_field(tmp_path: Path) -> None:
    problem = _load_error(tmp_path, "name: ok\nstack: none\nenv: null\nsteps:\n  - name: a\n    run: 'true'\n"
                                    "  - name: B-bad\n    run: 'true'\n")
    assert problem.startswith(f"{tmp_path / 'p.yml'}:7: steps.1.name: ") and "more problem" not in problem


def test_an_unknown_field_lists_the_allowed_ones_at_that_level(tmp_path: Path) -> None:
    problem = _load_error(tmp_path, "name: ok\nenv:\n  manager: uv\n  pth: /opt/x\n")
    assert f"{tmp_path / 'p.yml'}:4: env.pth: unknown field 'pth'; allowed: manager, path, packages" in problem
    top = _load_error(tmp_path, "name: ok\nstep: []\n")
    assert ":2: step: unknown field 'step'; allowed: name, description, stack" in top


def test_more_problems_are_counted(tmp_path: Path) -> None:
    problem = _load_error(tmp_path, "name: Bad Name\nstack: maybe\n")
    assert problem.startswith(f"{tmp_path / 'p.yml'}:1: name: ") and problem.endswith("(and 1 more problem(s))")


def test_a_top_level_list_or_broken_yaml_is_refused(tmp_path: Path) -> None:
    assert "expected a mapping of fields at the top level" in _load_error(tmp_path, "- a\n- b\n")
    assert f"{tmp_path / 'p.yml'}:3: not valid YAML" in _load_error(tmp_path, "name: ok\nstack: gpu\n  env: x\n")


def test_shipped_playbooks_by_name_and_unknown_names(tmp_path: Path) -> None:
    assert {"minimal", "pytorch", "jupyter"} <= set(shipped_playbooks())
    assert load_playbook("minimal").name == "minimal" and load_playbook("minimal").torch is False
    with pytest.raises(UserInputError) as exc:
        load_playbook("nosuch")
    assert exc.value.field == "--playbook"
    assert "unknown playbook 'nosuch'" in exc.value.problem and "minimal" in exc.value.hint
    with pytest.raises(UserInputError) as exc:
        load_playbook(str(tmp_path / "missing.yml"))
    assert exc.value.field == "--playbook" and "no such file" in exc.value.problem and "minimal" in exc.value.hint


def test_a_yml_name_without_a_folder_is_a_file_in_the_current_directory(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "mine.yml").write_text("name: mine\nstack: none\nenv: null\n")
    monkeypatch.chdir(tmp_path)
    assert load_playbook("mine.yml").name == "mine"


@pytest.mark.parametrize(("data", "why"), [
    ({"name": "x", "stack": "none", "cuda_toolkit": True}, "need `stack: gpu`"),
    ({"name": "x", "steps": [{"name": "a", "run": "1"}, {"name": "a", "run": "2"}]}, "must be unique: a"),
    ({"name": "x", "jupyter": True, "env": None}, "`jupyter: true` needs an `env`"),
    ({"name": "x", "steps": [{"name": "a"}]}, "needs `run` or `files`"),
    ({"name": "x", "steps": [{"name": "a", "files": [{"path": "/a/../b", "content": ""}]}]}, "'..' components"),
    ({"name": "x", "env": {"packages": ["torch; sys_platform"]}}, "is not a package requirement"),
])
def test_inconsistent_playbooks_are_refused_with_the_rule(data: dict, why: str) -> None:
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace("`", "`")):
        Playbook.model_validate(data)


def test_installs_torch_only_with_a_gpu_stack_torch_and_an_env() -> None:
    assert Playbook.model_validate({"name": "x"}).installs_torch
    assert not Playbook.model_validate({"name": "x", "stack": "none"}).installs_torch
    assert not Playbook.model_validate({"name": "x", "torch": False}).installs_torch
    assert not Playbook.model_validate({"name": "x", "env": None}).installs_torch


@pytest.mark.parametrize(("seconds", "text"), [(None, "off"), (45, "45s"), (3600, "1h"), (5400, "1h30m"),
                                               (90061, "1d1h1m"), (0, "0s"), (-5, "0s")])
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_a_rule_across_fields_points_at_the_document(tmp_path: Path) -> None:
    problem = _load_error(tmp_path, "\nname: x\nstack: none\ncuda_toolkit: true\n")
    assert problem.startswith(f"{tmp_path / 'p.yml'}:2: (top level): ") and "need `stack: gpu`" in problem


def test_duration_bounds_are_inclusive_and_errors_say_what_works() -> None:
    from gpuprov.plan.spec import MAX_DURATION_S, MIN_DURATION_S, parse_duration

    assert parse_duration("1m", "--ttl") == MIN_DURATION_S and parse_duration("90d", "--ttl") == MAX_DURATION_S
    for text in ("59s", "90d1s"):
        with pytest.raises(UserInputError) as exc:
            parse_duration(text, "--ttl")
        assert (exc.value.field, exc.value.problem, exc.value.hint) == ("--ttl", f"{text!r} is out of range",
                                                                         "between 1m and 90d")
    with pytest.raises(UserInputError) as exc:
        parse_duration("soon", "--autostop")
    assert (exc.value.problem, exc.value.hint) == ("'soon' is not a duration", "e.g. 30m, 2h, 1h30m, 1d, or off")
    with pytest.raises(UserInputError) as exc:
        parse_duration("off", "--ttl", allow_off=False)
    assert exc.value.hint == "e.g. 30m, 2h, 1h30m, 1d"


@pytest.mark.parametrize(("seconds", "text"), [(86400, "1d"), (3661, "1h1m"), (90, "1m30s"), (86399, "23h59m")])
def test_format_duration_drops_seconds_once_hours_count(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text


def test_yaml_and_shape_errors_carry_their_hints(tmp_path: Path) -> None:
    path = tmp_path / "p.yml"
    path.write_text("name: ok\nstack: gpu\n  env: x\n")
    with pytest.raises(UserInputError) as exc:
        load_playbook(str(path))
    assert exc.value.hint == "check indentation and quoting" and "mapping values are not allowed" in exc.value.problem
    path.write_text("- a\n")
    with pytest.raises(UserInputError) as exc:
        load_playbook(str(path))
    assert exc.value.hint == "see Playbook's fields"


def test_an_unknown_field_in_a_file_lists_the_files_fields(tmp_path: Path) -> None:
    problem = _load_error(tmp_path, "name: ok\nsteps:\n  - name: a\n    files:\n      - path: /x\n        content: y\n"
                                    "        owner: root\n")
    assert ":7: steps.0.files.0.owner: unknown field 'owner'; allowed: path, content, mode" in problem


def test_a_missing_field_points_at_the_item_that_lacks_it(tmp_path: Path) -> None:
    problem = _load_error(tmp_path, "name: ok\nstack: none\nenv: null\nsteps:\n  - run: 'true'\n")
    assert problem.startswith(f"{tmp_path / 'p.yml'}:5: steps.0.name: Field required")


@pytest.mark.parametrize(("entry", "line", "message"), [
    ("  - from: s3://my-data/x\n    to: /data/x\n    when: down\n", 5, "data.0: `when` is for uploads"),
    ("  - from: /work/ckpt\n    to: s3://my-ckpt/run\n", 5,
     "data.0: an upload needs `when`: one or more of interrupt, stop, down"),
    ("  - from: /work/ckpt\n    to: s3://my-ckpt/run\n    when: interrupt|later\n", 7,
     "data.0.when.1: Input should be 'interrupt', 'stop' or 'down'"),
    ("  - from: /a\n    to: /b\n", 5, "data.0: one side is s3://BUCKET/PREFIX and the other a path on the node"),
    ("  - from: s3://My_Bucket/x\n    to: /data\n", 5, "data.0.from: 's3://My_Bucket/x' is not s3://"),
    ("  - from: s3://b-1/x\n    to: /data/../etc\n", 6, "data.0.to: '/data/../etc': a path must not"),
    ("  - from: s3://b-1/x\n    to: data\n", 6, "data.0.to: 'data' is neither s3://BUCKET/PREFIX nor"),
    ("  - from: s3://b-1/x\n    to: /data\n    mode: sync\n", 7, "data.0.mode: unknown field 'mode'; allowed: from, to, when"),
])
def test_a_bad_data_entry_names_its_line_and_what_is_wrong(tmp_path: Path, entry: str, line: int, message: str) -> None:
    problem = _load_error(tmp_path, f"name: ok\nstack: none\nenv: null\ndata:\n{entry}")
    assert problem.startswith(f"{tmp_path / 'p.yml'}:{line}: {message}"), problem
