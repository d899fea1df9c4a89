"""What a preset served with images needs: its format, and engine settings.

A preset of a family with an image model class whose preset has a vision
encoder, an image converter and image tokens is served with images; the
family's `formats.py` reads the format from the preset. Its `config.json`
carries it as `keras_hub_image`, read by the processor
(`models/multimodal.py`) and the model class (the family's `media.py`):
- `placeholder`: what a prompt writes for an image (`None` where the image
  comes first, unwritten);
- `start_token`, `image_token`, `end_token`, `tokens_per_image`, `newlines`:
  what the placeholder expands to, as the family's `CausalLMPreprocessor`
  expands it: `newlines + start + image_token * tokens_per_image + end +
  newlines` (where the count varies by image, `tokens_per_image` is the
  most);
- `image_size`: the side of the images vLLM profiles the encoder with;
- `bidirectional`: which layers attend bidirectionally within each image
  (`"all"`: every layer; `"sliding"`: the sliding-window layers only;
  `None`: causal; `"prefix"`: every layer over the image and its prompt),
  and `window`, the sliding window.
"""

from vllm_keras_hub import families
from vllm_keras_hub.export.hf_config import read_media_format
from vllm_keras_hub.preset import Preset


def preprocessor_part(preset, name):
    """The `name` layer (`"image_converter"`, `"video_converter"`) of the
    preset's `preprocessor.json`, as `CausalLM.from_preset` builds it, or
    `None` where the preset saved no preprocessor or it holds none."""
    import keras

    config = Preset.of(preset).preprocessor_config.get(name)
    return keras.saving.deserialize_keras_object(config) if config else None


def load_image_converter(preset):
    """The preset's image converter, as its preprocessor holds it.

    KerasHub 0.32's `Preprocessor.save_to_preset` saves every sublayer that
    can save itself, and a `VideoConverter` holds a plain `ImageConverter`:
    a preprocessor with both converters (Qwen3.5's) leaves that plain one in
    `image_converter.json`, over its own. So the preprocessor's config,
    which `CausalLM.from_preset` builds from, comes first; then
    `image_converter.json` (a preset saved without a preprocessor).
    """
    from keras_hub.src.layers.preprocessing.image_converter import ImageConverter

    preset = Preset.of(preset)
    converter = preprocessor_part(preset, "image_converter")
    if converter is not None:
        return converter
    if not preset.has("image_converter.json"):
        return None
    return preset.load(ImageConverter)


def image_fields(preset, backbone_class, backbone_config, tokenizer):
    """The `config.json` fields of a preset served with images; `{}` if none.

    Each family's own `formats.image_fields` (`families.part`) reads them;
    a family without one serves text.

    Args:
        preset: The preset.
        backbone_class: Its backbone class name.
        backbone_config: Its backbone config.
        tokenizer: Its KerasHub tokenizer.
    """
    formats = families.part(families.family_for_backbone(backbone_class), "formats")
    if formats is None or not hasattr(formats, "image_fields"):
        return {}
    return formats.image_fields(preset, backbone_config, tokenizer)


def gemma_image(preset, backbone_config, tokenizer):
    """`(image, converter)`: the format fields every Gemma family writes
    alike, and the preset's image converter; `(None, None)` for a preset
    with no vision encoder, no image converter or no image tokens (a Gemma4
    tokenizer built with `has_vision_tokens=False`), which serves text.

    The placeholder is the start marker, expanded to `newlines + start +
    image_token * tokens_per_image + end + newlines`, causal; the family
    sets `tokens_per_image`, `image_size` and what differs.
    """
    has_encoder = backbone_config.get("vision_encoder") or backbone_config.get(
        "vision_encoder_config"
    )
    if not has_encoder or getattr(tokenizer, "image_placeholder_id", -1) in (-1, None):
        return None, None
    converter = load_image_converter(preset)
    if converter is None:
        return None, None
    image = dict(
        placeholder=tokenizer.start_of_image_token,
        start_token=tokenizer.start_of_image_token,
        image_token=tokenizer.image_placeholder,
        end_token=tokenizer.end_of_image_token,
        newlines="\n\n",
        bidirectional=None,
        window=None,
    )
    return image, converter


# Every field above: a folder exported before some of them were written
# is refused with the fix.
FIELDS = (
    "placeholder", "start_token", "image_token", "end_token", "newlines",
    "tokens_per_image", "image_size", "bidirectional", "window",
)  # fmt: skip


def read_image_format(config):
    """The `keras_hub_image` of a model folder's config, checked whole.

    Args:
        config: The folder's `KerasHubConfig`.

    Raises:
        ValueError: a folder exported by an older vllm-keras-hub.
    """
    return read_media_format(config, "image", FIELDS)


def needs_whole_images(image):
    """Whether an image's tokens must be computed in one step.

    Where they attend bidirectionally, its first tokens see its last.

    Args:
        image: The preset's `keras_hub_image` config.
    """
    return image.get("bidirectional") is not None
