"""Errors the plugin raises for users to read (kept light: the start-up hook imports this)."""


class UnsupportedModelError(ValueError):
    """The model cannot be given TurboQuant caches; the message says what to do."""
