"""RWKV7: refused, with its reason."""

from vllm_keras_hub.families.family import Family


FAMILY = Family(
    "rwkv7",
    "RWKV7",
    "RWKV7Backbone",
    route=None,
    unsupported_reason="it has no attention at all (recurrent state only)",
)
