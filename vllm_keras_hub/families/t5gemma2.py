"""T5Gemma 2: refused, with its reason."""

from vllm_keras_hub.families.family import Family

FAMILY = Family(
    "t5gemma2",
    "T5Gemma 2",
    "T5Gemma2Backbone",
    route=None,
    unsupported_reason=(
        "its decoder attends with one softmax over its own keys and the "
        "encoder's together (merged attention), where vLLM's kernels attend "
        "to each alone; its image encoder has no route yet either"
    ),
)
