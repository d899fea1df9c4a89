"""What a preset served with video needs: its format, in `config.json`.

A preset served with images (`image_format.py`) whose family reads a video
format (its `formats.video_fields`) and that also carries a video
converter (`video_converter.json`, as the published presets do) is served
with video too; its frames go through the vision encoder. Its
`config.json` carries the video format as `keras_hub_video`, read by the
processor (`models/multimodal.py`, with the family's `video.py`) and the
model class:
- `placeholder`: what a prompt writes for a video;
- `start_token`, `video_token`, `end_token`: the markers around each
  frame's (or pair of frames') soft tokens, which the family's `video.py`
  writes with their timestamps as its preprocessor writes them;
- `num_frames`, `max_soft_tokens`, `patch_size`, `pooling`: the frames a
  video is sampled to, the bound of their soft tokens (a frame's, or a
  whole video's where the converter budgets pixels over all frames), a
  patch's side and the pooling or merge of patches into soft tokens;
- `fps`: the preprocessor's `video_fps`, for a video whose metadata gives
  no frame rate;
- `tokens_per_video`: the most tokens a video's span can take, for vLLM's
  budgets;
- `layout`: the family whose `video.py` turns videos into the model's
  inputs and spans (`"gemma4"`, `"qwen3_5"`).
"""

from vllm_keras_hub import families

FIELDS = (
    "placeholder", "start_token", "video_token", "end_token", "num_frames",
    "max_soft_tokens", "patch_size", "pooling", "fps", "tokens_per_video", "layout",
)  # fmt: skip


def load_video_converter(preset):
    """The preset's video converter, or `None` if it has none.

    Read through the preset loader: `VideoConverter.from_preset` fails
    where the converter class names no `backbone_cls` (KerasHub 0.32's
    Gemma4 converter), as `find_subclass` then finds none for the backbone.
    """
    from keras_hub.src.layers.preprocessing.video_converter import VideoConverter

    from vllm_keras_hub.export.image_format import preprocessor_part
    from vllm_keras_hub.preset import Preset

    preset = Preset.of(preset)
    # As the preprocessor holds it, where it does (`load_image_converter`).
    converter = preprocessor_part(preset, "video_converter")
    if converter is not None:
        return converter
    if not preset.has("video_converter.json"):
        return None
    return preset.load(VideoConverter, exact=True)


def preprocessor_fps(preset, default):
    """The preprocessor's `video_fps`, for a video whose metadata gives no
    frame rate; `default`, the family preprocessor's, where it saved none."""
    from vllm_keras_hub.preset import Preset

    return float(Preset.of(preset).preprocessor_config.get("video_fps", default))


def video_fields(preset, backbone_class, tokenizer, serves_images):
    """The `config.json` fields of a preset served with video; `{}` if none.

    Its family's own `formats.video_fields` (`families.part`) reads them.

    Args:
        preset: The preset.
        backbone_class: Its backbone class name.
        tokenizer: Its KerasHub tokenizer.
        serves_images: Whether the preset is served with images (video
            frames go through the same vision encoder).
    """
    formats = families.part(families.family_for_backbone(backbone_class), "formats")
    if not serves_images or not hasattr(formats, "video_fields"):
        return {}
    return formats.video_fields(preset, tokenizer)


def read_video_format(config):
    """The `keras_hub_video` of a model folder's config, or `None`.

    Args:
        config: The folder's `KerasHubConfig`.

    Raises:
        ValueError: a folder exported by an older vllm-keras-hub.
    """
    from vllm_keras_hub.export.hf_config import read_media_format

    return read_media_format(config, "video", FIELDS)
