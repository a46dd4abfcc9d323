"""The defaults users get, in one place (what the running command asked for is
``settings.py``)."""

# Keys each query reads exactly besides the sink tokens: itself and the
# DEFAULT_RECENT_EXACT - 1 tokens before it (the caches keep exact copies of those).
DEFAULT_RECENT_EXACT = 16
# The first and last attention layers kept at 8 bits: none, as the window of exact
# recent tokens lowers KL more, for fewer bits, than 8-bit boundary layers do, and they
# add nothing once the window is there.
DEFAULT_BOUNDARY_SKIP = 0
# Caches with a window cannot be trimmed, so commands that decode speculatively
# (--draft-model) read only the query itself exactly unless told otherwise; without the
# window the boundary layers pay for their bits.
SPECULATIVE_RECENT_EXACT = 1
SPECULATIVE_BOUNDARY_SKIP = 2
