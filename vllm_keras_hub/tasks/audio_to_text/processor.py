"""Each request's clip, as the preset's own audio converter prepares it.

A clip is the encoder prompt's `audio` item, resampled by vLLM to the
converter's rate. The converter (`MoonshineAudioConverter`, loaded from the
preset) makes the encoder's input of it; the encoder's frames (its three
convolutions' output length) stand in the encoder prompt, so vLLM budgets
and caches that many cross-attention keys and values. Every clip is
prepared alone, unpadded: the encoder's convolutions and group norm run
over a whole clip, and padding would change them (`model.py`).
"""

import numpy as np
import torch
from keras_hub.src.layers.preprocessing.audio_converter import AudioConverter
from transformers.feature_extraction_utils import BatchFeature
from vllm.multimodal.inputs import MultiModalFieldConfig
from vllm.multimodal.parse import MultiModalDataParser
from vllm.multimodal.processing import BaseProcessingInfo
from vllm.multimodal.processing import EncDecMultiModalProcessor
from vllm.multimodal.processing import PromptReplacement
from vllm.multimodal.processing.dummy_inputs import BaseDummyInputsBuilder

from vllm_keras_hub.preset import served
from vllm_keras_hub.tasks.audio_to_text import FIELD
from vllm_keras_hub.tasks.audio_to_text import MODALITY
from vllm_keras_hub.tasks.audio_to_text import spec
from vllm_keras_hub.vllm_fixes.audio_integer_samples import scale_integer_samples

# The transcription endpoint decodes clips where this processor runs.
scale_integer_samples()

# The encoder prompt vLLM is given before the clip's frames replace it.
_PLACEHOLDER = 0


class AudioToTextProcessingInfo(BaseProcessingInfo):
    """One clip a request, of 0.1 to 64 seconds."""

    @property
    def audio(self):
        return getattr(self.get_hf_config(), FIELD)

    def get_data_parser(self):
        return MultiModalDataParser(
            target_sr=self.audio["sampling_rate"], audio_resample_method="pyav"
        )

    def get_supported_mm_limits(self):
        return {MODALITY: 1}

    def get_mm_max_tokens_per_item(self, seq_len, mm_counts):
        return {MODALITY: self.audio["max_encoder_tokens"]}

    def converter(self):
        """The preset's own `AudioConverter`."""
        return served(self.get_hf_config().keras_hub_preset).load(AudioConverter)

    def encoder_input(self, clip):
        """The encoder's input of one clip, `(samples, 1)`.

        Raises:
            ValueError: the clip is shorter or longer than the encoder takes.
        """
        clip = np.asarray(clip, dtype=np.float32).reshape(-1)
        audio = self.audio
        rate = audio["sampling_rate"]
        if not audio["min_samples"] <= len(clip) <= audio["max_samples"]:
            raise ValueError(
                f"The audio is {len(clip) / rate:.3f} s long; this preset "
                f"transcribes clips of {spec.MIN_SECONDS} to {spec.MAX_SECONDS} s "
                "(its audio converter's range), each whole: split longer audio."
            )
        values = self.converter()(clip[None], sampling_rate=rate)
        return torch.as_tensor(np.asarray(values)[0])


class AudioToTextDummyInputsBuilder(BaseDummyInputsBuilder[AudioToTextProcessingInfo]):
    """The longest clip, for vLLM's profiling run."""

    def get_dummy_text(self, mm_counts):
        return ""

    def get_dummy_mm_data(self, seq_len, mm_counts, mm_options=None):
        count = mm_counts.get(MODALITY, 0)
        return {
            MODALITY: self._get_dummy_audios(
                length=self.info.audio["max_samples"], num_audios=count
            )
        }


class AudioToTextProcessor(EncDecMultiModalProcessor[AudioToTextProcessingInfo]):
    """Prepares the clip; its encoder frames stand in the encoder prompt."""

    def create_encoder_prompt(self, prompt, mm_items):
        return [_PLACEHOLDER]

    def create_decoder_prompt(self, prompt, mm_items):
        # Where a request gives no decoder prompt: `generate_preprocess`'s
        # for a clip without text. It starts that prompt with the start
        # token, then packs it with the start token again (keras-hub 0.32);
        # a text is packed after one start token.
        start = self.info.audio["start_token_id"]
        return [start, start]

    def _call_hf_processor(self, hf_data, hf_kwargs):
        # vLLM hands clips on as Hugging Face processors name them, `audio`.
        values = [self.info.encoder_input(clip) for clip in hf_data.get(MODALITY, ())]
        return BatchFeature({"input_values": values})

    def _get_mm_fields_config(self, hf_inputs, hf_processor_mm_kwargs):
        return {"input_values": MultiModalFieldConfig.batched(MODALITY)}

    def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
        def replacement(index):
            samples = out_mm_kwargs[MODALITY][index]["input_values"].data.shape[0]
            return [_PLACEHOLDER] * spec.encoder_frames(samples)

        return [PromptReplacement(modality=MODALITY, target=[_PLACEHOLDER], replacement=replacement)]
