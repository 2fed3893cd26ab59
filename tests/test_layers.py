"""The package's layers, read from its imports (module level or inside a function, so that no import hides in a
function to dodge a cycle): the core imports nothing above it, the heads nothing outside their folder (the loaders
above them read their registry), and no strategy imports another's folder (what two strategies share lives in the
core or in ``drafters/``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hf_cascade"
#: one folder per strategy
STRATEGIES = ("cascade", "hsddw", "glide", "redrafter", "recycling", "maxgram_tree", "suffix")
#: the ground floor the core stands on (modules that import nothing of the core's)
CORE_GROUND = ("hf_cascade.placement", "hf_cascade.processors", "hf_cascade.compat")
#: what the heads' tools may read beside their folder (cards.py: where the shipped model cards are)
HEADS_GROUND = ("hf_cascade.shipped_folders",)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """``(module, line, at module level)`` of every import in ``path``, relative ones resolved; ``from a import b``
    names ``a.b`` where that is a module or package of the tree, else ``a``."""
    tree = ast.parse(path.read_text())
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside = {
        id(c)
        for f in ast.walk(tree)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for c in ast.walk(f)
        if c is not f
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{module}.{a.name}" if _exists(f"{module}.{a.name}") else module for a in node.names]
        else:
            continue
        found += [(t, node.lineno, id(node) not in inside) for t in targets]
    return found


def _exists(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _outside(folder: str) -> dict[str, list[str]]:
    """The hf_cascade modules that ``hf_cascade/<folder>/`` imports from outside itself -> ``file:line`` each."""
    own = f"hf_cascade.{folder}"
    out: dict[str, list[str]] = {}
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        for module, line, _ in imports(path):
            if module.startswith("hf_cascade") and module != own and not module.startswith(own + "."):
                out.setdefault(module, []).append(f"{path.relative_to(PACKAGE)}:{line}")
    return out


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_core_imports_nothing_above_it():
    above = {m: where for m, where in _outside("core").items() if not _within(m, CORE_GROUND)}
    assert not above, f"the core imports modules above it: {above}"


def test_heads_import_nothing_outside_their_folder():
    """Model files stay flat remote code; the heads' tools (hub.py, cards.py, convert.py) save them. Loading them
    is :mod:`hf_cascade.loading`'s, which reads their registry: the dependency runs one way."""
    outside = {m: where for m, where in _outside("heads").items() if not _within(m, HEADS_GROUND)}
    assert not outside, f"hf_cascade/heads imports modules above it: {outside}"


def test_strategies_import_no_other_strategy():
    for strategy in STRATEGIES:
        others = tuple(f"hf_cascade.{s}" for s in STRATEGIES if s != strategy)
        crossing = {m: where for m, where in _outside(strategy).items() if _within(m, others)}
        assert not crossing, f"{strategy}/ imports another strategy's folder: {crossing}"


def test_imports_resolve_relative_and_function_level():
    """The reader itself: ``from .. import placement`` (core/batch.py) names the module; an import inside a
    function counts (bench/loading.py's lazy ``from ..loading import load_head``)."""
    assert any(m == "hf_cascade.placement" and top for m, _, top in imports(PACKAGE / "core" / "batch.py"))
    assert any(m == "hf_cascade.loading" and not top for m, _, top in imports(PACKAGE / "bench" / "loading.py"))
