"""The image format of a Gemma3 preset's model folder (`gemma3_4b` and up).

`image_fields` returns its `config.json` field (`export/image_format.py`
says what the fields mean), or `{}` for a text-only preset.
"""

from vllm_keras_hub.export.image_format import gemma_image


def image_fields(preset, backbone_config, tokenizer):
    # SigLIP's pooled patches per image; every layer attends
    # bidirectionally within each image.
    image, _ = gemma_image(preset, backbone_config, tokenizer)
    if image is None:
        return {}
    encoder = backbone_config["vision_encoder"]["config"]
    patches = (encoder["image_size"] // encoder["patch_size"]) ** 2
    image.update(
        tokens_per_image=patches // encoder["pool_size"] ** 2,
        image_size=int(encoder["image_size"]),
        bidirectional="all",
    )
    return dict(keras_hub_image=image)
