"""Images, audio and video into a KerasHub preset through vLLM's
multimodal processor.

vLLM's front end turns each request's media into model inputs with the
model's registered processor, before the engine schedules it. Ours does
what the preset's own `CausalLMPreprocessor` does, with the preset's own
parts and no Hugging Face processor:
- the preset's `ImageConverter` resizes and rescales each image; a family
  whose converter gives more (patches and their positions, a grid)
  converts with its own `inputs.to_pixels` (`families.part`);
- each placeholder in the prompt expands as KerasHub expands it: its start
  marker, one soft token per embedding, its end marker, and newlines merged
  with the text around them as KerasHub's tokenizer merges them
  (`placeholders.py`);
- vLLM's encoder cache, multimodal prefix-cache hashing and scheduler see
  each item as the span of its soft tokens.
Audio clips go the same way: vLLM decodes and resamples each clip to the
converter's rate, the preset's `AudioConverter` computes its features
(`audio.py`), and the clip's placeholder expands as the preprocessor
expands it. A video goes to its family's `video.py` (`video.py` here).

`config.json` carries the image, audio and video formats
(`export/image_format.py`, `export/audio_format.py`,
`export/video_format.py`). The model class (the family's `media.py`) runs
the encoders and merges their embeddings.
"""

import torch
from vllm.multimodal.processing import BaseDummyInputsBuilder
from vllm.multimodal.processing.processor import BaseMultiModalProcessor
from vllm.multimodal.processing.processor import BaseProcessingInfo
from vllm.multimodal.processing.processor import PromptReplacement
from vllm.multimodal.processing.processor import PromptUpdateDetails

from vllm_keras_hub.models import video as shared_video
from vllm_keras_hub.models.placeholders import expand_placeholders
from vllm_keras_hub.models.placeholders import media_span
from vllm_keras_hub.models.placeholders import soft_token
from vllm_keras_hub.vllm_fixes.audio_integer_samples import scale_integer_samples

# The front end decodes clips where this processor runs, before it runs.
scale_integer_samples()


def image_converter(preset):
    """The preset's image converter, read once for the served preset."""
    from vllm_keras_hub.export.image_format import load_image_converter
    from vllm_keras_hub.preset import served

    return served(preset).kept(load_image_converter)


def to_pixels(preset, images, image=None):
    """The preset's `ImageConverter` on `images`, as the model's inputs.

    Args:
        preset: The KerasHub preset.
        images: PIL images (vLLM's parsed image items).
        image: The preset's image format, where an image of too many soft
            tokens is to be refused (`inputs.to_pixels` of a family whose
            images vary in soft tokens).

    Returns:
        A dict of tensors, one row per image: float32 `pixel_values`
        (`(num_images, height, width, 3)`), or what the family's own
        `inputs.to_pixels` gives.
    """
    import numpy as np
    from keras import ops

    from vllm_keras_hub.preset import served

    converter = image_converter(preset)
    inputs = served(preset).part("inputs")
    if hasattr(inputs, "to_pixels"):
        return inputs.to_pixels(converter, images, image)
    rows = [
        ops.convert_to_numpy(converter(np.asarray(item.convert("RGB"), "float32")))
        for item in images
    ]
    return {"pixel_values": torch.from_numpy(np.stack(rows))}


def image_tokens(preset, image, item):
    """An image's soft tokens, from its processed fields (vLLM's processor
    cache keeps those, not the image), where they vary by image; else
    `None`: every image takes the format's `tokens_per_image`."""
    from vllm_keras_hub.preset import served

    inputs = served(preset).part("inputs")
    if not hasattr(inputs, "image_tokens"):
        return None
    return inputs.image_tokens(image, item, image_converter(preset))


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
            side = getattr(shared_video.layout(video), "dummy_frame_side", None)
            size = side(video) if side else size
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

        preset = self.info.get_hf_config().keras_hub_preset
        outputs = {}
        if hf_data.get("images"):
            outputs.update(to_pixels(preset, hf_data["images"], self.info.image))
        if hf_data.get("audio"):
            for clip in hf_data["audio"]:
                clip_tokens(self.info.audio, len(clip))  # Raises for a clip too short.
            outputs.update(to_features(preset, hf_data["audio"]))
        if hf_data.get("videos"):
            video = self.info.video
            outputs.update(shared_video.layout(video).to_inputs(preset, video, hf_data["videos"]))
        return BatchFeature(outputs)

    def _get_mm_fields_config(self, hf_inputs, hf_processor_mm_kwargs):
        from vllm.multimodal.inputs import MultiModalFieldConfig

        from vllm_keras_hub.preset import served

        def modality(key):
            if key.startswith("input_features"):
                return "audio"
            return "video" if key.startswith("video_") else "image"

        fields = {key: MultiModalFieldConfig.batched(modality(key)) for key in hf_inputs}
        # Where an item is a varying number of rows (the family says).
        inputs = served(self.info.get_hf_config().keras_hub_preset).part("inputs")
        if hasattr(inputs, "fields_config"):
            fields.update(inputs.fields_config(hf_inputs, MultiModalFieldConfig.flat_from_sizes))
        return fields

    def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
        tokenizer = self.info.get_tokenizer()
        vocab = tokenizer.get_vocab()
        preset = self.info.get_hf_config().keras_hub_preset
        updates = []
        for modality, media in self.info.formats.items():

            def replacement(index, modality=modality, media=media):
                item = out_mm_kwargs[modality][index]
                if modality == "video":
                    return shared_video.layout(media).video_span(tokenizer, media, item)
                if modality == "audio":
                    count = clip_count(media, item)
                else:
                    count = image_tokens(preset, media, item)
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
        collapse = getattr(shared_video.layout(video), "collapse_markers", None) if video else None
        if collapse is not None:
            token_ids = collapse(token_ids, video, vocab)

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
