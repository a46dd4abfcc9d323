"""The package's layers: a module imports only from its own layer or lower ones, and
no modules import each other in a circle (function-level imports included)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mlx_lm_turbo"
LAYERS = [
    "errors",
    "compat",
    "defaults",
    "settings",
    "codec",
    "kernels",
    "cache",
    "plugin",
    "attach",
    "tools",
]
RANK = {"errors": 0, "compat": 0, "settings": 0, **{n: i for i, n in enumerate(LAYERS)}}


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path):
    """Modules of this package that ``path`` imports, anywhere in it."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("mlx_lm_turbo"):
                modules = {target}
                for alias in node.names:  # from . import settings: a module
                    if (
                        (PACKAGE.parent / (target + "." + alias.name).replace(".", "/"))
                        .with_suffix(".py")
                        .exists()
                    ):
                        modules.add(f"{target}.{alias.name}")
                found |= modules
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("mlx_lm_turbo.")}
    return found - {name}


def layer(module):
    parts = module.split(".")
    return RANK[parts[1]] if len(parts) > 1 else None


GRAPH = {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def test_every_module_belongs_to_a_layer():
    assert {m.split(".")[1] for m in GRAPH if "." in m} <= set(RANK)


def test_lower_layers_never_import_higher_ones():
    upward = [
        (m, t)
        for m, targets in GRAPH.items()
        for t in targets
        if layer(m) is not None and layer(t) is not None and layer(t) > layer(m)
    ]
    assert not upward


def test_no_import_circles():
    def reaches(start, goal, seen):
        for t in GRAPH.get(start, ()):
            if t == goal:
                return True
            if t not in seen:
                seen.add(t)
                if reaches(t, goal, seen):
                    return True
        return False

    circles = [m for m in GRAPH if reaches(m, m, set())]
    assert not circles


def test_private_names_stay_in_their_module():
    """No module imports another's private names: what two modules share is public
    (cache/common.py, cache/single.py, cache/batch.py), never borrowed."""
    borrowed = [
        (module_name(path), alias.name)
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
        and (node.level or (node.module or "").startswith("mlx_lm_turbo"))
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert not borrowed
