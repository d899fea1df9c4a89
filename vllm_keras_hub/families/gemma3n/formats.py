"""The image and audio formats of a Gemma3n preset's model folder.

Each returns its `config.json` field (`export/image_format.py` and
`audio_format.py` say what the fields mean), or `{}` where the preset does
not take that modality.
"""

from vllm_keras_hub.export.image_format import gemma_image

# `Gemma3nAudioConverter.__call__`'s `max_length`, which its preprocessor
# leaves at the default: 30 s at 16 kHz.
CONVERTER_MAX_SAMPLES = 480000


def image_fields(preset, backbone_config, tokenizer):
    # MobileNet-v5's embeddings, at the token the embedding processor puts
    # them at; causal.
    image, _ = gemma_image(preset, backbone_config, tokenizer)
    if image is None:
        return {}
    image["image_token"] = tokenizer.id_to_token(backbone_config["image_token_id"])
    image.update(
        tokens_per_image=int(backbone_config["vision_soft_tokens_per_image"]),
        image_size=int(backbone_config["vision_encoder_config"]["image_shape"][0]),
    )
    return dict(keras_hub_image=image)


def audio_fields(preset, backbone_config, tokenizer, converter):
    # Every clip takes `audio_soft_tokens_per_image` tokens: the embedding
    # processor pads or cuts each clip's embeddings to that many, at this
    # token.
    audio = dict(
        placeholder=tokenizer.start_of_audio_token,
        start_token=tokenizer.start_of_audio_token,
        audio_token=tokenizer.id_to_token(backbone_config["audio_token_id"]),
        end_token=tokenizer.end_of_audio_token,
        newlines="\n\n",
        tokens_per_clip=int(backbone_config["audio_soft_tokens_per_image"]),
        frame_stride=None,
        sampling_rate=int(converter.sampling_rate),
        max_samples=CONVERTER_MAX_SAMPLES,
    )
    return dict(keras_hub_audio=audio)
