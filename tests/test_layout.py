"""The house rules of docs/architecture.md that a reader relies on, checked on the source itself: recovery/ is a
dozen concept packages, the domain never imports its tooling, no import circle, reads never import writes, the engine
imports no Django, migrations import no live code, no product module grows past 600 lines nor function past 60, no
behaviour depends on how a row was loaded, and the client distribution (clients/python) and the console import
nothing of each other but the client's public names."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("recovery", "console")
MAX_LINES = 600
MAX_FUNCTION_LINES = 60
LONG_ALLOWED: set[str] = set()
# recovery/'s top level: Django's own entries, then one package per concept (docs/architecture.md draws them).
DJANGO_ENTRIES = {"__init__.py", "apps.py", "admin.py", "migrations", "management", "fixtures"}
MAX_CONCEPTS = 12
TOOLING = "recovery.devtools"


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The product modules `name` imports, anywhere in it (a function's own import, a TYPE_CHECKING one)."""
    targets = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            # `from package import module` imports the module; `from module import name`, the module.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for imported in names:
            while imported and imported not in MODULES:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
    return targets


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _circles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in GRAPH:
        if start in index:
            continue
        work = [(start, iter(sorted(GRAPH[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(GRAPH[target]))))
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
                        circles.append(sorted(component))
    return circles


def test_the_layout_finds_the_modules_and_their_imports():
    # The checks below mean something only if the graph is the real one.
    assert len(MODULES) > 100
    assert "recovery.services.attempts" in GRAPH["recovery.api.routes"]
    assert "recovery.engine.gate" in GRAPH["recovery.services.attempts"]


def test_no_module_imports_one_that_imports_it_back():
    assert _circles() == []


def test_reads_never_import_writes():
    crossing = sorted(
        (name, target)
        for name, targets in GRAPH.items()
        if name.startswith("recovery.selectors")
        for target in targets
        if target.startswith("recovery.services")
    )
    assert crossing == []


def test_the_engine_imports_neither_django_nor_the_rest_of_the_product():
    allowed = ("recovery.engine",)
    outside = sorted(
        (name, target)
        for name, targets in GRAPH.items()
        if name.startswith("recovery.engine")
        for target in targets
        if not target.startswith(allowed)
    )
    assert outside == []
    django = sorted(
        name
        for name, path in MODULES.items()
        if name.startswith("recovery.engine")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any(
            (alias.name if isinstance(node, ast.Import) else node.module or "").startswith("django")
            for alias in node.names
        )
    )
    assert django == []


def test_no_product_module_is_longer_than_600_lines():
    long = {
        str(path.relative_to(ROOT)): lines
        for path in MODULES.values()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert {path: lines for path, lines in long.items() if path not in LONG_ALLOWED} == {}


def _functions():
    for path in [*MODULES.values(), *CLIENT_MODULES.values()]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield path, node


def test_no_product_function_is_longer_than_60_lines():
    long = {
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}": lines
        for path, node in _functions()
        if (lines := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES
    }
    assert long == {}


# Django's caches on a loaded row: behaviour keyed on them would change with how the row happened to be loaded.
PRIVATE_CACHES = {"_prefetched_objects_cache", "fields_cache", "_policy_alternates"}


def test_no_behaviour_depends_on_how_a_row_was_loaded():
    """No `hasattr(row, ...)` probing for an annotation, and no reading or setting of Django's private caches: what
    is known is passed, or loaded in the one place that needs it (docs/development.md)."""
    found = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr":
                found.append(f"{where} hasattr")
            elif isinstance(node, ast.Attribute) and node.attr in PRIVATE_CACHES:
                found.append(f"{where} .{node.attr}")
            elif isinstance(node, ast.Constant) and node.value in PRIVATE_CACHES:
                found.append(f"{where} {node.value!r}")
    assert found == []


def test_recovery_is_a_dozen_concept_packages():
    entries = {path.name for path in (ROOT / "recovery").iterdir() if path.name != "__pycache__"}
    concepts = entries - DJANGO_ENTRIES
    assert len(concepts) <= MAX_CONCEPTS, sorted(concepts)
    # Each concept is a package named for it: no loose module beside them.
    assert sorted(name for name in concepts if not (ROOT / "recovery" / name / "__init__.py").is_file()) == []


def test_the_domain_never_imports_its_tooling():
    # The sandbox, drills, benchmarks and demo scenarios are clients of the domain; the product runs without them.
    assert any(target.startswith("recovery.") for target in GRAPH[f"{TOOLING}.drills.stage"])
    crossing = sorted(
        (name, target)
        for name, targets in GRAPH.items()
        if not name.startswith(TOOLING)
        for target in targets
        if target.startswith(TOOLING)
    )
    assert crossing == []


FROZEN = "recovery.migrations._frozen"


def test_migrations_import_no_live_product_code():
    # A migration is history: what it needs is frozen in it or in a frozen module beside it (never edited), so moving
    # or changing a module never changes it.
    live = sorted(
        f"{path.name}: {module}"
        for path in (ROOT / "recovery" / "migrations").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for module in ([alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or "."])
        if (module.split(".")[0] in PACKAGES or module.startswith(".")) and not module.startswith(FROZEN)
    )
    assert live == []


# The client distribution (clients/python): agents install it without the console, and the console depends on it for
# what they share (docs/architecture.md#code-layout) — never the other way round, and only through its public names.
CLIENT_SRC = ROOT / "clients" / "python" / "src"
CLIENT = "recovery_client"
CLIENT_MODULES = {
    ".".join(path.relative_to(CLIENT_SRC).with_suffix("").parts).removesuffix(".__init__"): path
    for path in (CLIENT_SRC / CLIENT).rglob("*.py")
}


@functools.cache
def _imported(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every absolute import in the file: `import a.b` is ("a.b", []), `from a import b, c`
    is ("a", ["b", "c"]). Imports are statements of the module's body or of its blocks, never inside an expression:
    the walk stops at expressions."""
    found = []
    for node in _statements(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append((node.module or "", [alias.name for alias in node.names]))
    return found


def _statements(tree: ast.AST):
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        blocks = ast.stmt | ast.excepthandler | ast.match_case
        stack.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, blocks))


def _public_names(module: str) -> set[str]:
    """A module of the client's public names: its `__all__` and its public submodules."""
    tree = ast.parse(CLIENT_MODULES[module].read_text())
    names = {
        name
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets)
        for name in ast.literal_eval(node.value)
    }
    prefix = module + "."
    return names | {
        m.removeprefix(prefix) for m in CLIENT_MODULES if m.startswith(prefix) and "." not in m[len(prefix) :]
    }


def _is_public(module: str) -> bool:
    return module in CLIENT_MODULES and not any(part.startswith("_") for part in module.split("."))


def test_the_client_distribution_imports_nothing_of_django_or_the_console():
    assert len(CLIENT_MODULES) >= 4 and all(_imported(path) for path in CLIENT_MODULES.values())
    files = [*CLIENT_MODULES.values(), *(ROOT / "clients" / "python" / "tests").rglob("*.py")]
    crossing = sorted(
        f"{path.relative_to(ROOT)}: {module}"
        for path in files
        for module, _ in _imported(path)
        if module.split(".")[0] in ("django", "ninja", "pydantic", *PACKAGES, "tests")
    )
    assert crossing == []


def test_the_console_uses_only_the_client_distributions_public_names():
    users = {name: path for name, path in MODULES.items() if name != "recovery.client"}  # the re-export itself
    files = [*users.values(), *(ROOT / "tests").glob("*.py"), *(ROOT / "docs" / "examples").glob("*.py")]
    private, uses = [], 0
    for path in files:
        for module, names in _imported(path):
            if module.split(".")[0] != CLIENT:
                continue
            uses += 1
            if path.parent.name == "tests" and path.parent.parent == ROOT:
                continue  # the tests may look inside (the contract test reads the answers' builder)
            if not _is_public(module):
                private.append(f"{path.relative_to(ROOT)}: {module}")
            else:
                public = _public_names(module)
                private += [f"{path.relative_to(ROOT)}: {module}.{name}" for name in names if name not in public]
    assert uses > 20  # the check sees the imports (the console, the devtools, the tests, the examples)
    assert private == []


def test_nothing_in_the_repository_imports_the_deprecated_recovery_client_package():
    files = [*MODULES.values(), *(ROOT / "tests").glob("*.py"), *(ROOT / "docs" / "examples").glob("*.py")]
    users = sorted(
        str(path.relative_to(ROOT))
        for path in files
        for module, names in _imported(path)
        if module == "recovery.client"
        or module.startswith("recovery.client.")
        or (module == "recovery" and "client" in names)
    )
    assert users == []
