"""Errors the plugin raises for users to read (kept light: the start-up hook imports this).

Each is a usage error: mlx-lm's commands print the message and exit with status 2,
as argparse does, instead of a traceback.
"""


class UsageError(ValueError):
    """Bad input from the user (options, model, files); the message says what to do."""


class UnsupportedModelError(UsageError):
    """The model cannot be given TurboQuant caches; the message says what to do."""


class OverridesFileError(UsageError):
    """The user's overrides file cannot be read; the message names the file and the entry."""


class CacheFormatError(UsageError):
    """A saved prompt cache this version cannot continue exactly; the message says why."""


class PromptCacheFileError(UsageError):
    """A saved prompt-cache file cannot be used; the message names the file and what is wrong."""


class KernelUnavailableError(UsageError):
    """``MLX_LM_TURBO_KERNEL=on`` where a fused kernel cannot run; the message says why."""
