"""Whether a model's attention can be served, read from its source.

A TurboQuant cache's ``update_and_fetch`` returns compressed keys and values
that only mlx-lm's ``scaled_dot_product_attention`` (``models/base.py``, where
the plugin routes them) knows how to use. So a model is served when, in every
method of its modules that fetches from a cache, the fetched keys and values go
nowhere but into that function (or back to the caller, as Gemma 4's KV-donor
layers hand them to the layers sharing them). Anything else - manual attention,
``mx.fast.scaled_dot_product_attention`` called directly, latent (MLA) caches
projected after the fetch, cache internals read - is refused, whatever the
model type is called. ``model_modules`` gives the same verdict for every model
module of the installed mlx-lm from its files alone (``mlx-lm-turbo doctor``).
"""

import ast
import inspect
import textwrap
from functools import lru_cache
from pathlib import Path
from typing import Optional

import mlx.nn as nn

ATTENTION = "scaled_dot_product_attention"
FETCH = "update_and_fetch"
# Reading these off a cache bypasses update_and_fetch's contract.
CACHE_INTERNALS = ("keys_and_values", "keys", "values", "state")


def _names(target):
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for t in target.elts for n in _names(t)]
    return []


def _is_fetch(node):
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == FETCH
    )


class _FetchedUse(ast.NodeVisitor):
    """Finds uses of fetched names other than the allowed ones, in one statement."""

    def __init__(self, fetched):
        self.fetched, self.problem = fetched, None

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Name) and func.id == ATTENTION:
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if not (isinstance(arg, ast.Name) and arg.id in self.fetched):
                    self.visit(arg)
            return
        if isinstance(func, ast.Attribute) and func.attr == ATTENTION:
            self.problem = "calls mx.fast.scaled_dot_product_attention itself"
        self.generic_visit(node)

    def visit_Attribute(self, node):
        if (
            isinstance(node.value, ast.Name)
            and node.value.id in self.fetched
            and node.attr == "shape"
        ):
            return  # compressed keys know their shape
        self.generic_visit(node)

    def visit_Name(self, node):
        if (
            isinstance(node.ctx, ast.Load)
            and node.id in self.fetched
            and self.problem is None
        ):
            self.problem = f"uses the cached {node.id!r} outside mlx-lm's scaled_dot_product_attention"


def _check(nodes, fetched):
    check = _FetchedUse(fetched)
    for node in nodes:
        check.visit(node)
    return check.problem


def _block(statements, fetched):
    """Walk a block in order, tracking the names bound to fetched keys and values.

    Returns (the first problem or None, the names still bound at the block's end).
    Branches start from the names bound before them, so an ``else`` that never
    fetched is not charged with what its ``if`` fetched.
    """
    for stmt in statements:
        if isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
            heads = [getattr(stmt, part, None) for part in ("test", "iter")]
            heads += [item.context_expr for item in getattr(stmt, "items", [])]
            problem = _check([h for h in heads if h is not None], fetched)
            if problem:
                return problem, fetched
            branches = [getattr(stmt, b, []) for b in ("body", "orelse", "finalbody")]
            branches += [handler.body for handler in getattr(stmt, "handlers", [])]
            after = set(fetched)
            for branch in branches:
                problem, bound = _block(branch, fetched)
                if problem:
                    return problem, fetched
                after |= bound
            fetched = after
        elif isinstance(stmt, ast.Assign) and (
            _is_fetch(stmt.value) or _only_fetched(stmt.value, fetched)
        ):
            problem = (
                _check(stmt.value.args, fetched) if _is_fetch(stmt.value) else None
            )
            if problem:
                return problem, fetched
            fetched = fetched | {n for t in stmt.targets for n in _names(t)}
        elif isinstance(stmt, ast.Return) and stmt.value is not None:
            parts = (
                stmt.value.elts if isinstance(stmt.value, ast.Tuple) else [stmt.value]
            )
            # Handing them back to the caller (Gemma 4's donors) is fine.
            problem = _check(
                [p for p in parts if not (_only_fetched(p, fetched) or _is_fetch(p))],
                fetched,
            )
            if problem:
                return problem, fetched
        else:
            if any(map(_is_fetch, ast.walk(stmt))):
                return (
                    f"passes what {FETCH} returns straight on, not through mlx-lm's {ATTENTION}",
                    fetched,
                )
            problem = _check([stmt], fetched)
            if problem:
                return problem, fetched
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = (
                    stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                )
                fetched = fetched - {n for t in targets for n in _names(t)}  # rebound
    return None, fetched


def _only_fetched(node, fetched):
    if isinstance(node, ast.Name):
        return node.id in fetched
    if isinstance(node, ast.Tuple):
        return all(_only_fetched(e, fetched) for e in node.elts)
    return False


def _reads_cache_internals(function):
    # Pipeline-parallel models tie a cache's keys to the graph with mx.depends on a
    # path that only runs across machines; that is not a read of the contents.
    ties = {
        id(n)
        for call in ast.walk(function)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "depends"
        for n in ast.walk(call)
    }
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in CACHE_INTERNALS
            and isinstance(node.ctx, ast.Load)
            and id(node) not in ties
        ):
            owner = (
                node.value.value
                if isinstance(node.value, ast.Subscript)
                else node.value
            )
            if isinstance(owner, ast.Name) and "cache" in owner.id:
                return f"reads the cache's {node.attr!r} itself"
    return None


def class_def_problem(class_def: ast.ClassDef) -> Optional[str]:
    """Why this class's methods would misuse compressed keys and values, or None."""
    for function in ast.walk(class_def):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        problem = _reads_cache_internals(function)
        if problem is None and any(map(_is_fetch, ast.walk(function))):
            problem = _block(function.body, frozenset())[0]
        if problem:
            return f"{class_def.name}.{function.name} {problem}"
    return None


@lru_cache(maxsize=None)
def _class_problem(cls) -> Optional[str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return (
            f"the source of {cls.__qualname__} cannot be read to check how it attends"
        )
    return class_def_problem(
        next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
    )


def attention_problem(model) -> Optional[str]:
    """Why compressed caches cannot serve this loaded mlx-lm model, or None."""
    classes = (
        {type(m) for m in model.modules()} if isinstance(model, nn.Module) else set()
    )
    for cls in sorted(classes, key=lambda c: (c.__module__, c.__qualname__)):
        if cls.__module__.startswith("mlx_lm.models."):
            problem = _class_problem(cls)
            if problem:
                return problem
    return None


# -- every model module of the installed mlx-lm, read without importing it -----


def _module_trees():
    import mlx_lm.models

    root = Path(mlx_lm.models.__path__[0])
    return {p.stem: ast.parse(p.read_text()) for p in sorted(root.glob("*.py"))}


def _class_defs(trees, module, seen):
    """The classes of a model module and of the sibling modules it imports from."""
    if module in seen or module not in trees or module == "cache":
        return []
    seen.add(module)
    tree = trees[module]
    found = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            found += _class_defs(trees, node.module.split(".")[0], seen)
    return found


def _cache_kinds_problem(class_defs, kv_caches, state_caches):
    named = {
        n.id
        for class_def in class_defs
        for function in class_def.body
        if isinstance(function, ast.FunctionDef) and function.name == "make_cache"
        for n in ast.walk(function)
        if isinstance(n, ast.Name) and n.id.endswith("Cache")
    }
    other = sorted(named - set(kv_caches) - set(state_caches))
    if other:
        return f"it keeps a {', '.join(other)}, which TurboQuant cannot compress"
    if named and not named & set(kv_caches):
        return "it has no KV-cache layers to compress"
    return None  # no make_cache naming a class: mlx-lm's default, one KVCache per layer


def model_modules(kv_caches, state_caches):
    """{each model module of the installed mlx-lm: None if served, else why it is refused}.

    ``kv_caches`` / ``state_caches``: names of the mlx-lm cache classes the adapters
    compress / keep as they are (a model without ``make_cache`` gets ``KVCache``)."""
    trees = _module_trees()
    problems = {}  # per class, as modules share them
    verdicts = {}
    for name, tree in trees.items():
        if not any(
            isinstance(n, ast.ClassDef) and n.name == "Model" for n in tree.body
        ):
            continue
        class_defs = _class_defs(trees, name, set())
        verdicts[name] = _cache_kinds_problem(class_defs, kv_caches, state_caches)
        for class_def in class_defs:
            if verdicts[name]:
                break
            if id(class_def) not in problems:
                problems[id(class_def)] = class_def_problem(class_def)
            verdicts[name] = problems[id(class_def)]
    return verdicts
