"""F-Net: refused, with its reason."""

from vllm_keras_hub.families.family import Family

FAMILY = Family(
    "f_net",
    "F-Net",
    "FNetBackbone",
    route=None,
    unsupported_reason=(
        "it mixes tokens with a Fourier transform over each whole text, not "
        "attention: vLLM packs a step's texts into one row of tokens, and has "
        "no kernel that mixes each text's own"
    ),
)
