"""What mlx-lm's server checks before it serves, when a scheme is active.

The server loads its model in its generation thread, and a refusal there (a model
we do not support, a bad overrides file, a head dim without a codebook) kills that
thread and leaves a server answering every request with an error. So before
serving, the model is loaded lazily (no weights are read), planned, and one token
is traced through mlx-lm's own caches to learn each layer's head dims.
"""

import os
from dataclasses import replace

import mlx.core as mx

from ..codec.codebooks import check_head_dim
from ..errors import UsageError
from ..plugin.adapters import mlx_make_prompt_cache
from ..plugin.prompt_cache import plan
from ..plugin.registry import registry


def head_dims(model):
    """Per cache entry, (key dim, value dim) or None, from one token traced lazily.

    Through mlx-lm's caches, not ours: our codebooks and rotations are cached
    process-wide as lazy arrays, and built on this thread the server's generation
    thread could not evaluate them (MLX streams belong to a thread).
    """
    caches = mlx_make_prompt_cache(model)
    try:
        model(mx.array([[0]]), cache=caches)  # builds the graph, computes nothing
    except Exception:
        return None  # the model's own needs (other inputs, ...) are mlx-lm's to report when it runs
    return [
        (c.keys.shape[3], c.values.shape[3])
        if getattr(c, "keys", None) is not None
        else None
        for c in caches
    ]


def check_model(model, active):
    """Raise the UsageError that a first request would meet under ``active``'s settings."""
    from ..kernels.dispatch import KERNEL_ENV, kernel_mode, layer_support

    _, _, layers, _ = plan(
        model,
        active.scheme,
        boundary_skip=active.cache_options()["boundary_skip"],
        model_path=active.model_path,
    )
    dims = head_dims(model)
    for p in layers if dims else ():
        if p.scheme is not None and dims[p.index] is not None:
            key_dim, value_dim = dims[p.index]
            if p.scheme.key_bits:
                check_head_dim(key_dim)
            check_head_dim(value_dim)
            why_not = kernel_mode() == "on" and layer_support(key_dim, value_dim)
            if why_not:
                raise UsageError(
                    f"{KERNEL_ENV}=on, but the fused kernels cannot run for cache entry "
                    f"{p.index}: {why_not}. Unset it (or set {KERNEL_ENV}=auto)."
                )


def load_model(path, *, lazy=False, trust_remote_code=False):
    """mlx-lm's ``load`` -> (model, tokenizer), its failures a UsageError naming the model."""
    from mlx_lm.utils import load

    try:
        return load(
            path,
            tokenizer_config={"trust_remote_code": trust_remote_code},
            lazy=lazy,
            trust_remote_code=trust_remote_code,
        )
    except (
        Exception
    ) as error:  # mlx-lm and the hub raise many kinds for a bad path or repo id
        if str(path).startswith((".", "/", "~")) and not os.path.exists(
            os.path.expanduser(str(path))
        ):
            raise UsageError(f"Model {path!r} not found: no such directory.") from None
        raise UsageError(f"Cannot load model {path!r}: {error}") from None


def check_server(cli_args, active):
    """Everything the server's ``--kv-scheme`` depends on that is known before a request."""
    registry()  # the overrides file is read (and refused if broken) even without --model
    trust = getattr(cli_args, "trust_remote_code", False)
    for path in (
        getattr(cli_args, "model", None),
        getattr(cli_args, "draft_model", None),
    ):
        if path is not None:
            model, _ = load_model(path, lazy=True, trust_remote_code=trust)
            check_model(model, replace(active, model_path=path))
