"""spmdsim's modules import each other without a circle (issue 28), and only down the layers (issue 41): the
runtime < the collective primitives < the NumPy front end < the hosts (a plug-in: only it and the tools import
it) < JAX's adapter (spmdsim/jax/_internals.py, the one module that imports ``jax._src``) < XLA:CPU's numerics <
the jaxpr evaluation < the rules < the compiled form < the integration into JAX < the tools (see LAYERS). Every
import statement counts, also one inside a function or at the bottom of a module (where a circle would hide).
Read with ``ast``: nothing is imported, jax is not needed. No module is longer than about 800 lines."""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "spmdsim"


def modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every ``.py`` file of the package at ``root`` (a package is its
    ``__init__.py``)."""
    found = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported_names(module: str, path: pathlib.Path) -> list[str]:
    """Every name ``module`` imports, anywhere in its file: ``import a.b`` gives ``a.b``; ``from a import b``
    gives ``a.b`` and ``a`` (b may be a module or a name in a); relative imports made absolute."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            names += [f"{base}.{alias.name}" for alias in node.names] + [base]
    return names


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports. A package's ``__init__`` is left out as a target (importing
    ``a.b`` runs ``a/__init__.py`` first, which is not an edge of ``a.b``'s own making)."""
    mods = modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for name in imported_names(module, path):
            if name.split(".")[0] != root.name:
                continue
            target = resolve(name)
            if target is not None and target != module and mods[target].name != "__init__.py":
                graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph``: its strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted; a module importing itself does not count."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
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
    return found


def test_spmdsim_imports_without_a_circle():
    circles = cycles(import_graph(PACKAGE))
    assert circles == [], "import circles in spmdsim (every import counts, also inside functions): " + "; ".join(
        " <-> ".join(c) for c in circles)


def test_the_core_does_not_import_the_hosts():
    """The core is written against the process group (spmdsim/runtime/_process_group.py); the hosts install theirs."""
    graph = import_graph(PACKAGE)
    core = ["spmdsim.runtime._axes", "spmdsim.runtime._devices", "spmdsim.runtime._process_group",
            "spmdsim.runtime._rendezvous", "spmdsim.runtime._runtime", "spmdsim.primitives._primitives",
            "spmdsim.runtime._hosts"]
    for module in core:
        reached, todo = set(), [module]
        while todo:
            for target in graph[todo.pop()] - reached:
                reached.add(target)
                todo.append(target)
        assert not {m for m in reached if m.startswith("spmdsim.hosts")}, f"{module} reaches the hosts' package"


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set(), "c": {"a", "b"}}, []),
    ({"a": {"a"}}, []),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}}, [["a", "b"], ["c", "d"]]),
])
def test_the_cycle_finder_on_small_graphs(graph, expected):
    assert sorted(cycles(graph)) == expected


def test_a_planted_circle_is_caught_also_through_an_import_inside_a_function(tmp_path):
    """A package whose two modules import each other, one of them inside a function (the way a circle hides)."""
    package = tmp_path / "spmdsim"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from spmdsim import low\n")
    (package / "low.py").write_text("def f():\n    from spmdsim.sub import high  # here: high imports us\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "high.py").write_text("from .. import low\n")
    (package / "clean.py").write_text("import spmdsim.low\n")
    graph = import_graph(package)
    assert graph["spmdsim.low"] == {"spmdsim.sub.high"} and graph["spmdsim.sub.high"] == {"spmdsim.low"}
    assert cycles(graph) == [["spmdsim.low", "spmdsim.sub.high"]]
    (package / "low.py").write_text("def f():\n    pass\n")
    assert cycles(import_graph(package)) == []


INTERNALS = "spmdsim.jax._internals"


def jax_internal_importers(root: pathlib.Path) -> dict[str, list[str]]:
    """Module -> the names of JAX's internals (``jax._src...``) it imports, for every module but
    :data:`INTERNALS`, the one module allowed to (issue 37)."""
    found = {}
    for module, path in modules(root).items():
        private = sorted({n for n in imported_names(module, path) if n == "jax._src" or n.startswith("jax._src.")})
        if private and module != INTERNALS:
            found[module] = private
    return found


def test_only_one_module_imports_jax_internals():
    assert (PACKAGE / "jax" / "_internals.py").exists()
    assert jax_internal_importers(PACKAGE) == {}, (
        "import JAX's internals through spmdsim.jax._internals (the one place that adapts to JAX's releases)")


def test_an_import_of_jax_internals_elsewhere_is_caught(tmp_path):
    package = tmp_path / "spmdsim"
    (package / "jax").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "jax" / "__init__.py").write_text("")
    (package / "jax" / "_internals.py").write_text("from jax._src import core\n")
    (package / "jax" / "_rules.py").write_text("def f():\n    from jax._src.lax import lax as lax_internal\n")
    (package / "jax" / "_fine.py").write_text("import jax\nfrom jax import lax\nfrom spmdsim.jax._internals import core\n")
    assert jax_internal_importers(package) == {"spmdsim.jax._rules": ["jax._src.lax", "jax._src.lax.lax"]}


# -- the layers (issue 41) ---------------------------------------------------------------------------------------

LAYERS = [  # bottom to top: a layer's modules, by dotted prefix
    ("runtime", ("spmdsim.runtime", "spmdsim.errors")),
    ("primitives", ("spmdsim.primitives",)),
    ("NumPy front end", ("spmdsim.frontend", "spmdsim.lax", "spmdsim.multihost")),
    ("hosts", ("spmdsim.hosts",)),
    ("JAX adapter", ("spmdsim.jax._internals", "spmdsim._jax_versions")),
    ("JAX numerics", ("spmdsim.jax.numerics",)),
    ("JAX evaluation", ("spmdsim.jax.evaluation",)),
    ("JAX rules", ("spmdsim.jax.rules",)),
    ("JAX compiled", ("spmdsim.jax.compiled",)),
    ("JAX integration", ("spmdsim.jax.integration", "spmdsim.jax")),
    ("tools", ("spmdsim.tools", "spmdsim.jax.tools", "spmdsim.cost", "spmdsim.show", "spmdsim.debug",
               "spmdsim.testing", "spmdsim.conformance", "spmdsim.cli", "spmdsim.demo", "spmdsim.__main__")),
]
FRONT = "spmdsim"  # the package's __init__: re-exports every layer's public names, imported by none of them
PLUG_IN = "hosts"  # imported only by itself and the tools: the core is written against the process group


def layer_of(module: str) -> str:
    """The layer of ``module``: the one whose longest prefix it has (``spmdsim.jax.rules._dot`` is a rule, not
    the JAX front end's ``spmdsim.jax``)."""
    best = max(((prefix, name) for name, prefixes in LAYERS for prefix in prefixes
                if module == prefix or module.startswith(prefix + ".")), default=None, key=lambda p: len(p[0]))
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[1]


def module_edges(root: pathlib.Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, packages' ``__init__`` included (``from spmdsim import hosts``
    imports spmdsim/hosts/__init__.py): ``from a import b`` counts ``a.b`` when that is a module, else ``a``."""
    mods = modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                    package = package[:len(package) - (node.level - 1)]
                    base = ".".join(package + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name) if name.split(".")[0] == root.name else None
                if target is not None and target not in (module, root.name):
                    edges[module].add(target)
    return edges


def layer_violations(edges: dict[str, set[str]]) -> list[str]:
    """Every import against the layers' order: a module imports its own layer and those below it, and the
    hosts only from the hosts and the tools."""
    rank = {name: i for i, (name, _) in enumerate(LAYERS)}
    found = []
    for module, targets in sorted(edges.items()):
        if module == FRONT:
            continue
        here = layer_of(module)
        for target in sorted(targets):
            there = layer_of(target)
            if rank[there] > rank[here] or (there == PLUG_IN and here not in (PLUG_IN, "tools")):
                found.append(f"{module} ({here}) imports {target} ({there})")
    return found


def test_every_import_goes_down_the_layers():
    """The layers, bottom to top (docs/architecture.md): the runtime (devices as threads, the rendezvous, the
    process group) < the collective primitives < the NumPy front end < [the hosts, a plug-in beside the rest]
    < JAX's adapter (spmdsim/jax/_internals.py, the one module that imports jax._src) < XLA:CPU's numerics <
    the jaxpr evaluation (interpreter, registry) < the rules < the compiled form < the integration into JAX <
    the tools. A module imports its own layer and those below it; the hosts are imported by the hosts and the
    tools only."""
    assert layer_violations(module_edges(PACKAGE)) == []


def test_every_module_is_in_a_layer():
    for module in modules(PACKAGE):
        if module != FRONT:
            layer_of(module)


def test_a_planted_upward_import_is_caught(tmp_path):
    """A rule importing the integration (inside a function), and the runtime importing the hosts' package."""
    package = tmp_path / "spmdsim"
    for folder in ("runtime", "hosts", "jax/rules", "jax/integration"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("from spmdsim.jax.integration import _api\n")
    (package / "jax" / "__init__.py").write_text("")
    (package / "runtime" / "_runtime.py").write_text("def f():\n    from spmdsim import hosts\n")
    (package / "jax" / "rules" / "_dot.py").write_text(
        "from spmdsim.runtime import _runtime\n\ndef g():\n    from spmdsim.jax.integration import _api\n")
    (package / "jax" / "integration" / "_api.py").write_text("from ..rules import _dot\n")
    assert layer_violations(module_edges(package)) == [
        "spmdsim.jax.rules._dot (JAX rules) imports spmdsim.jax.integration._api (JAX integration)",
        "spmdsim.runtime._runtime (runtime) imports spmdsim.hosts (hosts)"]
    (package / "runtime" / "_runtime.py").write_text("")
    (package / "jax" / "rules" / "_dot.py").write_text("from spmdsim.runtime import _runtime\n")
    assert layer_violations(module_edges(package)) == []


LINE_LIMIT = 800
TOO_LONG_STILL = {}  # modules to be split (issue 41, part 3): each may only shrink


def test_no_module_is_longer_than_800_lines():
    """A module a reader can hold: at most 800 lines (the ones still listed in TOO_LONG_STILL, no longer than
    they are now)."""
    too_long = {}
    for path in PACKAGE.rglob("*.py"):
        name = path.relative_to(PACKAGE.parent).as_posix()
        count = len(path.read_text().splitlines())
        if count > TOO_LONG_STILL.get(name, LINE_LIMIT):
            too_long[name] = count
    assert too_long == {}, f"split these modules (at most {LINE_LIMIT} lines): {too_long}"
    shorter = [name for name in TOO_LONG_STILL if not (PACKAGE.parent / name).exists()
               or len((PACKAGE.parent / name).read_text().splitlines()) <= LINE_LIMIT]
    assert shorter == [], f"split, or short enough now: drop them from TOO_LONG_STILL: {shorter}"
