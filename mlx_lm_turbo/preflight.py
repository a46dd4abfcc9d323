"""What mlx-lm's server checks before it serves, when a scheme is active.

The server loads its model in its generation thread, and a refusal there (a model
we do not support, a bad overrides file, a head dim without a codebook) kills that
thread and leaves a server answering every request with an error. So before
serving, the model is loaded lazily (no weights are read) and one token is traced
through the caches the scheme gives it: every check of ours runs, nothing is computed.
"""

import os
from dataclasses import replace

import mlx.core as mx

from .errors import UsageError
from .prompt_cache import make_prompt_cache
from .registry import registry


def check_model(model, active):
    """Raise the UsageError that a first request would meet under ``active``'s settings."""
    # uncompressed_start stays 0: every layer builds its codec on the traced token.
    caches = make_prompt_cache(model, active.scheme, boundary_skip=active.boundary_skip,
                               model_path=active.model_path)
    try:
        model(mx.array([[0]]), cache=caches)  # lazy: the graph is built, not evaluated
    except UsageError:
        raise
    except Exception:
        pass  # the model's own needs (other inputs, ...) are mlx-lm's to report when it runs


def load_model(path, *, lazy=False, trust_remote_code=False):
    """mlx-lm's ``load`` -> (model, tokenizer), its failures a UsageError naming the model."""
    from mlx_lm.utils import load

    try:
        return load(path, tokenizer_config={"trust_remote_code": trust_remote_code}, lazy=lazy,
                    trust_remote_code=trust_remote_code)
    except Exception as error:  # mlx-lm and the hub raise many kinds for a bad path or repo id
        if str(path).startswith((".", "/", "~")) and not os.path.exists(os.path.expanduser(str(path))):
            raise UsageError(f"Model {path!r} not found: no such directory.") from None
        raise UsageError(f"Cannot load model {path!r}: {error}") from None


def check_server(cli_args, active):
    """Everything the server's ``--kv-scheme`` depends on that is known before a request."""
    registry()  # the overrides file is read (and refused if broken) even without --model
    trust = getattr(cli_args, "trust_remote_code", False)
    for path in (getattr(cli_args, "model", None), getattr(cli_args, "draft_model", None)):
        if path is not None:
            model, _ = load_model(path, lazy=True, trust_remote_code=trust)
            check_model(model, replace(active, model_path=path))
