"""A playbook is data, not code: arbitrary text in any string field is either rejected by
`spec.Playbook` validation or, rendered and executed under the shims, never runs as a command.
Only `run` is exempt (it is a command by definition). Each hostile string embeds shell payloads
that would create a canary file; the canary must never appear."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpuprov.plan.plan import steps_for
from gpuprov.plan.render import render_steps
from gpuprov.plan.spec import Playbook
from tests.shimrun import ShimHost

CANARY = "@CANARY@"  # replaced by the example's real canary path
PAYLOADS = [
    f"$(touch {CANARY})", f"`touch {CANARY}`", f";touch {CANARY}", f"\ntouch {CANARY}\n",
    f"'; touch {CANARY}; '",
    f'"; touch {CANARY}; "', f"$(touch${{IFS}}{CANARY})", f"|touch {CANARY}", f"&& touch {CANARY} #",
    f"${{X:-$(touch {CANARY})}}", f"\\\n touch {CANARY}", f"}}}}; touch {CANARY}; {{{{",
    f"{{% raw %}}$(touch {CANARY})",
]
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@st.composite
def hostile(draw: st.DrawFn, prefix: str = "") -> str:
    return prefix + draw(text) + draw(st.sampled_from(PAYLOADS)) + draw(text)


def field(clean: st.SearchStrategy[Any], prefix: str = "") -> st.SearchStrategy[Any]:
    """Mostly a valid value, sometimes a hostile one: a field that validation constrains rejects
    the hostile text, so it stays rare enough for most examples to pass validation and run."""
    return st.sampled_from([False] * 9 + [True]).flatmap(lambda bad: hostile(prefix) if bad else clean)


step_name = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)
files = st.lists(
    st.fixed_dictionaries({
        "path": hostile("/"),  # free text after the leading /, so always hostile
        "content": hostile(),
        "mode": field(st.sampled_from(["0644", "600", "0755"])),
    }),
    min_size=1, max_size=2,
)
steps = st.lists(
    st.fixed_dictionaries(
        {"name": field(step_name), "files": files},
        optional={"creates": hostile("/"), "run": st.just("true")},
    ),
    min_size=1, max_size=2,
)
playbooks = st.fixed_dictionaries({
    "name": field(st.just("hostile")),
    "description": hostile(),
    "stack": st.just("none"),
    "torch": st.just(False),
    "env": st.sampled_from([False] * 6 + [True]).flatmap(lambda bad: st.none() if not bad else st.fixed_dictionaries({
        "manager": st.just("uv"),
        "path": hostile("/"),
        "packages": st.lists(field(st.just("rich>=13")), min_size=1, max_size=2),
    })),  # env.path and packages are pattern-checked: hostile text there is always rejected
    "steps": steps,
})


def _with_canary(value: Any, canary: str) -> Any:
    if isinstance(value, str):
        return value.replace(CANARY, canary)
    if isinstance(value, list):
        return [_with_canary(v, canary) for v in value]
    if isinstance(value, dict):
        return {k: _with_canary(v, canary) for k, v in value.items()}
    return value


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=playbooks)
def test_no_playbook_string_runs_as_a_command(data: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="gp-safety-") as tmp:
        root = Path(tmp)
        canary = root / "CANARY"
        data = _with_canary(data, str(canary))
        try:
            playbook = Playbook.model_validate(data)
        except ValidationError:
            event("rejected by validation")
            return  # rejected: nothing is rendered, nothing runs
        ctx = {"plan": None, "stack": None, "playbook": playbook, "env": playbook.env}
        bundle = render_steps(steps_for(playbook, None), ctx, {})
        host = ShimHost(root / "host")
        runs = host.run_bundle(bundle)
        event("rendered and executed")
        assert not canary.exists(), f"a playbook string ran as a command: {data!r}"
        assert not (host.root / "CANARY").exists() and not (host.sysroot / "CANARY").exists()
        # what the steps did write is exactly the playbook's content (data, verbatim)
        if runs and all(r.ok for r in runs):
            event("every step succeeded")
            for step in playbook.steps:
                if step.creates is not None:
                    continue
                for f in step.files:
                    written = host.sysroot / f.path.lstrip("/")
                    last = [g for s in playbook.steps for g in s.files if g.path == f.path][-1]
                    assert written.read_bytes() == last.content.encode()


def test_run_is_the_one_command_field(tmp_path: Path) -> None:
    """The exemption, shown: `run` executes; the same text in `creates` or a file does not."""
    canary = tmp_path / "ran"
    playbook = Playbook.model_validate({
        "name": "cmd", "stack": "none", "torch": False, "env": None,
        "steps": [
            {"name": "data", "creates": f"/x$(touch {canary})",
             "files": [{"path": f"/f;touch {canary}", "content": f"$(touch {canary})"}]},
            {"name": "command", "run": f"touch {canary}"},
        ],
    })
    host = ShimHost(tmp_path / "host")
    ctx = {"plan": None, "stack": None, "playbook": playbook, "env": None}
    runs = host.run_bundle(render_steps(steps_for(playbook, None), ctx, {}))
    assert [r.result for r in runs] == ["changed", "changed"]
    assert (host.sysroot / f"f;touch {canary}".lstrip("/")).read_text() == f"$(touch {canary})"
    assert canary.exists()  # only because of `run`


def test_run_reaches_bash_exactly_as_written(tmp_path: Path) -> None:
    """`run` is one quoted word in the script: quotes, `$`, backticks, backslashes, newlines and non-ASCII
    text in it are what bash gets, not something the rendering rewrote."""
    out = tmp_path / "out"
    tricky = "it's \"quoted\" $HOME `x` \\ \\n ${IFS} ü 中 '' \t\ttabs\n  second line; $(true)"
    playbook = Playbook.model_validate({
        "name": "exact", "stack": "none", "torch": False, "env": None,
        "steps": [{"name": "heredoc", "run": f"cat > {out} <<'GPUPROV_EOF'\n{tricky}\nGPUPROV_EOF"}],
    })
    host = ShimHost(tmp_path / "host")
    ctx = {"plan": None, "stack": None, "playbook": playbook, "env": None}
    runs = host.run_bundle(render_steps(steps_for(playbook, None), ctx, {}))
    assert [r.result for r in runs] == ["changed"]
    assert out.read_text(encoding="utf-8") == tricky + "\n"


# --- every field × every payload, on every run ---------------------------------------------------
# Hypothesis above explores combinations; this table proves each (field, payload) pair deterministically.
# Fields a pattern constrains reject every payload; free-text fields accept it (unless the payload has a
# newline, which a path forbids) and it must arrive on the host as data, with its canary untouched.

FIELDS = ("name", "description", "files.path", "files.content", "files.mode", "creates", "env.path", "env.packages")
REJECTS_ALL = {"name", "files.mode", "env.path", "env.packages"}


def _playbook_with(field_name: str, value: str) -> dict[str, Any]:
    step: dict[str, Any] = {"name": "data", "files": [{"path": "/etc/gp-data", "content": "x", "mode": "0644"}]}
    data: dict[str, Any] = {"name": "hostile", "stack": "none", "torch": False, "env": None, "steps": [step]}
    env = {"manager": "uv", "path": "/opt/env", "packages": ["rich>=13"]}
    if field_name == "name":
        data["name"] = value
    elif field_name == "description":
        data["description"] = value
    elif field_name == "files.path":
        step["files"][0]["path"] = "/" + value
    elif field_name == "files.content":
        step["files"][0]["content"] = value
    elif field_name == "files.mode":
        step["files"][0]["mode"] = value
    elif field_name == "creates":
        step["creates"] = "/" + value
        step["run"] = "true"
    elif field_name == "env.path":
        data["env"] = {**env, "path": "/" + value}
    elif field_name == "env.packages":
        data["env"] = {**env, "packages": [value]}
    return data


@pytest.mark.parametrize("payload", PAYLOADS, ids=[f"p{i}" for i in range(len(PAYLOADS))])
@pytest.mark.parametrize("field_name", FIELDS)
def test_each_field_keeps_each_payload_as_data(field_name: str, payload: str, tmp_path: Path) -> None:
    canary = tmp_path / f"CANARY-{field_name}"  # one canary per field: a hit names the field that leaked
    value = payload.replace(CANARY, str(canary))
    data = _playbook_with(field_name, value)
    path_like = field_name in ("files.path", "creates")
    if field_name in REJECTS_ALL or (path_like and "\n" in value):
        with pytest.raises(ValidationError):
            Playbook.model_validate(data)
        return
    playbook = Playbook.model_validate(data)
    ctx = {"plan": None, "stack": None, "playbook": playbook, "env": playbook.env}
    host = ShimHost(tmp_path / "host")
    runs = host.run_bundle(render_steps(steps_for(playbook, None), ctx, {}))
    assert not canary.exists(), f"{field_name} ran {value!r} as a command"
    assert [r.ok for r in runs] == [True] * len(runs), [r.stderr[-300:] for r in runs]
    # the value arrived verbatim, as data
    if field_name == "files.path":
        assert (host.sysroot / value).read_text() == "x"
    elif field_name == "files.content":
        assert (host.sysroot / "etc/gp-data").read_text() == value
    elif field_name == "creates":
        assert f"did not create {host.sysroot}/{value}" in runs[-1].stderr
