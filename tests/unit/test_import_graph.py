"""The package-level import graph of lean_rl has no cycles and keeps its layering.

Every module of lean_rl is parsed with `ast` (no imports run): imports at any depth count, including
those inside functions (a deferred import is still a dependency), except under `if TYPE_CHECKING:`.
Each module belongs to one node: its package (PACKAGES) or, for a top-level module, itself. The test
fails on (a) any cycle between nodes, naming the import sites of each edge on it, and (b) any import
that crosses a layering rule (RULES). Module by module, type-only imports included, the graph has no
cycle either (test_no_cycles_between_modules_even_through_type_only_imports): a circle through a
`TYPE_CHECKING` import is a circle a reader walks all the same; a small Protocol or a moved type breaks it."""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

import lean_rl

ROOT = Path(lean_rl.__file__).resolve().parent
PACKAGES = ("lean_rl.algorithms", "lean_rl.buffer", "lean_rl.rollout", "lean_rl.backends.sglang",
            "lean_rl.backends.megatron", "lean_rl.weight_sync", "lean_rl.convert", "lean_rl.utils",
            "lean_rl.testing", "lean_rl.slime_compat")
# python -m lean_rl.evaluate is a loop of its own (one evaluation rollout, no trainer: evaluate_checkpoint.py)
LOOP_MODULES = ("lean_rl.train", "lean_rl.train_async", "lean_rl.run_loop", "lean_rl.runtime", "lean_rl.config",
                "lean_rl.evaluate", "lean_rl.evaluate_checkpoint")
# Who may import a loop module: the loops themselves, slime's launcher (it runs train / train_async
# with a slime script's flags), the Python API (it runs them from keyword arguments), the test helpers,
# the parity harness, and the Tinker server (its clients' calls are its loop: it starts a Runtime as the
# loops do).
LOOP_IMPORTERS = (*LOOP_MODULES, "lean_rl.slime_launch", "lean_rl.api", "lean_rl.testing", "lean_rl.parity",
                  "lean_rl.serve_tinker", "lean_rl.tinker")


@dataclass(frozen=True)
class Rule:
    importers: tuple[str, ...]  # nodes the rule applies to
    forbidden: tuple[str, ...]  # node prefixes they must not import
    why: str

    def crossed(self, source: str, target: str) -> bool:
        return (source in self.importers
                and any(target == f or target.startswith(f + ".") for f in self.forbidden))


RULES = (
    Rule(("lean_rl.algorithms", "lean_rl.buffer", "lean_rl.sample"), ("lean_rl.backends",),
         "algorithms, buffer and samples are backend-free"),
    Rule(("lean_rl.rollout",), ("lean_rl.backends.megatron", "lean_rl.algorithms"),
         "rollout knows neither the trainer nor the algorithms (the hooks are loaded by lean_rl/extensions.py)"),
    Rule(("lean_rl.backends.sglang",), ("lean_rl.backends.megatron", "lean_rl.rollout"),
         "the SGLang backend knows neither the trainer nor the rollout"),
    Rule(("lean_rl.backends.megatron",), ("lean_rl.convert",),
         "the converters use the trainer's checkpoint format (backends/megatron/checkpoint_paths.py), "
         "never the reverse"),
)


@dataclass(frozen=True)
class Site:
    module: str
    line: int

    def __str__(self) -> str:
        return f"{self.module}:{self.line}"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imported_modules(source: str, module: str, is_package: bool, known: set[str],
                     type_checking: bool = False) -> list[tuple[str, int]]:
    """(imported module, line) for every import in `source` (any depth; under TYPE_CHECKING only when
    `type_checking`). `from X import y` counts as X.y when that is a module in `known`, else as X."""
    found: list[tuple[str, int]] = []
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                child = f"{target}.{alias.name}"
                found.append((child if child in known else target, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def node_of(module: str) -> str:
    for package in PACKAGES:
        if module == package or module.startswith(package + "."):
            return package
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module  # a top-level module, or lean_rl itself


def package_graph(root: Path = ROOT) -> dict[tuple[str, str], list[Site]]:
    """(source node, target node) -> the import sites that make that edge; lean_rl-internal only."""
    modules = all_modules(root)
    known = set(modules)
    edges: dict[tuple[str, str], list[Site]] = defaultdict(list)
    for module, path in modules.items():
        source = node_of(module)
        for target, line in imported_modules(path.read_text(), module, path.name == "__init__.py", known):
            if target != "lean_rl" and not target.startswith("lean_rl."):
                continue
            target_node, site = node_of(target), Site(module, line)
            if target_node != source and site not in edges[(source, target_node)]:
                edges[(source, target_node)].append(site)
    return dict(edges)


def module_graph(root: Path = ROOT) -> dict[tuple[str, str], list[Site]]:
    """(module, module) -> import sites, for imports between two modules of the same package node: the
    edges a circle inside a package would be made of."""
    modules = all_modules(root)
    known = set(modules)
    edges: dict[tuple[str, str], list[Site]] = defaultdict(list)
    for module, path in modules.items():
        for target, line in imported_modules(path.read_text(), module, path.name == "__init__.py", known):
            if target in known and target not in (module, node_of(module)) and node_of(target) == node_of(module):
                edges[(module, target)].append(Site(module, line))
    return dict(edges)


def typed_module_graph(root: Path = ROOT) -> dict[tuple[str, str], list[Site]]:
    """(module, module) -> import sites, across the whole of lean_rl, `TYPE_CHECKING` imports included.
    An import of a name from a package's __init__ counts as an edge to the package module."""
    modules = all_modules(root)
    known = set(modules)
    edges: dict[tuple[str, str], list[Site]] = defaultdict(list)
    for module, path in modules.items():
        for target, line in imported_modules(path.read_text(), module, path.name == "__init__.py", known,
                                             type_checking=True):
            while target and target not in known:  # `from lean_rl.x.y import Name` of a module x.y
                target = target.rpartition(".")[0]
            if target and target not in (module, "lean_rl") and target.startswith("lean_rl."):
                edges[(module, target)].append(Site(module, line))
    return dict(edges)


def cycles(edges) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted, in order."""
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in edges:
        graph[source].add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
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

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(found)


def describe_cycles(edges) -> list[str]:
    lines = []
    for component in cycles(edges):
        members = set(component)
        lines.append("cycle: " + " <-> ".join(component))
        for (source, target), sites in sorted(edges.items()):
            if source in members and target in members:
                shown = ", ".join(map(str, sites[:4])) + (f" (+{len(sites) - 4})" if len(sites) > 4 else "")
                lines.append(f"    {source} -> {target}: {shown}")
    return lines


def rule_violations(edges) -> list[str]:
    rules = [*RULES, Rule(tuple(sorted({s for s, _ in edges} - set(LOOP_IMPORTERS))), LOOP_MODULES,
                          "only the loops, lean_rl.slime_launch, lean_rl.testing and lean_rl.parity import a loop module")]
    lines = []
    for (source, target), sites in sorted(edges.items()):
        for rule in rules:
            if rule.crossed(source, target):
                lines.append(f"{source} -> {target} ({rule.why}): {', '.join(map(str, sites))}")
    return lines


# -- the checks --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def edges():
    return package_graph()


def test_every_package_node_exists():
    modules = all_modules()
    assert [p for p in PACKAGES if p not in modules] == []
    assert [m for m in LOOP_MODULES if m not in modules] == []


def test_no_cycles_between_packages(edges):
    found = describe_cycles(edges)
    assert not found, "import cycles between lean_rl packages:\n" + "\n".join(found)


def test_no_cycles_within_a_package():
    found = describe_cycles(module_graph())
    assert not found, "import cycles between modules of one package:\n" + "\n".join(found)


def test_no_cycles_between_modules_even_through_type_only_imports():
    found = describe_cycles(typed_module_graph())
    assert not found, "import cycles between lean_rl modules (TYPE_CHECKING imports included):\n" + "\n".join(found)


def test_the_typed_graph_sees_type_only_imports(tmp_path):
    (tmp_path / "lean_rl").mkdir()
    (tmp_path / "lean_rl" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                               "    from lean_rl.b import B\n")
    (tmp_path / "lean_rl" / "b.py").write_text("from lean_rl.a import A\n")
    edges = typed_module_graph(tmp_path / "lean_rl")
    assert cycles(edges) == [["lean_rl.a", "lean_rl.b"]]
    assert cycles(package_graph(tmp_path / "lean_rl")) == []  # the run-time graph alone does not see it


def test_runtime_stays_small():
    """lean_rl/runtime.py assembles the run and names its phases; features go into modules of their own
    (issue 24 took it to 250 lines, one feature brought it back to 339)."""
    lines = len((ROOT / "runtime.py").read_text().splitlines())
    assert lines <= 250, f"lean_rl/runtime.py has {lines} lines (at most 250): move the new feature into its own module"


def test_layering_rules(edges):
    found = rule_violations(edges)
    assert not found, "imports that cross the layering rules:\n" + "\n".join(found)


# -- the checker itself can fail -------------------------------------------------------------------------


def test_checker_finds_a_cycle_in_a_synthetic_graph():
    site = [Site("m", 1)]
    acyclic = {("a", "b"): site, ("b", "c"): site, ("a", "c"): site}
    assert cycles(acyclic) == [] and describe_cycles(acyclic) == []
    cyclic = {**acyclic, ("c", "a"): [Site("c.mod", 7)], ("d", "e"): site, ("e", "d"): site}
    assert cycles(cyclic) == [["a", "b", "c"], ["d", "e"]]
    assert "    c -> a: c.mod:7" in describe_cycles(cyclic)


def test_checker_flags_rule_crossings():
    site = [Site("lean_rl.buffer.x", 3)]
    crossing = {("lean_rl.buffer", "lean_rl.backends.sglang"): site, ("lean_rl.utils", "lean_rl.train"): site,
                ("lean_rl.testing", "lean_rl.runtime"): site, ("lean_rl.train", "lean_rl.config"): site}
    found = rule_violations(crossing)
    assert len(found) == 2
    assert found[0].startswith("lean_rl.buffer -> lean_rl.backends.sglang (")
    assert found[1].startswith("lean_rl.utils -> lean_rl.train (")


def test_parser_sees_deferred_imports_and_skips_type_checking():
    source = """
from __future__ import annotations
import os
from typing import TYPE_CHECKING
from . import sibling
from ..other import thing
if TYPE_CHECKING:
    from lean_rl.backends.megatron import group
else:
    import lean_rl.utils.net

def f():
    from lean_rl.rollout.base import Rollout
"""
    known = {"lean_rl.pkg", "lean_rl.pkg.sibling", "lean_rl.pkg.mod", "lean_rl.other"}
    found = [name for name, _ in imported_modules(source, "lean_rl.pkg.mod", False, known)]
    assert found == ["__future__", "os", "typing", "lean_rl.pkg.sibling", "lean_rl.other", "lean_rl.utils.net",
                     "lean_rl.rollout.base"]
    assert node_of("lean_rl.backends.megatron.hf_weights.export") == "lean_rl.backends.megatron"
    assert node_of("lean_rl.train_async") == "lean_rl.train_async" and node_of("lean_rl") == "lean_rl"


# ---------------------------------------------------------------- calls by reference, not by name
_DISPATCHERS = {"call_all": None, "call_each": None, "call_first": None, "submit": None, "submit_all": 1}


def string_addressed_calls(root: Path = ROOT) -> list[str]:
    """Calls to the rank / engine dispatchers (call_all, call_each, call_first, submit, submit_all)
    whose target is a string, e.g. call_all("trainer.train_step"): neither a reader nor
    go-to-definition can follow those to the code they run. (engine_calls.call_all takes its clients
    and a deadline first: its target is its third argument.)"""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name not in _DISPATCHERS:
                continue
            position = 2 if name == "call_all" and not isinstance(node.func, ast.Attribute) else (_DISPATCHERS[name] or 0)
            if len(node.args) <= position:
                continue
            target = node.args[position]
            if isinstance(target, ast.JoinedStr) or (isinstance(target, ast.Constant) and isinstance(target.value, str)):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_no_call_is_addressed_by_a_string():
    assert string_addressed_calls() == []


def test_the_string_call_checker_finds_one(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text('group.call_all("trainer.train_step", 1)\ncall_all(clients, 5, "score")\n'
                                           'group.call_all(RankTrainer.train_step)\n')
    assert [line.split(": ", 1)[0] for line in string_addressed_calls(tmp_path / "pkg")] == ["pkg/m.py:1", "pkg/m.py:2"]


# ---------------------------------------------------------------- the config layer is a leaf
def test_the_config_layer_loads_no_torch_and_no_run_code():
    """`import lean_rl.config` (what --help and every flag check run) reads flag declarations only:
    no torch, no HTTP client, no rollout, trainer or weight-sync code."""
    import subprocess
    import sys

    probe = ("import sys, lean_rl.config; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'httpx', 'ray', 'megatron', 'sglang')"
             " or m.startswith(('lean_rl.weight_sync.sync', 'lean_rl.rollout.base', 'lean_rl.backends.megatron.rank'))))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            cwd=ROOT.parent, env={"PYTHONPATH": str(ROOT.parent), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# ---------------------------------------------------------------- the config is frozen after start-up
def config_replacements(root: Path = ROOT) -> list[str]:
    """Assignments to an attribute named `cfg` (`self.cfg = ...`, `rt.cfg = ...`) outside an
    `__init__`: a run's Config is built once (parse_config) and never replaced; what changes while it
    runs (engine URLs after a restart) lives in objects the config holds (EngineConfig.live)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or function.name == "__init__":
                continue
            for node in ast.walk(function):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
                if any(isinstance(t, ast.Attribute) and t.attr == "cfg" for t in targets):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_the_config_is_never_replaced_after_start_up():
    assert config_replacements() == []


def test_the_replacement_checker_finds_one(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("class R:\n    def __init__(self, cfg):\n        self.cfg = cfg\n"
                                           "    def start(self):\n        self.cfg = 1\n")
    assert config_replacements(tmp_path / "pkg") == ["pkg/m.py:5"]
