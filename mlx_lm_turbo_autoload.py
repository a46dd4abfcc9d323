"""Start-up hook of mlx-lm-turbo, run from ``mlx_lm_turbo_autoload.pth`` at interpreter start.

It only installs a tiny import finder: nothing of mlx or mlx-lm is imported here.
When one of mlx-lm's modules listed below has executed, the plugin attaches to it
(``mlx_lm_turbo.autoload``). ``MLX_LM_TURBO_DISABLE=1`` turns all of this off. If
attaching fails, mlx-lm keeps working and one warning says why.
"""

import os
import sys

TARGETS = frozenset({
    "mlx_lm.models.cache", "mlx_lm.generate", "mlx_lm.chat", "mlx_lm.cache_prompt",
    "mlx_lm.benchmark", "mlx_lm.perplexity", "mlx_lm.server", "mlx_lm.evaluate",
})


def _attach(module):
    try:
        from mlx_lm_turbo.autoload import attach

        attach(module)
    except Exception as error:  # never break plain mlx-lm
        import warnings

        warnings.warn(f"mlx-lm-turbo could not attach to {module.__name__} and is inactive there: {error!r}")


class _Finder:
    """Finds nothing itself: asks the other finders, then runs ``_attach`` after the module executes."""

    def find_spec(self, name, path=None, target=None):
        if name not in TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is not None and hasattr(loader, "exec_module"):
            exec_module = loader.exec_module

            def exec_and_attach(module):
                exec_module(module)
                _attach(module)

            loader.exec_module = exec_and_attach
        return spec


def install():
    if os.environ.get("MLX_LM_TURBO_DISABLE", "") not in ("", "0"):
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
