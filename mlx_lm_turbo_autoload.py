"""Start-up hook of mlx-lm-turbo, run from ``mlx_lm_turbo_autoload.pth`` at interpreter start.

It only installs a tiny import finder: nothing of mlx or mlx-lm is imported here.
When one of mlx-lm's modules listed below has executed, the plugin attaches to it
(``mlx_lm_turbo.attach``). ``MLX_LM_TURBO_DISABLE=1`` turns the plugin off: then
the commands only say, when they fail on something the plugin provides (its
options ``--kv-scheme``, ``--turbo-boundary-skip``, ``--turbo-uncompressed-start``,
``--turbo-recent-exact``; a prompt-cache file of its caches), that it is turned off. If attaching
fails, mlx-lm keeps working and one warning says why.
"""

import os
import sys

TARGETS = frozenset(
    {
        "mlx_lm.models.cache",
        "mlx_lm.generate",
        "mlx_lm.chat",
        "mlx_lm.cache_prompt",
        "mlx_lm.benchmark",
        "mlx_lm.perplexity",
        "mlx_lm.server",
        "mlx_lm.evaluate",
    }
)
DISABLE = "MLX_LM_TURBO_DISABLE"
# Every option the plugin adds to mlx-lm's commands: with the plugin off, a command
# that fails on one of them says why.
OPTIONS = (
    "--kv-scheme",
    "--turbo-boundary-skip",
    "--turbo-uncompressed-start",
    "--turbo-recent-exact",
)


def disabled():
    """Whether ``MLX_LM_TURBO_DISABLE`` turns the plugin off: any value but empty, 0, false, no, off."""
    return os.environ.get(DISABLE, "").strip().lower() not in (
        "",
        "0",
        "false",
        "no",
        "off",
    )


def _attach(module):
    try:
        from mlx_lm_turbo.attach import attach

        attach(module)
    except Exception as error:  # never break plain mlx-lm
        import warnings

        warnings.warn(
            f"mlx-lm-turbo could not attach to {module.__name__} and is inactive there: {error!r}"
        )


def _explain_when_disabled(module):
    """With the plugin off, a command failing on what only the plugin provides says why."""
    original = getattr(module, "main", None)
    if original is None:
        return

    def main(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except KeyError as error:  # load_prompt_cache looks cache classes up by name
            if not (error.args and str(error.args[0]).startswith("TurboQuant")):
                raise
            print(
                f"mlx-lm-turbo: the prompt-cache file holds {error.args[0]} caches, which load only "
                f"with mlx-lm-turbo on, and {DISABLE} is set: unset it.",
                file=sys.stderr,
            )
            raise SystemExit(2) from None
        except SystemExit as error:
            if error.code == 2 and any(
                a.split("=")[0] in OPTIONS for a in sys.argv[1:]
            ):
                print(
                    f"mlx-lm-turbo: {', '.join(OPTIONS)} are off because {DISABLE} is set: "
                    "unset it to use them.",
                    file=sys.stderr,
                )
            raise

    module.main = main


class _Finder:
    """Finds nothing itself: asks the other finders, then runs ``attach`` after the module executes."""

    def __init__(self, attach, targets):
        self.attach, self.targets = attach, targets

    def find_spec(self, name, path=None, target=None):
        if name not in self.targets:
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
                self.attach(module)

            loader.exec_module = exec_and_attach
        return spec


def install():
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    if disabled():
        finder = _Finder(_explain_when_disabled, TARGETS - {"mlx_lm.models.cache"})
    else:
        finder = _Finder(_attach, TARGETS)
    sys.meta_path.insert(0, finder)


install()
