"""The house by its parts (docs/architecture.md): which part may import which, no import circles, and no
module past 500 lines. Read from the source with `ast`: every import counts, at the top, inside a function
or under TYPE_CHECKING, since each is a dependency a reader has to follow.

The checker is tried on small made-up trees too, so a rule that stopped biting would fail here."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpuprov"
MAX_LINES = 500
GROUND = ("gpuprov.errors", "gpuprov.files", "gpuprov.locks", "gpuprov.paths", "gpuprov.resources",
          "gpuprov.state", "gpuprov.state_errors", "gpuprov.state_tolerant", "gpuprov.records", "gpuprov.store",
          "gpuprov.state_url", "gpuprov.leases", "gpuprov.team")
# team state's S3 backend is on the ground floor too (every part reads records) and the one floor module with boto3
GROUND_S3 = ("gpuprov.state_s3",)
CLOUD_SDKS = ("boto3", "botocore")
SSH_SDKS = ("fabric", "paramiko", "invoke")
# what reads a URL: sources/ only (cloud/ through boto3); urllib.parse only splits strings, so plan/ may use it
WEB = ("urllib.request", "urllib.error", "urllib.robotparser", "http")
SPLIT = ("urllib",)  # stdlib packages kept by submodule in the graph, since their submodules differ in what they do


@dataclass(frozen=True)
class Rule:
    """Modules under `part` import nothing under any of `never` (gpuprov parts or third-party packages)."""

    part: str
    never: tuple[str, ...]
    why: str


RULES = (
    Rule("gpuprov.plan", ("gpuprov.hosts", "gpuprov.cluster", "gpuprov.cloud", "gpuprov.sources", "gpuprov.cli",
                          *CLOUD_SDKS, *SSH_SDKS, *WEB), "plan/ is pure: no network, no SSH"),
    Rule("gpuprov.hosts", ("gpuprov.cluster", "gpuprov.cloud", "gpuprov.sources", "gpuprov.cli", *CLOUD_SDKS),
         "hosts/ reaches hosts over SSH and never calls a cloud or the command line"),
    Rule("gpuprov.cluster", ("gpuprov.cloud", "gpuprov.sources", "gpuprov.cli", *CLOUD_SDKS),
         "cluster/ wires hosts, whoever made them"),
    Rule("gpuprov.cloud.providers", ("gpuprov.hosts", "gpuprov.cluster", "gpuprov.state", "gpuprov.cli", *SSH_SDKS),
         "a provider makes and removes machines and knows nothing of local state or SSH"),
    Rule("gpuprov.cloud", ("gpuprov.cli", "gpuprov.sources", *SSH_SDKS), "cloud/ reaches hosts through hosts/ only"),
    Rule("gpuprov.sources", ("gpuprov.hosts", "gpuprov.cluster", "gpuprov.cli", *CLOUD_SDKS, *SSH_SDKS),
         "sources/ reads the public web; EC2 only through cloud/"),
    *(Rule(g, ("gpuprov.plan", "gpuprov.hosts", "gpuprov.cluster", "gpuprov.cloud", "gpuprov.cli",
               *CLOUD_SDKS, *SSH_SDKS), "the ground floor serves every part and uses none") for g in GROUND),
    *(Rule(g, ("gpuprov.plan", "gpuprov.hosts", "gpuprov.cluster", "gpuprov.cloud", "gpuprov.cli", *SSH_SDKS),
           "the ground floor serves every part and uses none (S3 through boto3 only)") for g in GROUND_S3),
)
# nothing outside cli/ imports cli/ (the entry point `python -m gpuprov` aside)
CLI_USERS = ("gpuprov.cli", "gpuprov.__main__")


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module's imports: gpuprov modules (the module a `from X import name` names, or X.name when that is a
    module), and the top-level names of third-party packages."""
    modules = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                found |= {f"{target}.{a.name}" if f"{target}.{a.name}" in modules or target in SPLIT else target
                          for a in node.names}
        graph[name] = {d if _under(d, root.name) or d.split(".")[0] in SPLIT else d.split(".")[0] for d in found} - {name}
    return graph


def broken_rules(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, deps in sorted(graph.items()):
        for rule in RULES:
            if not _under(module, rule.part):
                continue
            for dep in sorted(deps):
                if any(_under(dep, never) for never in rule.never):
                    out.append(f"{module} imports {dep}: {rule.why}")
        if not any(_under(module, user) for user in CLI_USERS):
            out += [f"{module} imports {dep}: nothing outside cli/ imports cli/" for dep in sorted(deps)
                    if _under(dep, "gpuprov.cli")]
    return sorted(set(out))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in graph:
                continue  # a third-party package
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def long_modules(root: Path) -> list[str]:
    return [f"{p.relative_to(root.parent)}: {n} lines" for p in sorted(root.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES]


# --- the real tree --------------------------------------------------------------------------------


def test_the_parts_keep_to_their_floors():
    assert broken_rules(import_graph(SRC)) == []


def test_there_is_no_import_circle():
    assert circles(import_graph(SRC)) == []


def test_no_module_is_over_500_lines():
    assert long_modules(SRC) == []


def test_the_parts_are_folders():
    assert {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == \
        {"cli", "plan", "hosts", "cluster", "cloud", "sources"}
    assert (SRC / "cloud" / "providers" / "__init__.py").exists()


# --- the checker itself, on made-up trees ------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "gpuprov"
    for rel, text in {"__init__.py": "", "plan/__init__.py": "", "hosts/__init__.py": "", "cloud/__init__.py": "",
                      "cloud/providers/__init__.py": "", "cli/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(("files", "expected"), [
    ({"plan/spec.py": "def f():\n    from gpuprov.hosts import remote\n", "hosts/remote.py": ""},
     "gpuprov.plan.spec imports gpuprov.hosts.remote"),
    ({"plan/spec.py": "if TYPE_CHECKING:\n    import boto3\n"}, "gpuprov.plan.spec imports boto3"),
    ({"hosts/remote.py": "from gpuprov.cloud import node\n", "cloud/node.py": ""},
     "gpuprov.hosts.remote imports gpuprov.cloud.node"),
    ({"cloud/providers/aws.py": "from gpuprov.state import Store\n", "state.py": ""},
     "gpuprov.cloud.providers.aws imports gpuprov.state"),
    ({"state.py": "from gpuprov.plan.spec import x\n", "plan/spec.py": ""}, "gpuprov.state imports gpuprov.plan.spec"),
    ({"cloud/node.py": "from gpuprov.cli.report import x\n", "cli/report.py": ""},
     "gpuprov.cloud.node imports gpuprov.cli.report"),
    ({"cloud/node.py": "from ..cli import report\n", "cli/report.py": ""}, "gpuprov.cloud.node imports gpuprov.cli.report"),
    ({"plan/stack.py": "import urllib.request\n"}, "gpuprov.plan.stack imports urllib.request"),
    ({"plan/stack.py": "from urllib import request\n"}, "gpuprov.plan.stack imports urllib.request"),
    ({"cloud/node.py": "from gpuprov.sources import refresh\n", "sources/refresh.py": ""},
     "gpuprov.cloud.node imports gpuprov.sources.refresh"),
    ({"sources/torch.py": "import boto3\n"}, "gpuprov.sources.torch imports boto3"),
])
def test_a_forbidden_import_is_named(tmp_path, files, expected):
    broken = broken_rules(import_graph(_tree(tmp_path, files)))
    assert [b for b in broken if b.startswith(expected)], broken


def test_allowed_imports_pass(tmp_path):
    root = _tree(tmp_path, {"cli/main.py": "from gpuprov.cloud import node\n", "cloud/node.py": "from gpuprov.hosts import r\n",
                            "hosts/r.py": "from gpuprov.plan import spec\nimport paramiko\n", "plan/spec.py": "import yaml\n",
                            "__main__.py": "from gpuprov.cli import main\n"})
    assert broken_rules(import_graph(root)) == []


def test_a_circle_is_found_however_long(tmp_path):
    root = _tree(tmp_path, {"cloud/a.py": "from gpuprov.cloud import b\n",
                            "cloud/b.py": "from gpuprov.cloud.c import x\n",
                            "cloud/c.py": "def f():\n    from gpuprov.cloud import a\n",
                            "cloud/d.py": "from gpuprov.cloud import a\n"})
    assert circles(import_graph(root)) == [["gpuprov.cloud.a", "gpuprov.cloud.b", "gpuprov.cloud.c"]]


def test_a_long_module_is_named(tmp_path):
    root = _tree(tmp_path, {"plan/big.py": "x = 1\n" * (MAX_LINES + 1), "plan/ok.py": "x = 1\n" * MAX_LINES})
    assert long_modules(root) == [f"gpuprov/plan/big.py: {MAX_LINES + 1} lines"]


def test_plan_may_split_a_url_but_not_fetch_one(tmp_path):
    """urllib.parse reads a string (a webhook's URL checked in the plan); urllib.request reads the web."""
    assert broken_rules(import_graph(_tree(tmp_path, {"plan/monitoring.py": "from urllib.parse import urlsplit\n"}))) == []
