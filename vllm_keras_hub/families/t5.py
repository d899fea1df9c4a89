"""T5: refused, with its reason."""

from vllm_keras_hub.families.family import Family

FAMILY = Family(
    "t5",
    "T5",
    "T5Backbone",
    route=None,
    unsupported_reason=(
        "its attention adds a learned, bucketed relative position bias to every "
        "score, which vLLM's attention kernels take no input for (only ALiBi slopes)"
    ),
)
