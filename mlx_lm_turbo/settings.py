"""What the current mlx-lm command asked of the plugin (process-wide state; the
defaults are ``defaults.py``).

mlx-lm passes no extra keyword arguments through ``generate()`` and friends, so
the parsed ``--kv-scheme`` options travel here rather than through calls.
"""

from dataclasses import dataclass
from typing import Optional

from .defaults import (
    DEFAULT_BOUNDARY_SKIP,
    DEFAULT_RECENT_EXACT,
    SPECULATIVE_BOUNDARY_SKIP,
    SPECULATIVE_RECENT_EXACT,
)


@dataclass(frozen=True)
class Settings:
    scheme: "KVScheme"  # noqa: F821 (mlx_lm_turbo.codec.schemes, not imported at start-up)
    boundary_skip: Optional[int] = None  # None: not typed (cache_options decides)
    uncompressed_start: int = 0
    recent_exact: Optional[int] = None  # None: not typed
    model_path: Optional[str] = None

    def cache_options(self) -> dict:
        """``boundary_skip`` and ``recent_exact`` for caches made now: as typed, else the
        defaults, which differ while the process decodes speculatively (``speculative``:
        set for a command's --draft-model and whenever the server loads a draft model)."""
        boundary_skip, recent_exact = (
            (SPECULATIVE_BOUNDARY_SKIP, SPECULATIVE_RECENT_EXACT)
            if speculative
            else (DEFAULT_BOUNDARY_SKIP, DEFAULT_RECENT_EXACT)
        )
        return {
            "boundary_skip": (
                boundary_skip if self.boundary_skip is None else self.boundary_skip
            ),
            "recent_exact": recent_exact
            if self.recent_exact is None
            else self.recent_exact,
        }


active: Optional[Settings] = None
# Whether the current command decodes speculatively (--draft-model, or a draft model the
# server loaded for a request), so trims its caches: a loaded prompt cache that cannot be
# trimmed is then refused (attach/files.py), and caches are made without a window.
speculative: bool = False
