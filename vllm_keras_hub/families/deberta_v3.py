"""DeBERTaV3: refused, with its reason."""

from vllm_keras_hub.families.family import Family

FAMILY = Family(
    "deberta_v3",
    "DeBERTaV3",
    "DebertaV3Backbone",
    route=None,
    unsupported_reason=(
        "its disentangled attention adds content-to-position and "
        "position-to-content scores from learned relative position embeddings "
        "to every score, which vLLM's attention kernels take no input for"
    ),
)
