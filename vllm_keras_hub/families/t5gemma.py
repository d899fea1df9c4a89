"""T5Gemma: refused, with its reason."""

from vllm_keras_hub.families.family import Family

FAMILY = Family(
    "t5gemma",
    "T5Gemma",
    "T5GemmaBackbone",
    route=None,
    unsupported_reason=(
        "its encoder-decoder layers (rotary self-attention, cross-attention, "
        "soft caps) have no route to vLLM's kernels yet; BART's is the one built"
    ),
)
