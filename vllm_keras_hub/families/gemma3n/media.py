"""The vLLM model class of Gemma3n presets, served with images and audio,
on `models/images.py`'s `ImagesMixin`.

Its MobileNet-v5 features, scaled by sqrt(features) and embedded by the
vision embedder, take the image tokens' places, as
`Gemma3nMultimodalEmbeddingProcessor` places them; the text embeddings (and
its vision vocabulary's hard embeddings) are the processor's own. The
per-layer inputs are projected from the merged embeddings (its
`text_forward`). Causal. Each audio clip is embedded by the same processor
(`embed_clip`), and `/v1/audio/transcriptions` writes its prompt
(`Gemma3nTranscription`).
"""

import torch
from vllm.model_executor.models.interfaces import SupportsMultiModal
from vllm.model_executor.models.interfaces import SupportsTranscription
from vllm.model_executor.models.utils import _merge_multimodal_embeddings
from vllm.model_executor.models.whisper_utils import ISO639_1_SUPPORTED_LANGS

from vllm_keras_hub.models.causal import KerasHubForCausalLM
from vllm_keras_hub.models.images import ImagesMixin
from vllm_keras_hub.models.images import register
from vllm_keras_hub.models.probe import RouteError


def embed_clip(backbone, features, mask, audio_token_id, tokens_per_clip):
    """One clip's soft-token embeddings, from the backbone's own processor.

    `Gemma3nMultimodalEmbeddingProcessor` encodes the clip, embeds it,
    pads or cuts it to `tokens_per_clip` and puts it at the audio tokens;
    given a row of nothing but audio tokens, its output is the clip's
    embeddings.

    Args:
        backbone: The `Gemma3nBackbone`.
        features: `(frames, mel bins)` features of one clip.
        mask: `(frames,)` bool, True at padding frames.
        audio_token_id: The audio soft token's id.
        tokens_per_clip: The backbone's `audio_soft_tokens_per_image`.

    Returns:
        A `(tokens_per_clip, hidden_size)` tensor.
    """
    device = features.device
    token_ids = torch.full((1, tokens_per_clip), audio_token_id, device=device)
    embeddings, _ = backbone.embedding_processor(
        {
            "token_ids": token_ids,
            "input_features": features[None, None],
            "input_features_mask": mask[None, None],
        }
    )
    return embeddings[0]


class Gemma3nTranscription(SupportsTranscription):
    """`/v1/audio/transcriptions` (and translations) for Gemma3n presets.

    Gemma3n transcribes from a free-form prompt. vLLM's own Gemma3n fixes
    it as below; here the clip's placeholder is KerasHub's,
    `<start_of_audio>`, which expands as for any prompt. A clip is cut at
    the converter's 30 s, as KerasHub cuts it, and not split.
    """

    supported_languages = ISO639_1_SUPPORTED_LANGS

    @classmethod
    def get_generation_prompt(cls, stt_params):
        from vllm.inputs import TextPrompt

        language = cls.supported_languages.get(stt_params.language or "", "")
        to_language = cls.supported_languages.get(stt_params.to_language or "", "")
        transcribe = stt_params.task_type == "transcribe"
        prompt = "<start_of_turn>user\n"
        prompt += "Transcribe this audio" if transcribe else "Translate this audio"
        if transcribe and language:
            prompt += f" into {language}"
        elif not transcribe:
            prompt += f" from {language}" if language else ""
            prompt += f" into {to_language}" if to_language else ""
        prompt += ": <start_of_audio><end_of_turn>\n<start_of_turn>model\n"
        rate = stt_params.stt_config.sample_rate
        return TextPrompt(prompt=prompt, multi_modal_data={"audio": (stt_params.audio, rate)})

    @classmethod
    def get_speech_to_text_config(cls, model_config, task_type):
        from vllm.config import SpeechToTextConfig

        from vllm_keras_hub.export.audio_format import read_audio_format

        audio = read_audio_format(model_config.hf_config)
        if audio is None:
            raise ValueError(
                "This Gemma3n preset has no audio encoder or audio converter: "
                "it transcribes nothing."
            )
        rate = audio["sampling_rate"]
        return SpeechToTextConfig(
            sample_rate=rate,
            max_audio_clip_s=audio["max_samples"] // rate,
            min_energy_split_window_size=None,
        )


@register
class KerasHubGemma3nVisionForCausalLM(
    ImagesMixin, KerasHubForCausalLM, SupportsMultiModal, Gemma3nTranscription
):
    """A KerasHub Gemma3n preset (its vision encoder: MobileNet-v5)."""

    placeholder = "<start_of_image>"
    audio_placeholder = "<start_of_audio>"
    family_name = "Gemma3n"

    def _check_backbone(self, backbone):
        encoder = backbone.vision_encoder
        if getattr(encoder, "data_format", "channels_last") != "channels_last":
            raise RouteError(
                f"{self._name}: its vision encoder is channels-first; only "
                "channels-last MobileNet-v5 encoders (as published) are served."
            )
        height, width = encoder.output_shape[1:3]
        if height * width != self.image["tokens_per_image"]:
            raise RouteError(
                f"{self._name}: its vision encoder gives {height * width} "
                f"embeddings per image, but the preset's "
                f"vision_soft_tokens_per_image is {self.image['tokens_per_image']}."
            )

    def _embed_clip(self, features, mask):
        token_id, count = self.backbone.audio_token_id, self.audio["tokens_per_clip"]
        return embed_clip(self.backbone, features, mask, token_id, count)

    def _encode(self, pixel_values):
        # `Gemma3nMultimodalEmbeddingProcessor.call`'s vision embeddings.
        encoder = self.backbone.vision_encoder
        features = encoder(pixel_values)
        features = features.reshape(features.shape[0], -1, features.shape[-1])
        dtype = self.backbone.embedding_processor.compute_dtype
        scale = torch.sqrt(torch.tensor(encoder.num_features, dtype=getattr(torch, dtype)))
        return self.backbone.embed_vision(features * scale)

    def _embed(self, input_ids, images, is_image):
        # The processor's own text (and vision-vocabulary) embeddings; its
        # per-layer inputs are computed again in `forward`, from the merged
        # embeddings.
        embeddings, _ = self.backbone.embedding_processor(
            {"token_ids": input_ids[None]}
        )
        embeddings = embeddings[0]
        if images is None:
            return embeddings
        return _merge_multimodal_embeddings(embeddings, images, is_image)
