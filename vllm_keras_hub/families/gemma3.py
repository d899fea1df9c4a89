"""Gemma3 (text): served on the attention route keras-hub ships."""

from vllm_keras_hub.families.family import Family


FAMILY = Family(
    "gemma3",
    "Gemma3 (text)",
    "Gemma3Backbone",
    stop_tokens=("<end_of_turn>",),
    tensor_parallel=True,
)
