"""dvc.yaml's wiring computed from the code: each stage's import closure and the keys it read.

* ``import_closure``: the project modules a module imports, transitively, read from the source with ``ast``
  (function-local imports included, parent packages' ``__init__`` too, ``"zaya_pipeline.x:name"``
  strings, which the CLI and the curation chain import by name, ``Path(__file__).with_name("folder")`` (every
  file under it: e.g. the remote code ``zaya export`` copies) and ``"sibling.py"`` strings, files a module
  hands to another tool by path: the MLflow pyfunc entry).
* ``expected_deps``: a stage's closure from its ``zaya <stage>`` entry point (cli.STAGES), minus the
  generic plumbing listed in pyproject.toml ``[tool.zaya.dvc]`` — the one place that says what may be left
  out of deps and params, and why.
* ``param_problems``: the keys a stage read (config_reads.py) against its declared ``params``, less the
  keys it reads only for an early check (``[tool.zaya.dvc.params_early_checks]``).
"""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
PKG = "zaya_pipeline"
_BY_NAME = re.compile(rf"^{PKG}(\.\w+)*(:\w+)?$")


def module_file(module: str) -> Path:
    path = SRC.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@cache
def all_modules() -> frozenset[str]:
    names = (".".join(p.relative_to(SRC).with_suffix("").parts) for p in (SRC / PKG).rglob("*.py"))
    return frozenset(n.removesuffix(".__init__") for n in names)


def _owner(name: str) -> str | None:
    """The project module that defines ``name`` (a module, or an attribute of one)."""
    while name and name not in all_modules():
        name = name.rpartition(".")[0]
    return name or None


def _with_name(node: ast.AST) -> str | None:
    """``X`` of a ``<path>.with_name("X")`` call: a file or folder beside the module that it reads by path."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "with_name":
        arg = node.args[0] if node.args else None
        return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
    return None


def direct_imports(module: str, source: str | None = None) -> set[str]:
    """Project modules ``module`` imports anywhere in its body, with their parent packages."""
    tree = ast.parse(source if source is not None else module_file(module).read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _BY_NAME.match(node.value):
            names.add(node.value.split(":")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith(".py"):
            sibling = f"{module.rpartition('.')[0]}.{node.value.removesuffix('.py')}"
            names.update([sibling] if sibling in all_modules() else [])
        elif _with_name(node) and (module_file(module).parent / _with_name(node)).is_dir():
            folder = f"{module.rpartition('.')[0]}.{_with_name(node)}."  # Path(__file__).with_name("folder")
            names.update(m for m in all_modules() if m.startswith(folder))
    found = {m for m in map(_owner, (n for n in names if n.startswith(PKG))) if m}
    for m in list(found):
        parts = m.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts)))
    found.discard(module)
    return found


@cache
def import_graph() -> dict[str, frozenset[str]]:
    return {m: frozenset(direct_imports(m)) for m in all_modules()}


def import_closure(module: str, graph: dict[str, frozenset[str]] | None = None) -> set[str]:
    graph = graph or import_graph()
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen


def import_cycles(graph: dict[str, frozenset[str]] | None = None) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan). A module's edges to its own parent
    packages are left out: a package ``__init__`` re-exporting its submodules is not a cycle."""
    graph = graph or import_graph()
    graph = {m: frozenset(d for d in deps if not m.startswith(d + ".")) for m, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


@cache
def wiring_rules() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["zaya"]["dvc"]


def dvc_stages(dvc_yaml: Path = REPO / "dvc.yaml") -> dict:
    return yaml.safe_load(dvc_yaml.read_text())["stages"]


def entry_module(stage: str) -> str:
    from zaya_pipeline.cli import STAGES

    return STAGES[stage].target.split(":")[0]


def expected_deps(stage: str) -> set[str]:
    """Repo-relative source files a stage's command runs, less the plumbing files."""
    plumbing = set(wiring_rules()["plumbing"])
    files = {module_file(m).relative_to(REPO).as_posix() for m in import_closure(entry_module(stage))}
    return files - plumbing


def declared_source_deps(stage_def: dict) -> set[str]:
    """The ``src/`` files a stage's ``deps`` cover (a folder covers every .py file under it)."""
    out = set()
    for dep in stage_def.get("deps", []):
        path = REPO / dep
        if not dep.startswith("src/"):
            continue
        if path.is_dir():
            out.update(p.relative_to(REPO).as_posix() for p in path.rglob("*.py"))
        else:
            out.add(dep)
    return out


def covered(key: str, declared: list[str]) -> bool:
    return any(key == d or key.startswith(d + ".") for d in declared)


def early_check_keys(stage: str) -> list[str]:
    """Keys ``stage`` reads only to fail early on what a later stage could not use (pyproject.toml)."""
    return list(wiring_rules().get("params_early_checks", {}).get(stage, []))


def param_problems(stage: str, declared: list[str], reads: list[str]) -> list[str]:
    """Keys read but not declared, and declared entries the stage never read under the debug config."""
    ignored = wiring_rules()["params_ignored"] + early_check_keys(stage)
    read = [k for k in reads if not covered(k, ignored)]
    problems = [
        f"{stage}: reads {k} but dvc.yaml does not list it under params"
        for k in read
        if not covered(k, declared)
    ]
    for d in declared:
        if not any(covered(k, [d]) for k in read):
            problems.append(f"{stage}: lists param {d} but never read it")
    return problems
