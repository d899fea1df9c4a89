"""T5Gemma 2: refused, with its reason."""

from vllm_keras_hub.families.family import Family

FAMILY = Family(
    "t5gemma2",
    "T5Gemma 2",
    "T5Gemma2Backbone",
    route=None,
    unsupported_reason=(
        "its encoder-decoder layers and its image encoder have no route to "
        "vLLM's kernels yet; BART's is the one encoder-decoder built"
    ),
)
