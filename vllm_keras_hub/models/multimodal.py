"""Images into a KerasHub preset through vLLM's multimodal processor.

vLLM's front end turns each request's images into model inputs with the
model's registered processor, before the engine schedules it. Ours does
what the preset's own `CausalLMPreprocessor` does, with the preset's own
parts and no Hugging Face processor:
- the preset's `ImageConverter` resizes and rescales each image (Gemma4's
  also cuts it into patches, padded by its aspect ratio, with their
  positions);
- each image placeholder in the prompt expands as KerasHub expands it
  (Gemma3, Gemma3n: `\\n\\n<start_of_image>` + one soft token per
  embedding + `<end_of_image>\\n\\n`, the newlines merged with the text
  around them as KerasHub's tokenizer merges them; Gemma4: `<|image>` +
  `<|image|>` per embedding + `<image|>`) (`expand_placeholders`);
- vLLM's encoder cache, multimodal prefix-cache hashing and scheduler see
  each image as the span of its soft tokens.

`config.json` carries the image format (`export/image_format.py`). The model
class (`vision.py`) runs the vision encoder and merges its embeddings.
"""

import functools

import torch
from vllm.multimodal.processing import BaseDummyInputsBuilder
from vllm.multimodal.processing.processor import BaseMultiModalProcessor
from vllm.multimodal.processing.processor import BaseProcessingInfo
from vllm.multimodal.processing.processor import PromptReplacement
from vllm.multimodal.processing.processor import PromptUpdateDetails


@functools.lru_cache(maxsize=4)
def _image_converter(preset):
    from vllm_keras_hub.backend import default_to_torch

    default_to_torch()
    from keras_hub.src.layers.preprocessing.image_converter import ImageConverter

    return ImageConverter.from_preset(preset)


def to_pixels(preset, images):
    """The preset's `ImageConverter` on `images`, as the model's inputs.

    Args:
        preset: The KerasHub preset.
        images: PIL images (vLLM's parsed image items).

    Returns:
        A dict of tensors, one row per image: float32 `pixel_values`
        (`(num_images, height, width, 3)`; Gemma4: `(num_images, patches,
        3 * patch_size**2)`), and Gemma4's int32 `pixel_position_ids`
        (`(num_images, patches, 2)`; -1 for padding).
    """
    import numpy as np
    from keras import ops

    converter = _image_converter(preset)
    rows = []
    for image in images:
        pixels = np.asarray(image.convert("RGB"), "float32")
        if _cuts_patches(converter):
            # Gemma4's converter takes a batch (its resize reads the batch's
            # height and width).
            converted = converter(pixels[None])
            rows.append({k: ops.convert_to_numpy(v)[0] for k, v in converted.items()})
        else:
            rows.append({"pixel_values": ops.convert_to_numpy(converter(pixels))})
    return {key: torch.from_numpy(np.stack([row[key] for row in rows])) for key in rows[0]}


def _cuts_patches(converter):
    from keras_hub.src.models.gemma4.gemma4_image_converter import Gemma4ImageConverter

    return isinstance(converter, Gemma4ImageConverter)


def image_span(vocab, image):
    """The token ids one image's placeholder expands to, newlines aside."""
    return (
        [vocab[image["start_token"]]]
        + [vocab[image["image_token"]]] * image["tokens_per_image"]
        + [vocab[image["end_token"]]]
    )


def expand_placeholders(token_ids, tokenizer, image):
    """The prompt's ids with each image placeholder expanded as KerasHub does.

    KerasHub replaces each placeholder in the prompt's text, then tokenizes
    the result whole (e.g. `Gemma3CausalLMPreprocessor`), so the expansion's
    newlines merge with the text around them. Special tokens are split
    points of both tokenizers, so each stretch of text between two of them
    is decoded, given its newlines and encoded again, and special tokens
    (the start token, turn markers) are kept as they are. Without newlines
    (Gemma4), the text is left as it was tokenized.

    Args:
        token_ids: The prompt's token ids.
        tokenizer: vLLM's tokenizer of the preset.
        image: The preset's `keras_hub_image` config.

    Returns:
        The expanded token ids.
    """
    vocab = tokenizer.get_vocab()
    placeholder = vocab[image["placeholder"]]
    span = image_span(vocab, image)
    newlines = image["newlines"]
    if not newlines:
        new_ids = []
        for token in token_ids:
            new_ids += span if token == placeholder else [token]
        return new_ids
    atomic = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    pieces, run = [], []
    for token in [*token_ids, None]:
        if token is not None and token not in atomic:
            run.append(token)
            continue
        if run:
            pieces.append(tokenizer.decode(run, skip_special_tokens=False))
            run = []
        if token == placeholder:
            pieces += [newlines, span, newlines]
        elif token is not None:
            pieces.append([token])
    new_ids, text = [], ""
    for piece in [*pieces, []]:
        if isinstance(piece, str):
            text += piece
            continue
        if text:
            new_ids += tokenizer.encode(text, add_special_tokens=False)
            text = ""
        new_ids += piece
    return new_ids


class KerasHubProcessingInfo(BaseProcessingInfo):
    """The preset's image format, from its `config.json`."""

    @property
    def image(self):
        from vllm_keras_hub.export.image_format import read_image_format

        return read_image_format(self.get_hf_config())

    def get_hf_processor(self, **kwargs):
        raise NotImplementedError(
            "A KerasHub preset has no Hugging Face processor: its own "
            "image converter preprocesses images."
        )

    def get_supported_mm_processor_kwargs(self):
        return {"text_kwargs": set(), "images_kwargs": set()}

    def get_supported_mm_limits(self):
        return {"image": None}

    def validate_num_items(self, modality, num_items):
        if modality != "image" and num_items:
            from vllm.exceptions import VLLMValidationError

            raise VLLMValidationError(
                f"This KerasHub preset takes images, not {modality}: "
                f"{modality} input is not served.",
                parameter=modality,
            )
        super().validate_num_items(modality, num_items)

    def get_mm_max_tokens_per_item(self, seq_len, mm_counts):
        # The placeholder's tokens, its start and end markers included:
        # vLLM checks that a step's token budget holds one whole image.
        return {"image": self.image["tokens_per_image"] + 2}


class KerasHubDummyInputsBuilder(BaseDummyInputsBuilder[KerasHubProcessingInfo]):
    """Profiling inputs: placeholders and images of the encoder's size."""

    def get_dummy_text(self, mm_counts):
        return self.info.image["placeholder"] * mm_counts.get("image", 0)

    def get_dummy_mm_data(self, seq_len, mm_counts, mm_options):
        size = self.info.image["image_size"]
        return {
            "image": self._get_dummy_images(
                width=size,
                height=size,
                num_images=mm_counts.get("image", 0),
                overrides=mm_options.get("image"),
            )
        }


class KerasHubMultiModalProcessor(BaseMultiModalProcessor[KerasHubProcessingInfo]):
    """Pixels from the preset's converter; placeholders expanded as KerasHub does."""

    def _call_hf_processor(self, hf_data, hf_kwargs):
        from transformers.feature_extraction_utils import BatchFeature

        preset = self.info.get_hf_config().keras_hub_preset
        return BatchFeature(to_pixels(preset, hf_data["images"]))

    def _get_mm_fields_config(self, hf_inputs, hf_processor_mm_kwargs):
        from vllm.multimodal.inputs import MultiModalFieldConfig

        return {key: MultiModalFieldConfig.batched("image") for key in hf_inputs}

    def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
        image = self.info.image
        vocab = self.info.get_tokenizer().get_vocab()
        soft_token = vocab[image["image_token"]]
        span = image_span(vocab, image)
        return [
            PromptReplacement(
                modality="image",
                target=[vocab[image["placeholder"]]],
                replacement=PromptUpdateDetails.select_token_id(span, soft_token),
            )
        ]

    def _apply_prompt_updates(self, token_ids, mm_prompt_updates):
        new_ids = expand_placeholders(token_ids, self.info.get_tokenizer(), self.info.image)
        return new_ids, self._find_mm_placeholders(new_ids, mm_prompt_updates)
