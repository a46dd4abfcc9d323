"""GPT-OSS: learned attention sinks and alternating sliding / full layers. The sinks work
on the portable path (the key-centring shift is added back per query); the fused decode
kernel has no sink support yet, so ``-compact`` schemes are refused for this family."""

from ..adapters import Adapter, AdapterPlugin, Capabilities

ADAPTER = Adapter(
    name="gpt_oss",
    model_types=("gpt_oss",),
    capabilities=Capabilities(supports_compact=False,
                              compact_note="the fused decode kernel does not handle attention sinks",
                              notes="learned attention sinks honoured on the portable path; -compact refused"),
)

plugin = AdapterPlugin(ADAPTER)
