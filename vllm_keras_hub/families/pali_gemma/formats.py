"""The image format of a PaliGemma preset's model folder.

`image_fields` returns its `config.json` field (`export/image_format.py`
says what the fields mean).
"""

from vllm_keras_hub.export.image_format import load_image_converter


def image_fields(preset, backbone_config, tokenizer):
    """PaliGemma: every prompt is one image and its text, the image first.

    `PaliGemmaCausalLM` puts the ViT's embeddings (one per patch) before the
    prompt's and attends over both bidirectionally. The prompt writes no
    placeholder; the image's rows carry the `image_token` (`<image>` where
    the vocabulary has it, else the pad token), never embedded as text.
    """
    if load_image_converter(preset) is None:
        raise ValueError(
            f"Preset '{preset}' is a PaliGemma model without an image "
            "converter (image_converter.json); PaliGemma generates from an "
            "image, so it cannot be served without one."
        )
    vocabulary = set(tokenizer.get_vocabulary())
    image_token = "<image>" if "<image>" in vocabulary else tokenizer.pad_token
    size = int(backbone_config["image_size"])
    window = None
    if backbone_config.get("use_sliding_window_attention"):
        window = int(backbone_config["sliding_window_size"])
    image = dict(
        placeholder=None,
        start_token=None,
        image_token=image_token,
        end_token=None,
        newlines="",
        tokens_per_image=(size // int(backbone_config["vit_patch_size"])) ** 2,
        image_size=size,
        bidirectional="prefix",
        window=window,
    )
    return dict(keras_hub_image=image)
