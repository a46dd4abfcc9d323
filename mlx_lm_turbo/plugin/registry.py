"""Per-model overrides: scheme, boundary skip, per-layer schemes or an opt-out,
matched by model type or by model path / repo-id pattern.

Sources, later ones winning: installed plugins (the ``mlx_lm_turbo_register_overrides``
hook), the user's TOML file (``$MLX_LM_TURBO_OVERRIDES``, else
``~/.config/mlx-lm-turbo/overrides.toml``), then Python (``register_override``)::

    [[override]]
    model_type = "qwen2"          # or: path = "*Qwen2.5-7B*" (a glob on the path / repo id)
    scheme = "turbo8v4"           # replaces the requested scheme
    boundary_skip = 4
    layer_schemes = { 0 = "turbo8", 27 = "turbo8" }
    # opt_out = true              # refuse --kv-scheme for these models
"""

import difflib
import fnmatch
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Dict, Optional

from ..codec.schemes import parse_scheme
from ..errors import OverridesFileError


@dataclass(frozen=True)
class Override:
    model_type: Optional[str] = None
    path: Optional[str] = None
    scheme: Optional[str] = None
    boundary_skip: Optional[int] = None
    layer_schemes: Dict[int, str] = field(default_factory=dict)
    opt_out: bool = False
    source: str = "python"

    def __post_init__(self):
        if (self.model_type is None) == (self.path is None):
            raise ValueError(
                f"An override ({self.source}) matches by model_type or by path: give exactly one."
            )
        for s in [self.scheme, *self.layer_schemes.values()]:
            if s is not None:
                parse_scheme(s)  # fails now, naming the nearest valid scheme
        # fnmatch reads "" and an unclosed "[" as text to match, which no path is.
        if self.path is not None and (
            not self.path or re.search(r"\[(?![^\]]+\])", self.path)
        ):
            problem = "is empty" if not self.path else "has a '[' without its ']'"
            raise ValueError(
                f"An override's path glob {self.path!r} ({self.source}) {problem}, so it "
                "would match no model."
            )

    def matches(self, model_type, model_path):
        if self.model_type is not None:
            return self.model_type == model_type
        return model_path is not None and fnmatch.fnmatch(str(model_path), self.path)


class OverrideRegistry:
    def __init__(self):
        self.overrides = []

    def add(self, **fields):
        layer_schemes = {
            int(k): v for k, v in (fields.pop("layer_schemes", None) or {}).items()
        }
        self.overrides.append(Override(layer_schemes=layer_schemes, **fields))

    def resolve(self, model_type, model_path=None) -> dict:
        """The merged settings of every matching override, later ones winning, with sources."""
        merged = {"sources": []}
        for o in self.overrides:
            if not o.matches(model_type, model_path):
                continue
            merged["sources"].append(o.source)
            for name in ("scheme", "boundary_skip"):
                if getattr(o, name) is not None:
                    merged[name] = getattr(o, name)
            if o.layer_schemes:
                merged.setdefault("layer_schemes", {}).update(o.layer_schemes)
            if o.opt_out:
                merged["opt_out"] = o.source
        return merged


OVERRIDES_ENV = "MLX_LM_TURBO_OVERRIDES"


def user_overrides_file() -> Path:
    if os.environ.get(OVERRIDES_ENV):
        return Path(os.environ[OVERRIDES_ENV])
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(
        os.path.expanduser("~"), ".config"
    )
    return Path(base) / "mlx-lm-turbo" / "overrides.toml"


# The keys of an [[override]] entry: what each must be.
ENTRY_KEYS = {
    "model_type": (str, 'a string (a model type, e.g. "qwen2")'),
    "path": (str, "a string (a glob on the model path or repo id)"),
    "scheme": (str, 'a scheme name such as "turbo4"'),
    "boundary_skip": (int, "an integer >= 0"),
    "layer_schemes": (
        dict,
        'a table of cache-entry numbers to scheme names, e.g. { 0 = "turbo8" }',
    ),
    "opt_out": (bool, "true or false"),
}


def _scheme_problem(value):
    """Why ``value`` is not a scheme an override can set, or None."""
    try:
        if parse_scheme(value) is None:
            return "'none' is not a scheme to compress with (to refuse compression use opt_out = true)"
    except ValueError as error:
        return str(error)
    return None


def _entry_problem(entry):
    """What is wrong with one [[override]] table of the file, or None."""
    if not isinstance(entry, dict):
        return "it is not a table"
    for key, value in entry.items():
        if key not in ENTRY_KEYS:
            close = difflib.get_close_matches(key, ENTRY_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"unknown key {key!r}{hint}; the keys are {', '.join(ENTRY_KEYS)}"
        kind, allowed = ENTRY_KEYS[key]
        if (
            not isinstance(value, kind)
            or (kind is int and isinstance(value, bool))
            or (key == "boundary_skip" and value < 0)
        ):
            return f"{key} = {value!r}: it must be {allowed}"
    if ("model_type" in entry) == ("path" in entry):
        return "give exactly one of model_type and path, to say which models it matches"
    problem = _scheme_problem(entry["scheme"]) if "scheme" in entry else None
    if problem:
        return f"scheme: {problem}"
    for layer, scheme in entry.get("layer_schemes", {}).items():
        if not re.fullmatch(r"[0-9]+", layer, re.ASCII):
            return f"layer_schemes key {layer!r}: it must be a cache-entry number (0, 1, ...)"
        problem = (
            _scheme_problem(scheme)
            if isinstance(scheme, str)
            else "it must be a scheme name"
        )
        if problem:
            return f"layer_schemes {layer} = {scheme!r}: {problem}"
    return None


def _load_toml(registry, path):
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a BOM too
    except (OSError, ValueError) as error:
        raise OverridesFileError(
            f"Cannot read mlx-lm-turbo overrides file {path}: {error}"
        ) from None
    entries = data.pop("override", [])
    if data or not isinstance(entries, list):
        what = f"key {next(iter(data))!r}" if data else "a single [override] table"
        raise OverridesFileError(
            f"The overrides file {path} has {what}: write each override as "
            "an [[override]] table (double brackets) and nothing else."
        )
    for i, entry in enumerate(entries):
        problem = _entry_problem(entry)
        if problem:
            raise OverridesFileError(f"Bad entry {i} in {path}: {problem}.")
        try:
            registry.add(source=f"{path} [override {i}]", **entry)
        except ValueError as error:
            raise OverridesFileError(f"Bad entry {i} in {path}: {error}") from None


@lru_cache(maxsize=None)
def registry() -> OverrideRegistry:
    from .manager import plugin_manager

    reg = OverrideRegistry()
    plugin_manager().hook.mlx_lm_turbo_register_overrides(registry=reg)
    path = user_overrides_file()
    if path.exists() or os.environ.get(
        OVERRIDES_ENV
    ):  # a file named explicitly must exist
        _load_toml(reg, path)
    return reg


def register_override(
    *,
    model_type=None,
    path=None,
    scheme=None,
    boundary_skip=None,
    layer_schemes=None,
    opt_out=False,
):
    """Add an override from Python; it wins over plugins and the TOML file."""
    registry().add(
        model_type=model_type,
        path=path,
        scheme=scheme,
        boundary_skip=boundary_skip,
        layer_schemes=layer_schemes,
        opt_out=opt_out,
        source="python",
    )
