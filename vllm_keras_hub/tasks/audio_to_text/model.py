"""The vLLM model class of KerasHub `AudioToText` presets (Moonshine).

Served as `tasks/seq_2_seq_lm/` serves BART: the backbone's own graph, cut
at the encoder's output, gives an encoder run once per clip (its
convolutions, group norm and transformer layers, in `embed_multimodal`)
and a decoder run every step, each decoder layer's self-attention on a
vLLM `Attention` over the paged cache and its cross-attention on a
`CrossAttention`. What Moonshine adds: its decoder's rotary positions,
which keras-hub computes from an `Arange` over the sequence; that layer
gives vLLM's per-token positions instead, and each self-attention rotates
its queries and keys with keras-hub's own rotation.

The encoder's self-attention runs as Keras computes it, over the whole
clip: vLLM keeps no cache for it. Each clip runs alone, unpadded, as the
preset's own `generate()` runs a batch of one: its group norm and
attention would see a padded batch's zeros.
"""

from vllm_keras_hub.backend import require_torch_backend

# Before anything below imports Keras: a clear error for another backend.
require_torch_backend()

import types

import keras
from keras import ops
from keras_hub.src.models.moonshine.moonshine_multi_head_attention import _apply_rotary_pos_emb
from keras_hub.src.vllm.context import get_vllm_context
from vllm.config.speech_to_text import SpeechToTextConfig
from vllm.inputs import ExplicitEncoderDecoderPrompt
from vllm.inputs import TextPrompt
from vllm.model_executor.models.interfaces import SupportsTranscription
from vllm.multimodal import MULTIMODAL_REGISTRY

from vllm_keras_hub.models.base import compiled
from vllm_keras_hub.tasks.audio_to_text import FIELD
from vllm_keras_hub.tasks.audio_to_text import MODALITY
from vllm_keras_hub.tasks.audio_to_text import processor
from vllm_keras_hub.tasks.audio_to_text import spec
from vllm_keras_hub.tasks.seq_2_seq_lm.model import EncoderDecoderModel
from vllm_keras_hub.tasks.seq_2_seq_lm.model import attend
from vllm_keras_hub.tasks.seq_2_seq_lm.model import cross_attend

LANGUAGES = {"en": "English"}


def _rotate(heads, rotary_embedding):
    # Tokens come one a row, `(tokens, 1, heads, size)`; keras-hub's
    # rotation takes them as one sequence, each at its own position.
    shape = ops.shape(heads)
    sequence = ops.reshape(heads, (1, -1, *shape[-2:]))
    return ops.reshape(_apply_rotary_pos_emb(sequence, rotary_embedding), shape)


def _self_attention(self, query, value, key, rotary_embedding=None, attention_mask=None,
                    cache=None, cache_update_index=None, training=None, **kwargs):  # fmt: skip
    # vLLM's kernel masks causally over the paged cache.
    return attend(
        self, self._vllm_attention,
        _rotate(self._query_dense(query), rotary_embedding),
        _rotate(self._key_dense(key), rotary_embedding),
        self._value_dense(value),
    )  # fmt: skip


def _cross_attention(self, query, value, key, rotary_embedding=None, attention_mask=None,
                     cache=None, cache_update_index=None, training=None, **kwargs):  # fmt: skip
    return cross_attend(self, query, key, value)


def _vllm_positions(self, inputs):
    return get_vllm_context().positions


@compiled
@MULTIMODAL_REGISTRY.register_processor(
    processor.AudioToTextProcessor,
    info=processor.AudioToTextProcessingInfo,
    dummy_inputs=processor.AudioToTextDummyInputsBuilder,
)
class KerasHubForSpeechSeq2Seq(EncoderDecoderModel, SupportsTranscription):
    """A KerasHub `AudioToText` preset: a clip in, its transcript out."""

    field = FIELD
    self_attention_call = staticmethod(_self_attention)
    cross_attention_call = staticmethod(_cross_attention)
    supported_languages = LANGUAGES
    supports_transcription_only = True

    def cut(self, backbone):
        inputs = backbone.input
        encoder_output = backbone.output["encoder_sequence_output"]
        encoder = keras.Model(
            {"encoder_input_values": inputs["encoder_input_values"],
             "encoder_padding_mask": inputs["encoder_padding_mask"]},
            encoder_output,
            name="encoder",
        )  # fmt: skip
        decoder = keras.Model(
            [inputs["decoder_token_ids"], inputs["decoder_padding_mask"],
             encoder_output, backbone.output["encoder_attention_mask"]],
            backbone.output["decoder_sequence_output"],
            name="decoder",
        )  # fmt: skip
        return encoder, decoder

    def route(self, backbone):
        super().route(backbone)
        positions = backbone.get_layer("decoder_positions")
        positions.call = types.MethodType(_vllm_positions, positions)

    def embed_multimodal(self, input_values=None, **kwargs):
        """Each clip's encoder output, `(frames, hidden)`: the preset's own
        encoder on the whole clip alone."""
        outputs = []
        for values in input_values:
            values = ops.reshape(values, (1, -1, 1))
            hidden = self.encoder(
                {"encoder_input_values": values,
                 "encoder_padding_mask": ops.ones(ops.shape(values)[:2], dtype="bool")},
                training=False,
            )  # fmt: skip
            outputs.append(hidden[0])
        return outputs

    @classmethod
    def validate_language(cls, language):
        if language is None or language in cls.supported_languages:
            return language
        # Not vLLM's warning and a transcript anyway: the preset transcribes
        # only its own language.
        raise ValueError(
            f"This preset transcribes {', '.join(cls.supported_languages.values())} "
            f"only; got language={language!r}."
        )

    @classmethod
    def get_speech_to_text_config(cls, model_config, task_type):
        audio = getattr(model_config.hf_config, FIELD)
        # No chunking: a clip over the converter's range is refused, as
        # splitting it would not be the preset's own transcript.
        return SpeechToTextConfig(
            sample_rate=audio["sampling_rate"],
            max_audio_clip_s=int(spec.MAX_SECONDS),
            min_energy_split_window_size=None,
        )

    @classmethod
    def get_num_audio_tokens(cls, audio_duration_s, stt_config, model_config):
        return spec.encoder_frames(int(audio_duration_s * stt_config.sample_rate))

    @classmethod
    def get_generation_prompt(cls, stt_params):
        if stt_params.task_type != "transcribe":
            raise ValueError("This preset transcribes; it does not translate.")
        audio = (stt_params.audio, stt_params.stt_config.sample_rate)
        # A request's prompt continues the decoder's start token, as
        # `generate_preprocess` packs a clip's text.
        text = stt_params.request_prompt
        return ExplicitEncoderDecoderPrompt(
            encoder_prompt=TextPrompt(prompt="", multi_modal_data={MODALITY: audio}),
            decoder_prompt=TextPrompt(prompt=text) if text else None,
        )
