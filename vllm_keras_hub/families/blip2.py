"""BLIP-2: refused, with its reason."""

from vllm_keras_hub.families.family import Family

FAMILY = Family(
    "blip2",
    "BLIP-2",
    "BLIP2Backbone",
    route=None,
    unsupported_reason=(
        "its image-conditioned language models have no route to vLLM's kernels yet"
    ),
)
