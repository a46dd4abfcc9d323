"""What the current mlx-lm command asked of the plugin (process-wide).

mlx-lm passes no extra keyword arguments through ``generate()`` and friends, so
the parsed ``--kv-scheme`` options travel here rather than through calls.
"""

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Settings:
    scheme: "KVScheme"  # noqa: F821 (mlx_lm_turbo.schemes, not imported at start-up)
    boundary_skip: int = 2
    uncompressed_start: int = 0
    model_path: Optional[str] = None


active: Optional[Settings] = None
