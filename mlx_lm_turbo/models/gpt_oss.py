"""GPT-OSS: learned attention sinks and alternating sliding / full layers. The sinks are
honoured on both attention paths (the key-centring shift moves the sink logit)."""

from ..adapters import Adapter, AdapterPlugin, Capabilities

ADAPTER = Adapter(
    name="gpt_oss",
    model_types=("gpt_oss",),
    capabilities=Capabilities(notes="learned attention sinks honoured"),
)

plugin = AdapterPlugin(ADAPTER)
