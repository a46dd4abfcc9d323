"""What mlx-lm's server checks before it serves, when a scheme is active.

The server loads its model in its generation thread, where a refusal (a model we
do not support, a bad overrides file, a head dim without a codebook) reaches only
the request that asked for that model (attach/__init__.py); for the model it
starts with, every request would meet it. So before serving, the model is loaded
lazily (no weights are read) and planned (``plan`` traces one token to learn each
layer's head dims), and a refusal ends the command with exit status 2.
"""

import os
from dataclasses import replace

from ..errors import UsageError
from ..plugin.prompt_cache import plan
from ..plugin.registry import registry


def check_model(model, active):
    """Raise the UsageError that a first request would meet under ``active``'s settings."""
    plan(
        model,
        active.scheme,
        boundary_skip=active.cache_options()["boundary_skip"],
        model_path=active.model_path,
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
