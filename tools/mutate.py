"""`make mutate`: mutmut on the modules that decide things, each with the tests that cover it in-process.

Each module runs in its own scratch copy of the checkout (.mutate/<module>/, gitignored), because mutmut reads
its settings from ./pyproject.toml and copies the tree into ./mutants. Surviving mutants (the diff of each) and the
score per module go to .mutate/report.md. Tests that need the SSH test hosts skip there (GPUPROV_TEST_MUTATE=1): mutmut
maps tests to functions in-process, and those tests drive the CLI in subprocesses, which it cannot see.

    python tools/mutate.py                       # every module below
    python tools/mutate.py compat verify         # some of them (plan/compat or just compat)
    MUTATE_JOBS=2 python tools/mutate.py compat  # mutmut's --max-children (default 1: a small machine)
    MUTATE_REPORT_ONLY=1 python tools/mutate.py compat   # the report again from the last run's results
    MUTATE_ONLY='*_with_alternative*' python tools/mutate.py compat  # only mutants whose names match (fnmatch)

MUTATE_ONLY takes mutmut's mutant names or fnmatch patterns (space-separated; names look like
gpuprov.plan.compat.x__with_alternative__mutmut_7): a quick rerun of the functions just worked on. The module's
score then counts only those mutants (the others are "not checked").
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".mutate"
MUTMUT = str(Path(sys.executable).parent / "mutmut")

# module (path under src/gpuprov) -> the test files that exercise it in-process
MODULES: dict[str, list[str]] = {
    "plan/compat": ["tests/test_compat.py"],
    "plan/stack": ["tests/test_compat.py"],
    "plan/pins": ["tests/test_compat.py"],
    # plan's decisions in fast in-process tests; test_templates/test_guardrails render and shellcheck whole plans,
    # which made each mutant cost tens of seconds
    "plan/plan": ["tests/test_plan_unit.py"],
    "plan/spec": ["tests/test_templates.py", "tests/test_guardrails.py", "tests/test_spec.py"],
    "hosts/verify": ["tests/test_verify.py"],
    "hosts/hostkeys": ["tests/test_hostkeys.py"],
    "cloud/failover": ["tests/test_lifecycle_unit.py", "tests/test_failover.py"],
    "cloud/teardown": ["tests/test_teardown.py"],
}


def _tree(dest: Path, module: str) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in ("src", "tests", "templates", "playbooks"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    tests = [t for t in MODULES[module] if (ROOT / t).exists()]
    config = (ROOT / "pyproject.toml").read_text() + (
        "\n[tool.mutmut]\n"
        'source_paths = ["src/gpuprov"]\n'
        f'only_mutate = ["src/gpuprov/{module}.py"]\n'
        f"pytest_add_cli_args_test_selection = {tests!r}\n"
        'pytest_add_cli_args = ["-q", "-p", "no:cacheprovider"]\n'
        'also_copy = ["templates", "playbooks"]\n'
    ).replace("'", '"')
    (dest / "pyproject.toml").write_text(config)


def _results(where: Path) -> dict[str, str]:
    out = subprocess.run([MUTMUT, "results", "--all", "true"], cwd=where, capture_output=True, text=True).stdout
    return dict(re.findall(r"^\s*(\S+): (.+?)\s*$", out, re.M))


_STRING = re.compile(r"""[rbfRBF]*("([^"\\]|\\.)*"|'([^'\\]|\\.)*')""")


def text_only(diff: str) -> bool:
    """A mutant that changes only what a string literal says (a message's wording): the tests assert rule ids and
    values, not wording, so these survive by design and are counted apart."""
    removed = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return bool(removed) and [_STRING.sub('""', x) for x in removed] == [_STRING.sub('""', x) for x in added]


def run(module: str, jobs: int) -> str:
    where = WORK / module.replace("/", "-")
    if not (os.environ.get("MUTATE_REPORT_ONLY") and (where / "mutants").is_dir()):
        _tree(where, module)
        env = {**os.environ, "GPUPROV_TEST_MUTATE": "1"}
        print(f"== {module}: mutmut run in {where}", flush=True)
        only = os.environ.get("MUTATE_ONLY", "").split()
        subprocess.run([MUTMUT, "run", "--max-children", str(jobs), *only], cwd=where, env=env,
                       stdout=subprocess.DEVNULL)
    results = _results(where)
    counts: dict[str, int] = {}
    for status in results.values():
        counts[status] = counts.get(status, 0) + 1
    killed, survived = counts.get("killed", 0), counts.get("survived", 0)
    untested, timeouts = counts.get("no tests", 0), counts.get("timeout", 0)
    unchecked = counts.get("not checked", 0)
    diffs = {name: subprocess.run([MUTMUT, "show", name], cwd=where, capture_output=True, text=True).stdout
             for name, status in results.items() if status == "survived"}
    wording = sorted(name for name, diff in diffs.items() if text_only(diff))
    judged = killed + survived + timeouts
    score = f"{100 * (killed + timeouts) / judged:.0f}%" if judged else "n/a"
    logic = judged - len(wording)
    logic_score = f"{100 * (killed + timeouts) / logic:.0f}%" if logic else "n/a"
    lines = [f"## {module}.py: score {score}, {logic_score} without wording-only mutants (killed {killed}, "
             f"timeout {timeouts}, survived {survived} of which {len(wording)} change only a string's text, "
             f"not covered by the selected tests {untested}, total {len(results)}"
             + (f", not checked {unchecked}: MUTATE_ONLY" if unchecked else "") + ")", ""]
    for name, diff in diffs.items():
        if name not in wording:
            lines += ["```diff", diff.strip(), "```", ""]
    lines += ["Wording-only survivors: " + (", ".join(wording) or "none"), ""]
    print(lines[0], flush=True)
    section = "\n".join(lines)
    (where / "report.md").write_text(section)
    return section


def main(argv: list[str]) -> int:
    # a module by its path under src/gpuprov or by its file name alone ("failover" for "cloud/failover")
    short = {m.rsplit("/", 1)[-1]: m for m in MODULES}
    modules = [short.get(m, m) for m in argv] or list(MODULES)
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        print(f"unknown module(s): {', '.join(unknown)}; known: {', '.join(MODULES)}", file=sys.stderr)
        return 2
    jobs = int(os.environ.get("MUTATE_JOBS", "1"))
    for module in modules:
        run(module, jobs)
    # every module run so far (this time or before), in MODULES order
    sections = [(WORK / m.replace("/", "-") / "report.md") for m in MODULES]
    report = WORK / "report.md"
    report.write_text("# Surviving mutants\n\n" + "\n".join(p.read_text() for p in sections if p.exists()))
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
