"""What the plugin does as each of mlx-lm's modules finishes loading.

- ``mlx_lm.models.cache``: route ``make_prompt_cache`` through the plugin, and
  have ``load_prompt_cache`` check a file (``cache_file``) and register the turbo
  cache classes before reading it (``save_prompt_cache`` adds the checksum it
  checks). The commands import these names from there, so they all get them;
  with no scheme active ``make_prompt_cache`` is mlx-lm's own, called unchanged.
  mlx-lm's attention (``mlx_lm.models.base``, loaded by then) routes ``TurboKV``
  keys to the turbo path (``attention.py``), whatever builds the caches.
- the command modules: wrap ``main`` so their parser gains ``--kv-scheme`` etc.
- ``mlx_lm.perplexity``: evaluate through the compressed cache when a scheme is active.

Outside the tested mlx-lm range (``compat.py``) nothing is patched; a requested
scheme gets one notice instead. The wrappers pass every argument through, so an
mlx-lm that adds one keeps working. Only light modules are imported here: the
codec loads when a scheme is used.
"""

import functools
import logging
import os
import sys
import weakref

from .. import compat, settings
from ..errors import UsageError
from .attention import install_attention_dispatch

COMMANDS = (
    "generate",
    "chat",
    "cache_prompt",
    "benchmark",
    "perplexity",
    "server",
    "evaluate",
)


def _model_and_max_kv_size(model, max_kv_size=None):
    """make_prompt_cache's arguments in the tested mlx-lm range."""
    return model, max_kv_size


def make_prompt_cache_with_plugin(original):
    @functools.wraps(original)
    def make_prompt_cache(*args, **kwargs):
        active = settings.active
        if active is None:
            return original(*args, **kwargs)
        model, max_kv_size = _model_and_max_kv_size(*args, **kwargs)
        from ..plugin.prompt_cache import make_prompt_cache as turbo_make_prompt_cache

        caches = turbo_make_prompt_cache(
            model,
            active.scheme,
            max_kv_size=max_kv_size,
            uncompressed_start=active.uncompressed_start,
            model_path=active.model_path,
            **active.cache_options(),
        )
        _announce(model, caches, active.scheme)
        return caches

    make_prompt_cache.turbo_original = original
    return make_prompt_cache


# The models announced, by id while they live: a later model may get a freed one's id.
_announced = weakref.WeakValueDictionary()


def _announce(model, caches, requested):
    """Say once per model, on stderr, what was compressed: a scheme is never silently unused."""
    if _announced.get(id(model)) is model:
        return
    _announced[id(model)] = model
    import mlx.core as mx

    if (
        mx.distributed.init().rank() != 0
    ):  # under mlx.launch, rank 0 speaks for them all
        return
    from collections import Counter

    from ..plugin.adapters import model_type_of

    schemes = Counter(c.scheme.name for c in caches if hasattr(c, "codec"))
    kept = len(caches) - sum(schemes.values())
    summary = ", ".join(f"{n} x {s}" for s, n in schemes.items())
    unused = (
        ""
        if requested.name in schemes
        else (
            f"; no layer uses {requested.name}: every attention layer is a boundary layer "
            "(--turbo-boundary-skip) or set by an override"
        )
    )
    window = max((c.recent_exact for c in caches if hasattr(c, "codec")), default=1)
    recent = (
        f"; each query also reads the {window - 1} tokens before it exactly"
        if window > 1
        else ""
    )
    print(
        f"[mlx-lm-turbo] {model_type_of(model)}: KV caches {summary}"
        + (f"; {kept} state caches kept as they are" if kept else "")
        + unused
        + recent,
        file=sys.stderr,
    )


def load_prompt_cache_with_plugin(original):
    @functools.wraps(original)
    def load_prompt_cache(*args, **kwargs):
        from .files import load_prompt_cache as checked_load

        return checked_load(original, *args, **kwargs)

    return load_prompt_cache


def save_prompt_cache_with_plugin(original):
    @functools.wraps(original)
    def save_prompt_cache(file_name, cache, metadata=None, *args, **kwargs):
        from .files import save_prompt_cache as checksummed_save

        return checksummed_save(original, file_name, cache, metadata, *args, **kwargs)

    return save_prompt_cache


def main_with_plugin(original):
    @functools.wraps(original)
    def main(*args, **kwargs):
        from .options import options_on_first_parser

        try:
            with options_on_first_parser():
                return original(*args, **kwargs)
        except Exception as error:
            if not isinstance(error, UsageError):
                raise
            print(f"mlx-lm-turbo: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        finally:
            settings.active, settings.speculative = None, False

    main.turbo_original = original
    return main


def run_with_checks(original):
    """The server checks what it can before serving: a refusal in its generation
    thread would leave a server that answers every request with an error."""

    @functools.wraps(original)
    def run(host, port, model_provider, *args, **kwargs):
        if settings.active is not None:
            from .preflight import check_server

            check_server(model_provider.cli_args, settings.active)
        return original(host, port, model_provider, *args, **kwargs)

    return run


def load_checking_models(original):
    """The server loads the model a request names (and its draft model): one the
    plugin cannot serve is refused for that request, which gets the reason, and
    nothing of it stays loaded. Caches made while a draft model is loaded are made
    to be trimmed."""

    @functools.wraps(original)
    def load(self, model_path, adapter_path=None, draft_model_path=None):
        try:
            loaded = original(self, model_path, adapter_path, draft_model_path)
            settings.speculative = self.draft_model is not None
            if settings.active is not None and self.draft_model is not None:
                from .preflight import check_model

                try:
                    check_model(self.draft_model, settings.active)
                except UsageError as error:
                    raise UsageError(
                        f"draft model {draft_model_path}: {error}"
                    ) from None
            return loaded
        except UsageError as error:
            self.reset()
            raise UsageError(
                f"mlx-lm-turbo cannot serve {model_path} with --kv-scheme "
                f"{settings.active.scheme.name}: {error}"
            ) from None

    return load


def generation_surviving_errors(cls):
    """mlx-lm's server serves every request from one generation thread, and an error
    that escapes its loop ends that thread: every later request is then refused. With
    a scheme active the loop starts again instead, the requests it held getting the
    error. (Not under mlx.launch: the ranks would have to restart together.)"""
    run_generate, next_request = cls._run_generate, cls._next_request

    @functools.wraps(next_request)
    def _next_request(self, *args, **kwargs):
        request = next_request(self, *args, **kwargs)
        if request is not None:
            self.__dict__.setdefault("turbo_held", weakref.WeakSet()).add(request[0])
        return request

    @functools.wraps(run_generate)
    def _run_generate(self):
        if settings.active is None or self._is_distributed:
            return run_generate(self)
        while not self._stop:
            try:
                return self._generate()
            except Exception as error:
                held = list(self.__dict__.pop("turbo_held", ()))
                if not held:  # no request to tell: as mlx-lm does
                    logging.exception(f"mlx_lm.server generation thread died: {error}")
                    self._generation_failed = True
                    return
                logging.exception(
                    f"[mlx-lm-turbo] mlx_lm.server's generation loop failed ({error}); "
                    f"{len(held)} request(s) in it get the error, and it serves on"
                )
                for response_queue in held:
                    response_queue.put(error)

    cls._next_request, cls._run_generate = _next_request, _run_generate


def hint_for_python_m():
    """``python -m mlx_lm.generate`` runs the module as ``__main__``, which no import
    hook sees: its parser never gets ``--kv-scheme``. Say so where a scheme is asked
    for, before argparse refuses the option or the scheme goes unused."""
    from .options import ENV_SCHEME

    argv = getattr(sys, "orig_argv", [])
    if "-m" not in argv[:-1]:
        return
    module, *args = argv[argv.index("-m") + 1 :]
    if module.split(".")[0] != "mlx_lm" or module.rsplit(".", 1)[-1] not in COMMANDS:
        return
    asked = [a.split("=")[0] for a in args if a.startswith(("--kv-scheme", "--turbo-"))]
    if not asked and not os.environ.get(ENV_SCHEME):
        return
    command = module.rsplit(".", 1)[-1]
    print(
        f"[mlx-lm-turbo] python -m {module} runs the module as __main__, which the "
        f"plugin cannot attach to, so {asked[0] if asked else '$' + ENV_SCHEME} does "
        f"nothing there: run mlx_lm.{command} (or python -m mlx_lm {command}) instead.",
        file=sys.stderr,
    )


def attach(module):
    if not compat.supported():
        from .options import ENV_SCHEME

        compat.notice_if_scheme_asked(os.environ.get(ENV_SCHEME))
        return
    name = module.__name__
    if name == "mlx_lm.models.cache":
        hint_for_python_m()
        install_attention_dispatch()
        module.make_prompt_cache = make_prompt_cache_with_plugin(
            module.make_prompt_cache
        )
        module.load_prompt_cache = load_prompt_cache_with_plugin(
            module.load_prompt_cache
        )
        module.save_prompt_cache = save_prompt_cache_with_plugin(
            module.save_prompt_cache
        )
        return
    if name.rsplit(".", 1)[-1] in COMMANDS and hasattr(module, "main"):
        module.main = main_with_plugin(module.main)
    if name == "mlx_lm.server":
        module.run = run_with_checks(module.run)
        module.ModelProvider.load = load_checking_models(module.ModelProvider.load)
        generation_surviving_errors(module.ResponseGenerator)
    if name == "mlx_lm.perplexity":
        from .perplexity import eval_ppl_with_plugin

        module.eval_ppl = eval_ppl_with_plugin(module.eval_ppl)
