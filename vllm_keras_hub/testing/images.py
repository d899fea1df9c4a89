"""Images, requests and checks shared by the image tests."""

import numpy as np
from PIL import Image


def random_image(seed, height=40, width=50):
    """A PIL image of random pixels."""
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), np.uint8)
    return Image.fromarray(pixels)


# Three aspect ratios (Gemma4 pads each image's patches by its own).
IMAGES = [random_image(0), random_image(1, 64, 30), random_image(2, 20, 80)]


def batch_prompts(placeholder):
    """`(text, images)` prompts with 0, 1 and 2 images, for one batch.

    The two-image prompt's images have the same size: KerasHub 0.32's Gemma4
    pools a batch of images by the widest one's grid, so its `generate()`
    is only exact for images of one size at a time (`families/gemma4/
    media.py`).
    """
    return [
        (f"a {placeholder} caption", [IMAGES[0]]),
        ("Hello there", []),
        (f"two {placeholder} and {placeholder} compared", [IMAGES[0], random_image(3)]),
        (f"a {placeholder} caption", [IMAGES[1]]),
        (f"a {placeholder} caption", [IMAGES[2]]),
    ]


def request(text, images):
    """A `vllm.LLM.generate` prompt with `images`, or the text alone."""
    if not images:
        return text
    return {"prompt": text, "multi_modal_data": {"image": images}}


def assert_tokens(outputs, expected):
    """Each output's prompt and generated ids equal the oracle's."""
    for output, (prompt_ids, generated) in zip(outputs, expected, strict=True):
        assert output.prompt_token_ids == prompt_ids
        assert list(output.outputs[0].token_ids) == generated


def image_token_id(preset):
    """The id of the token an image's embeddings take the places of, from
    the preset's image format (`export/image_format.py`)."""
    import keras_hub

    from vllm_keras_hub.export.image_format import image_fields
    from vllm_keras_hub.export.preset_folder import read_preset

    family, config, _ = read_preset(preset)
    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    image = image_fields(preset, family.backbone, config, tokenizer)["keras_hub_image"]
    return tokenizer.token_to_id(image["image_token"])


def image_positions(preset, ids):
    """Positions of the image soft tokens in a prompt's ids."""
    soft = image_token_id(preset)
    return [i for i, token in enumerate(ids) if token == soft]


def same_image_twice(placeholder):
    """Two prompts with the same image and the same text up to past it."""
    image = random_image(7)
    return [
        (f"Look at this picture carefully: {placeholder} what is it?", [image]),
        (f"Look at this picture carefully: {placeholder} and its colour?", [image]),
    ]


def assert_the_second_hits_the_prefix_cache_inside_the_image(
    llm, preset, prompts, expected, params
):
    """Served one after the other, `same_image_twice`'s prompts give the
    oracle's tokens, and the second's cached blocks end inside its image:
    the image's last tokens are computed in the next step."""
    first = llm.generate([request(*prompts[0])], params, use_tqdm=False)
    second = llm.generate([request(*prompts[1])], params, use_tqdm=False)
    assert_tokens(first + second, expected)
    positions = image_positions(preset, expected[1][0])
    assert positions[0] < second[0].num_cached_tokens <= positions[-1]


def image_data_url(image):
    """A PNG data URL of a PIL image, as a chat message's `image_url`."""
    import base64
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return f"data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}"
