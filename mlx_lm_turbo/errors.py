"""Errors the plugin raises for users to read (kept light: the start-up hook imports this)."""


class UnsupportedModelError(ValueError):
    """The model cannot be given TurboQuant caches; the message says what to do."""


class OverridesFileError(ValueError):
    """The user's overrides file cannot be read; the message names the file and the entry."""


class CacheFormatError(ValueError):
    """A saved prompt cache this version cannot continue exactly; the message says why."""
