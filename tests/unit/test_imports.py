"""The house's walls, checked from the source: who may import whom.

Read with ``ast`` (nothing is imported, so a circle cannot hide behind Python's
partial-module tolerance), every ``import`` statement counts — also one inside a
function, which is how a circle usually gets "fixed" — except those under
``if TYPE_CHECKING:`` (annotations only, never run).

- no import circle between any two of our modules;
- ``store/`` imports neither pyfuse3 nor trio (pure data: usable without FUSE);
- ``plugin/`` imports neither the store nor the overlay (it runs inside a harness);
- ``overlay/tree/`` imports neither pyfuse3 nor trio (the real tree, shared by the
  filesystem, the capture and the restore engine);
- none of our modules is imported under ``try: … except ImportError`` (our own modules
  always exist).
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROOMS = {"store": "rewindfs.store", "overlay": "rewindfs.overlay", "plugin": "rewindfs.plugin"}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for room, dotted in ROOMS.items():
        for path in sorted((ROOT / room).rglob("*.py")):
            rel = path.relative_to(ROOT / room).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([dotted, *parts])] = path
    return found


MODULES = _modules()   # noqa: the walk's universe (a test swaps it for a toy one)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every import node that can run, with whether it sits in a try/except ImportError."""
    def walk(node, guarded):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    yield from walk(sub, guarded)
                continue
            if isinstance(child, ast.Try):
                catches = any(
                    h.type is not None and "ImportError" in ast.unparse(h.type)
                    for h in child.handlers)
                for sub in child.body:
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        yield sub, guarded or catches
                    yield from walk(sub, guarded or catches)
                for part in (*child.handlers, *child.orelse, *child.finalbody):
                    yield from walk(part, guarded)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, guarded
            yield from walk(child, guarded)
    yield from walk(tree, False)


def _targets(module: str, path: pathlib.Path, node) -> list[str]:
    """The dotted names an import statement brings in."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")
        if path.name != "__init__.py":
            base = base[:-1]
        base = base[:len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    # ``from pkg import sub`` imports the module ``pkg.sub``; ``from pkg import name``
    # (a function, a class) imports ``pkg`` itself
    return [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in MODULES else prefix
            for alias in node.names]


def _imports() -> dict[str, list[tuple[str, bool]]]:
    graph = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        names = []
        for node, guarded in _import_nodes(tree):
            names += [(t, guarded) for t in _targets(module, path, node)]
        graph[module] = names
    return graph


IMPORTS = _imports()


def _edges(module: str) -> set[str]:
    """Our modules *module* imports (a ``from pkg import name`` counts as importing
    ``pkg.name`` when that is a module, else ``pkg`` itself)."""
    out = set()
    for name, _ in IMPORTS[module]:
        if name in MODULES and name != module:
            out.add(name)
    return out


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in _edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in MODULES:
        if v not in index:
            visit(v)
    return comps


def _importing(prefix: str, banned: tuple[str, ...]) -> list[str]:
    bad = []
    for module, names in IMPORTS.items():
        if module == prefix or module.startswith(prefix + "."):
            bad += [f"{module} imports {n}" for n, _ in names
                    if n.split(".")[0] in banned or n.startswith(banned)]
    return sorted(set(bad))


def test_the_walk_sees_every_room():
    assert {"rewindfs.store", "rewindfs.overlay.control.wire", "rewindfs.overlay.fs.ops",
            "rewindfs.plugin.client"} <= set(MODULES)
    # and it sees edges: the daemon imports the control server
    assert "rewindfs.overlay.control.server" in _edges("rewindfs.overlay.daemon")


def test_no_import_circle():
    assert _cycles() == []


def test_store_imports_no_fuse_and_no_trio():
    assert _importing("rewindfs.store", ("pyfuse3", "trio")) == []


def test_plugin_imports_neither_store_nor_overlay():
    assert _importing("rewindfs.plugin", ("rewindfs.store", "rewindfs.overlay", "pyfuse3")) == []


def test_the_tree_imports_no_fuse_and_no_trio():
    assert _importing("rewindfs.overlay.tree", ("pyfuse3", "trio")) == []


def test_our_modules_are_never_imported_as_optional():
    guarded = [f"{m} guards {n}" for m, names in IMPORTS.items() for n, g in names
               if g and n.startswith("rewindfs")]
    assert guarded == []


def test_a_circle_would_be_found(tmp_path, monkeypatch):
    """The detector itself: two modules importing each other form one component."""
    fake = {"a.x": None, "a.y": None}
    monkeypatch.setattr(__import__(__name__), "MODULES", fake)
    monkeypatch.setattr(__import__(__name__), "IMPORTS",
                        {"a.x": [("a.y", False)], "a.y": [("a.x", False)]})
    assert _cycles() == [["a.x", "a.y"]]
