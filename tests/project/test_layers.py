"""The layers of ``fermix/`` hold: imports point down the order the README writes, no cycles.

The README's layout section has a table of layers, top to bottom, each naming its modules
(a module path, or a folder for a whole package). This test reads that table, reads every
import of every module under ``fermix/`` (module level, inside functions and under
``TYPE_CHECKING`` alike: a cycle hidden from the interpreter is still a cycle for a reader),
and fails on an import of a higher layer or on a cycle between modules.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fermix"
README = ROOT / "README.md"
_ROW = re.compile(r"^\|\s*(?P<layer>[a-z]+)\s*\|(?P<modules>[^|]+)\|")
_MODULE = re.compile(r"`fermix/([^`]*)`")


def layer_table(readme: str) -> list[tuple[str, list[str]]]:
    """The README's layers, top first, each with its module prefixes (``fermix.cli``)."""
    start = readme.index("<!-- layers -->")
    end = readme.index("<!-- /layers -->")
    layers = []
    for line in readme[start:end].splitlines():
        match = _ROW.match(line)
        if match is None or match["layer"] == "layer":
            continue
        names = []
        for path in _MODULE.findall(match["modules"]):
            dotted = "fermix." + path.removesuffix("/").removesuffix(".py").replace("/", ".")
            names.append(dotted.removesuffix(".__init__"))
        layers.append((match["layer"], names))
    return layers


def module_name(path: Path) -> str:
    """The dotted name of a module file under ``fermix/``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every ``fermix`` module ``path`` imports, wherever the import statement stands."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return imports_in(path.read_text(encoding="utf-8"), package)


def imports_in(source: str, package: str) -> set[str]:
    """Every ``fermix`` module ``source`` (of a module in ``package``) imports."""
    tree = ast.parse(source)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("fermix"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            if not base.startswith("fermix"):
                continue
            # ``from fermix.core import render`` imports the module fermix.core.render.
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if _is_module(candidate) else base)
    return found


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def import_graph() -> dict[str, set[str]]:
    """Each module of ``fermix/`` and the ``fermix`` modules it imports."""
    return {
        module_name(path): imports_of(path) - {module_name(path)}
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int | None:
    """The index of the layer ``module`` belongs to (0 is the top), by its longest prefix."""
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            inside = module == prefix or module.startswith(prefix + ".")
            if inside and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def upward_imports(
    graph: Mapping[str, Iterable[str]], layers: list[tuple[str, list[str]]]
) -> list[str]:
    """Every import that points up the layer order, as readable lines."""
    bad = []
    for module, targets in sorted(graph.items()):
        here = layer_of(module, layers)
        for target in sorted(targets):
            there = layer_of(target, layers)
            if here is not None and there is not None and there < here:
                bad.append(f"{module} ({layers[here][0]}) imports {target} ({layers[there][0]})")
    return bad


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def layers() -> list[tuple[str, list[str]]]:
    return layer_table(README.read_text(encoding="utf-8"))


def test_the_readme_names_the_layers_top_to_bottom(layers: list[tuple[str, list[str]]]) -> None:
    names = [name for name, _ in layers]
    assert names[0] == "shell" and names[-1] == "base"
    assert {"facade", "runtime", "actors", "core", "storage", "edges"} <= set(names)


def test_every_module_of_the_package_belongs_to_a_layer(
    layers: list[tuple[str, list[str]]],
) -> None:
    unplaced = [m for m in import_graph() if layer_of(m, layers) is None]
    assert unplaced == []


def test_every_module_the_readme_names_exists(layers: list[tuple[str, list[str]]]) -> None:
    missing = [p for _, prefixes in layers for p in prefixes if not _is_module(p)]
    assert missing == []


def test_imports_point_down_the_layer_order_only(layers: list[tuple[str, list[str]]]) -> None:
    assert upward_imports(import_graph(), layers) == []


def test_no_modules_import_each_other_in_a_cycle() -> None:
    assert cycles(import_graph()) == []


def test_nothing_above_storage_names_apsw_or_writes_sql(
    layers: list[tuple[str, list[str]]],
) -> None:
    storage = next(i for i, (name, _) in enumerate(layers) if name == "storage")
    offenders = []
    sql = re.compile(r"\b(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM|PRAGMA)\b")
    for path in sorted(PACKAGE.rglob("*.py")):
        here = layer_of(module_name(path), layers)
        if here is None or here >= storage:
            continue
        text = path.read_text(encoding="utf-8")
        if "apsw" in imports_of(path) or re.search(r"^\s*(import|from) apsw\b", text, re.M):
            offenders.append(f"{path.name}: imports apsw")
        offenders += [f"{path.name}: {m.group(0)}" for m in sql.finditer(text)]
    assert offenders == []


DRIVERS = ("apsw", "psycopg", "psycopg_pool")
ADAPTERS = ("fermix.storage.sqlite", "fermix.storage.postgres")
CHOOSER = "fermix.storage.opening"
"""The one module that knows which adapter runs (it opens the one the config names)."""
STEMMER = "fermix.storage.fulltext"
"""Both adapters' full-text rules: it runs SQLite's FTS5 tokenizer on an in-memory apsw
connection, so PostgreSQL's stems are SQLite's word for word (a library, not a store)."""


def driver_imports(path: Path) -> set[str]:
    """The database drivers ``path`` imports, wherever the import statement stands."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and not node.level
            else []
        )
        found.update(n.partition(".")[0] for n in names if n.partition(".")[0] in DRIVERS)
    return found


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_nothing_outside_the_adapters_imports_a_driver_or_an_adapter_B1() -> None:
    """Issue 21: runtime, cli, server and storage's shared modules know the port only."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if any(_inside(module, adapter) for adapter in ADAPTERS):
            continue
        allowed = {"apsw"} if module == STEMMER else set()
        offenders += [f"{module} imports {d}" for d in sorted(driver_imports(path) - allowed)]
        if module == CHOOSER:
            continue
        offenders += [
            f"{module} imports {target}"
            for target in sorted(imports_of(path))
            if any(_inside(target, adapter) for adapter in ADAPTERS)
        ]
    assert offenders == []


def test_the_two_adapters_are_siblings_that_import_nothing_of_each_other_B1() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        for mine, other in (ADAPTERS, ADAPTERS[::-1]):
            if _inside(module, mine):
                offenders += [
                    f"{module} imports {t}" for t in sorted(imports_of(path)) if _inside(t, other)
                ]
    drivers = {ADAPTERS[0]: {"apsw"}, ADAPTERS[1]: {"psycopg", "psycopg_pool"}}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        for adapter, own in drivers.items():
            if _inside(module, adapter):
                offenders += [f"{module} imports {d}" for d in sorted(driver_imports(path) - own)]
    assert offenders == []


def test_a_driver_import_inside_a_function_is_caught(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    import psycopg.rows\n    from apsw import Connection\n")
    assert driver_imports(source) == {"apsw", "psycopg"}


def test_an_import_up_the_order_is_caught() -> None:
    layers = [("runtime", ["fermix.runtime"]), ("core", ["fermix.core"])]
    graph = {"fermix.core.render": {"fermix.runtime.writer"}, "fermix.runtime.writer": set()}
    assert upward_imports(graph, layers) == [
        "fermix.core.render (core) imports fermix.runtime.writer (runtime)"
    ]


def test_a_cycle_hidden_under_type_checking_is_caught() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from fermix.api import Memory\n"
        "def later():\n"
        "    from fermix.core import render\n"
    )
    assert imports_in(source, "fermix") == {"fermix.api", "fermix.core.render"}
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
