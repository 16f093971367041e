"""The layers of docs/architecture.md, checked on the code's own imports (lazy ones included):
every import goes down a layer or stays inside its own package, no two files import each
other round a circle, the viewer package uses only commdebug's public API, and no file of the
package grows past 600 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# bottom to top; a file may import from a lower layer, or from its own package (one layer may
# hold several packages, which must not import each other)
LAYERS = [
    ["errors", "units", "version"],
    ["sourcefiles", "ops", "fileio"],
    ["model"],
    ["formats", "estimate", "capture"],
    ["analysis"],
    ["render"],
    ["debug_mode"],
    ["__init__"],  # the package face: re-exports, the public API
    ["visualizer"],
    ["launch", "demo"],
    ["cli_options"],  # the command line's grammar
    ["cli"],
    ["__main__"],
]
LAYER = {part: i for i, parts in enumerate(LAYERS) for part in parts}
LIMIT = 600


def _files() -> list[Path]:
    return sorted((ROOT / "commdebug").rglob("*.py")) + sorted((ROOT / "visualizer").rglob("*.py"))


def _part(module: str) -> str | None:
    """The layer part a dotted module name belongs to (None: outside the project)."""
    bits = module.split(".")
    if bits[0] == "visualizer":
        return "visualizer"
    if bits[0] != "commdebug":
        return None
    return bits[1] if len(bits) > 1 else "__init__"


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[str]:
    """Every project module `path` imports, at any depth (imports inside functions too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                # `from commdebug import ops` names a submodule, not the package face
                sub = f"{node.module}.{a.name}"
                is_module = (ROOT / Path(*sub.split("."))).with_suffix(".py").exists() or (ROOT / Path(*sub.split("."))).is_dir()
                found.append(sub if is_module else node.module)
    return [m for m in found if _part(m) is not None]


def _edges() -> dict[str, set[str]]:
    return {_module_of(f): set(_imports(f)) for f in _files()}


def test_every_import_goes_down_a_layer_or_stays_in_its_package():
    wrong = []
    for module, targets in _edges().items():
        here = _part(module)
        for target in targets:
            there = _part(target)
            if there == here:
                continue
            if LAYER[there] >= LAYER[here]:
                wrong.append(f"{module} -> {target} ({here}: layer {LAYER[here]}, {there}: layer {LAYER[there]})")
    assert not wrong, "imports that do not go down (docs/architecture.md):\n" + "\n".join(sorted(wrong))


def test_no_import_circles():
    edges = {m: {t for t in ts if t in _edges_keys()} for m, ts in _edges().items()}
    state: dict[str, int] = {}
    circles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                circles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t, stack + [t])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not circles, "import circles:\n" + "\n".join(circles)


def _edges_keys() -> set[str]:
    return {_module_of(f) for f in _files()}


def test_the_viewer_uses_only_the_public_api():
    import commdebug

    for f in sorted((ROOT / "visualizer").rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert all(a.name == "commdebug" or not a.name.startswith("commdebug") for a in node.names), f"{f}: {ast.unparse(node)}"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("commdebug"):
                assert node.module == "commdebug" and all(a.name in commdebug.__all__ for a in node.names), f"{f}: {ast.unparse(node)}"
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "commdebug":
                assert node.attr in commdebug.__all__, f"{f}:{node.lineno}: commdebug.{node.attr} is not in commdebug.__all__"


@pytest.mark.parametrize("package", ["commdebug", "visualizer"])
def test_no_file_is_over_the_limit(package):
    long = [f"{f.relative_to(ROOT)}: {n} lines" for f in sorted((ROOT / package).rglob("*"))
            if f.suffix in (".py", ".js", ".css") and (n := len(f.read_text(encoding="utf-8").splitlines())) > LIMIT]
    assert not long, f"files over {LIMIT} lines (split them by job):\n" + "\n".join(long)
