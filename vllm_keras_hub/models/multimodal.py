"""Images and audio into a KerasHub preset through vLLM's multimodal processor.

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
  `<|image|>` per embedding + `<image|>`) (`placeholders.py`);
- vLLM's encoder cache, multimodal prefix-cache hashing and scheduler see
  each image as the span of its soft tokens.
Audio clips (Gemma3n, Gemma4) go the same way: vLLM decodes and resamples
each clip to the converter's rate, the preset's `AudioConverter` computes
its features (`audio.py`), and the clip's placeholder expands as the
preprocessor expands it (Gemma3n: `\\n\\n<start_of_audio>` + its 188 soft
tokens + `<end_of_audio>\\n\\n`; Gemma4: `<|audio>` + one `<|audio|>` per
4 frames of the clip + `<audio|>`).

Gemma4's videos are frames through the same vision encoder, each video's
placeholder expanded to one timestamped span per frame (`video.py`).

`config.json` carries the image, audio and video formats
(`export/image_format.py`, `export/audio_format.py`,
`export/video_format.py`). The model class (`vision.py`) runs the encoders
and merges their embeddings.
"""

import functools

import torch
from vllm.multimodal.processing import BaseDummyInputsBuilder
from vllm.multimodal.processing.processor import BaseMultiModalProcessor
from vllm.multimodal.processing.processor import BaseProcessingInfo
from vllm.multimodal.processing.processor import PromptReplacement
from vllm.multimodal.processing.processor import PromptUpdateDetails

from vllm_keras_hub.models import patches
from vllm_keras_hub.models.patches import image_count
from vllm_keras_hub.models.patches import merges_patches
from vllm_keras_hub.models.patches import to_patches
from vllm_keras_hub.models.placeholders import expand_placeholders
from vllm_keras_hub.models.placeholders import media_span
from vllm_keras_hub.models.placeholders import soft_token
from vllm_keras_hub.vllm_fixes.audio_integer_samples import scale_integer_samples

# The front end decodes clips where this processor runs, before it runs.
scale_integer_samples()


@functools.lru_cache(maxsize=4)
def _image_converter(preset):
    from vllm_keras_hub.backend import default_to_torch

    default_to_torch()
    from vllm_keras_hub.export.image_format import load_image_converter
    from vllm_keras_hub.preset import served

    return load_image_converter(served(preset))


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
    if merges_patches(converter):
        return to_patches(converter, images)
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


def clip_count(audio, fields):
    """A clip's soft tokens, from its processed fields (`audio.to_features`):
    vLLM's processor cache keeps those, not the clip."""
    from vllm_keras_hub.export.audio_format import frame_tokens

    if audio["frame_stride"] is None:
        return audio["tokens_per_clip"]
    return frame_tokens(int((~fields["input_features_mask"].data).sum()))


# How an error names what a preset takes.
_NAMES = {"image": "images", "audio": "audio", "video": "video"}


class KerasHubProcessingInfo(BaseProcessingInfo):
    """The preset's image and audio formats, from its `config.json`."""

    @property
    def image(self):
        from vllm_keras_hub.export.image_format import read_image_format

        return read_image_format(self.get_hf_config())

    @property
    def audio(self):
        """The audio format, or `None` for a preset served without audio."""
        from vllm_keras_hub.export.audio_format import read_audio_format

        return read_audio_format(self.get_hf_config())

    @property
    def video(self):
        """The video format, or `None` for a preset served without video."""
        from vllm_keras_hub.export.video_format import read_video_format

        return read_video_format(self.get_hf_config())

    @property
    def formats(self):
        """Each served modality's format, by modality."""
        formats = {"image": self.image}
        if self.audio is not None:
            formats["audio"] = self.audio
        if self.video is not None:
            formats["video"] = self.video
        return formats

    def get_data_parser(self):
        from vllm.multimodal.parse import MultiModalDataParser

        # vLLM resamples each clip to the converter's rate, with PyAV: the
        # one resampler the lock installs (its default needs torchaudio).
        audio = self.audio
        # A video comes with its frames' source indices and frame rate, for
        # their timestamps (vLLM's loader gives them; so must an array).
        return MultiModalDataParser(
            target_sr=audio["sampling_rate"] if audio else None,
            audio_resample_method="pyav",
            video_needs_metadata=self.video is not None,
            expected_hidden_size=self._get_expected_hidden_size(),
            allow_missing_mm_embeddings=self.allow_missing_mm_embeddings,
        )

    def get_hf_processor(self, **kwargs):
        raise NotImplementedError(
            "A KerasHub preset has no Hugging Face processor: its own "
            "image converter preprocesses images."
        )

    def get_supported_mm_processor_kwargs(self):
        return {
            "text_kwargs": set(),
            "images_kwargs": set(),
            "audio_kwargs": set(),
            "videos_kwargs": set(),
        }

    def get_supported_mm_limits(self):
        return {modality: None for modality in self.formats}

    def validate_num_items(self, modality, num_items):
        if modality not in self.formats and num_items:
            from vllm.exceptions import VLLMValidationError

            *names, last = [_NAMES[name] for name in self.formats]
            served = f"{', '.join(names)} and {last}" if names else last
            raise VLLMValidationError(
                f"This KerasHub preset takes {served}, not {modality}: "
                f"{modality} input is not served.",
                parameter=modality,
            )
        super().validate_num_items(modality, num_items)

    def get_mm_max_tokens_per_item(self, seq_len, mm_counts):
        # The placeholder's tokens, its start and end markers included (a
        # video's bound counts its frames' markers already): vLLM checks
        # that a step's token budget holds one whole item.
        return {
            modality: soft_token(media)[1] + 2 * (modality != "video")
            for modality, media in self.formats.items()
        }


class KerasHubDummyInputsBuilder(BaseDummyInputsBuilder[KerasHubProcessingInfo]):
    """Profiling inputs: placeholders and images of the encoder's size."""

    def get_dummy_text(self, mm_counts):
        return "".join(
            media["placeholder"] * mm_counts.get(modality, 0)
            for modality, media in self.info.formats.items()
        )

    def get_dummy_mm_data(self, seq_len, mm_counts, mm_options):
        size = self.info.image["image_size"]
        data = {
            "image": self._get_dummy_images(
                width=size,
                height=size,
                num_images=mm_counts.get("image", 0),
                overrides=mm_options.get("image"),
            )
        }
        audio = self.info.audio
        if audio is not None:
            data["audio"] = self._get_dummy_audios(
                length=audio["max_samples"],
                num_audios=mm_counts.get("audio", 0),
                overrides=mm_options.get("audio"),
            )
        video = self.info.video
        if video is not None:
            if video["layout"] == "qwen3_5":
                size = patches.dummy_frame_side(video)
            videos = self._get_dummy_videos(
                width=size,
                height=size,
                num_frames=video["num_frames"],
                num_videos=mm_counts.get("video", 0),
                overrides=mm_options.get("video"),
            )
            data["video"] = [(frames, {"fps": video["fps"]}) for frames in videos]
        return data


class KerasHubMultiModalProcessor(BaseMultiModalProcessor[KerasHubProcessingInfo]):
    """Pixels and audio features from the preset's converters; placeholders
    expanded as KerasHub does."""

    def _call_hf_processor(self, hf_data, hf_kwargs):
        from transformers.feature_extraction_utils import BatchFeature

        from vllm_keras_hub.export.audio_format import clip_tokens
        from vllm_keras_hub.models.audio import to_features
        from vllm_keras_hub.models.video import _video_converter
        from vllm_keras_hub.models.video import to_frames

        preset = self.info.get_hf_config().keras_hub_preset
        outputs = {}
        if hf_data.get("images"):
            outputs.update(to_pixels(preset, hf_data["images"]))
            if "image_grid_thw" in outputs:
                merge = _image_converter(preset).spatial_merge_size
                for grid in outputs["image_grid_thw"]:
                    image_count(self.info.image, grid, merge)  # Raises for one too big.
        if hf_data.get("audio"):
            for clip in hf_data["audio"]:
                clip_tokens(self.info.audio, len(clip))  # Raises for a clip too short.
            outputs.update(to_features(preset, hf_data["audio"]))
        if hf_data.get("videos"):
            video, items = self.info.video, hf_data["videos"]
            if video["layout"] == "qwen3_5":
                converter = _video_converter(preset)
                outputs.update(patches.to_video_patches(converter, video, items))
            else:
                outputs.update(to_frames(preset, video, items))
        return BatchFeature(outputs)

    def _get_mm_fields_config(self, hf_inputs, hf_processor_mm_kwargs):
        from vllm.multimodal.inputs import MultiModalFieldConfig

        def modality(key):
            if key.startswith("input_features"):
                return "audio"
            return "video" if key.startswith("video_") else "image"

        fields = {key: MultiModalFieldConfig.batched(modality(key)) for key in hf_inputs}
        # Qwen3.5's images and videos: a varying number of patches each, and
        # a timestamp per pair of frames.
        flat = MultiModalFieldConfig.flat_from_sizes
        if "image_grid_thw" in hf_inputs:
            fields["pixel_values"] = flat("image", hf_inputs["image_grid_thw"].prod(-1))
        if "video_grid_thw" in hf_inputs:
            grids = hf_inputs["video_grid_thw"]
            fields["video_pixel_values"] = flat("video", grids.prod(-1))
            fields["video_timestamps"] = flat("video", grids[:, 0])
        return fields

    def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
        from vllm_keras_hub.models.video import video_span

        tokenizer = self.info.get_tokenizer()
        vocab = tokenizer.get_vocab()
        preset = self.info.get_hf_config().keras_hub_preset
        updates = []
        for modality, media in self.info.formats.items():

            def replacement(index, modality=modality, media=media):
                if modality == "video":
                    if media["layout"] == "qwen3_5":
                        return patches.video_span(tokenizer, media, out_mm_kwargs["video"][index])
                    return video_span(tokenizer, media, out_mm_kwargs["video"][index])
                count = None
                item = out_mm_kwargs[modality][index]
                if modality == "audio":
                    count = clip_count(media, item)
                elif "image_grid_thw" in item:
                    merge = _image_converter(preset).spatial_merge_size
                    count = image_count(media, item["image_grid_thw"].data, merge)
                return PromptUpdateDetails.select_token_id(
                    media_span(vocab, media, count), vocab[soft_token(media)[0]]
                )

            updates.append(
                PromptReplacement(
                    modality=modality,
                    target=[vocab[media["placeholder"]]],
                    replacement=replacement,
                )
            )
        return updates

    def _apply_prompt_updates(self, token_ids, mm_prompt_updates):
        vocab = self.info.get_tokenizer().get_vocab()
        video = self.info.video
        if video is not None and video["layout"] == "qwen3_5":
            token_ids = patches.collapse_video_markers(token_ids, video, vocab)

        def text_around(media, content):
            if "video_token" in media:
                return content.lead, ""
            return media["newlines"], media["newlines"]

        spans = {}
        for modality, media in self.info.formats.items():
            items = spans[vocab[media["placeholder"]]] = []
            for item in mm_prompt_updates.get(modality, ()):
                before, after = text_around(media, item[0].content)
                items.append((before, list(item[0].content.full), after))
        new_ids = expand_placeholders(token_ids, self.info.get_tokenizer(), spans)
        return new_ids, self._find_mm_placeholders(new_ids, mm_prompt_updates)
