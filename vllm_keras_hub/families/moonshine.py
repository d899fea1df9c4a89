"""Moonshine: speech-to-text, served as its `AudioToText` (`tasks/audio_to_text/`)."""

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS


def decoder_attention(backbone):
    # Each `MoonshineDecoderBlock`'s two `MoonshineMultiHeadAttention` layers.
    return [(block.self_attention, block.cross_attention) for block in backbone.decoder_blocks]


FAMILY = Family(
    "moonshine",
    "Moonshine",
    "MoonshineBackbone",
    OURS,
    audio_to_text="MoonshineAudioToText",
    decoder_attention=decoder_attention,
)
