"""Moonshine: refused, with its reason."""

from vllm_keras_hub.families.family import Family

FAMILY = Family(
    "moonshine",
    "Moonshine",
    "MoonshineBackbone",
    route=None,
    unsupported_reason=(
        "speech-to-text (/v1/audio/transcriptions) is not served yet: its audio "
        "encoder and its decoder's cross-attention have no route to vLLM's kernels"
    ),
)
