"""The vLLM model classes of Gemma presets served with images (and
Gemma3n's and Gemma4's audio), one per family, on `ImagesMixin`
(`images.py`).

Each family's own vision encoder computes the embeddings, and they take
the image tokens' places as its backbone places them:
- Gemma3 (`Gemma3InterleaveEmbeddings`): SigLIP, pooled and projected; the
  text embeddings scaled by sqrt(hidden), the images not. Every layer
  attends bidirectionally within each image (`layers/image_attention.py`).
- Gemma3n (`Gemma3nMultimodalEmbeddingProcessor`): MobileNet-v5, its
  features scaled by sqrt(features) and embedded by the vision embedder;
  the text embeddings (and its vision vocabulary's hard embeddings) are the
  processor's own. The per-layer inputs are projected from the merged
  embeddings (`text_forward.py`). Causal. It takes audio clips too, each
  embedded by the same processor (`audio.py`).
- Gemma4 (`Gemma4Backbone`): its ViT, each image encoded alone; the images
  scaled by 1/sqrt(hidden), merged, then all scaled by sqrt(hidden); the
  per-layer token ids zero at image tokens (`is_multimodal`). With
  `use_vision_bidirectional_attention`, its sliding-window layers attend
  bidirectionally within each image; otherwise causal. It takes audio clips
  too, encoded by its audio encoder and placed as images are (`audio.py`),
  and videos: frames through its vision encoder (`video.py`).
"""

from vllm_keras_hub.backend import require_torch_backend

# Before anything below imports Keras (`layers.attention` does): plain `vllm`
# in a fresh shell names no backend.
require_torch_backend()

import math

import torch
from vllm.model_executor.models.interfaces import SupportsMultiModal
from vllm.model_executor.models.utils import _merge_multimodal_embeddings

from vllm_keras_hub.layers.attention import token_embedding
from vllm_keras_hub.models.audio import Gemma3nTranscription
from vllm_keras_hub.models.audio import embed_clip
from vllm_keras_hub.models.audio import embed_gemma4_clip
from vllm_keras_hub.models.causal import KerasHubForCausalLM
from vllm_keras_hub.models.images import ImagesMixin
from vllm_keras_hub.models.images import register
from vllm_keras_hub.models.probe import RouteError


@register
class KerasHubVisionForCausalLM(ImagesMixin, KerasHubForCausalLM, SupportsMultiModal):
    """A KerasHub Gemma3 preset with a vision encoder (`gemma3_4b` and up)."""

    placeholder = "<start_of_image>"
    family_name = "Gemma3"

    def _encode(self, pixel_values):
        return self.backbone.vision_encoder(pixel_values[:, None])

    def _embed(self, input_ids, images, is_image):
        return scaled_text_embeddings(self.backbone, input_ids, images, is_image)


def scaled_text_embeddings(backbone, input_ids, images, is_image):
    """Token embeddings scaled by sqrt(hidden), images merged in unscaled.

    As `Gemma3Backbone` and `PaliGemmaCausalLM` compute them: `x *
    ops.cast(ops.sqrt(hidden_dim), x.dtype)` on the text only.
    """
    embeddings = token_embedding(backbone)(input_ids)
    scale = torch.tensor(math.sqrt(backbone.hidden_dim), dtype=torch.float32)
    embeddings = embeddings * scale.to(embeddings.dtype)
    if images is None:
        return embeddings
    return _merge_multimodal_embeddings(embeddings, images, is_image)


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


@register
class KerasHubGemma4VisionForCausalLM(ImagesMixin, KerasHubForCausalLM, SupportsMultiModal):
    """A KerasHub Gemma4 preset with a vision encoder."""

    placeholder = "<|image|>"
    audio_placeholder = "<|audio|>"
    video_placeholder = "<|video|>"
    family_name = "Gemma4"

    def _embed_clip(self, features, mask):
        return embed_gemma4_clip(self.backbone, features, mask)

    def _check_backbone(self, backbone):
        from vllm_keras_hub.models.multimodal import _image_converter

        converter = _image_converter(self.preset)
        encoder = backbone.vision_encoder
        expected = (converter.patch_size, converter.pooling_kernel_size)
        if (encoder.patch_size, encoder.pool_size) != expected:
            raise RouteError(
                f"{self._name}: its image converter cuts patches of "
                f"{converter.patch_size} pixels pooled by "
                f"{converter.pooling_kernel_size}, its vision encoder takes "
                f"patches of {encoder.patch_size} pooled by {encoder.pool_size}."
            )

    def _smallest_image(self):
        # One pooled cell of patches, not the converter's 2520 (seconds of
        # attention at load).
        encoder = self.backbone.vision_encoder
        side = encoder.pool_size
        rows, columns = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        positions = torch.stack([columns.flatten(), rows.flatten()], -1).int()
        pixels = torch.zeros(side * side, 3 * encoder.patch_size**2)
        return {"pixel_values": pixels[None], "pixel_position_ids": positions[None]}

    def _encode(self, pixel_values, pixel_position_ids):
        # One image at a time: `Gemma4VisionAveragePooling` takes the pooled
        # grid's width from the widest image of its batch (KerasHub 0.32),
        # and fails on, or misplaces, images of other aspect ratios.
        encoder = self.backbone.vision_encoder
        embeddings = [
            encoder(
                {
                    "pixel_values": values[None, None],
                    "pixel_position_ids": positions[None, None].int(),
                }
            )[0, 0]
            for values, positions in zip(pixel_values, pixel_position_ids)
        ]
        # `Gemma4Backbone`: pre-scaled so that the global scale by
        # sqrt(hidden) leaves them at the encoder's magnitude.
        scale = float(self.backbone.hidden_dim) ** -0.5
        return torch.stack(embeddings) * torch.tensor(scale, dtype=embeddings[0].dtype)

    def load_preset(self, lora_weights=None):
        super().load_preset(lora_weights)
        # Each step's per-layer token ids, written by `embed_input_ids`
        # (vLLM calls it before every step of a multimodal model), read by
        # `forward`: a buffer of fixed address, as vLLM's own Gemma3n keeps
        # its per-layer embeddings.
        self._per_layer_ids = torch.zeros(
            self.vllm_config.scheduler_config.max_num_batched_tokens,
            dtype=torch.long,
            device=self.vllm_config.device_config.device,
        )

    def _embed(self, input_ids, images, is_image):
        from keras import ops

        # Its graph's per-layer token ids are 0 at image tokens (its
        # `vision_mask`), and the step's own ids elsewhere.
        per_layer_ids = input_ids if images is None else torch.where(is_image, 0, input_ids)
        self._per_layer_ids[: len(input_ids)].copy_(per_layer_ids)
        embeddings = token_embedding(self.backbone)(input_ids)
        if images is not None:
            embeddings = _merge_multimodal_embeddings(embeddings, images, is_image)
        return embeddings * ops.cast(ops.sqrt(self.backbone.hidden_dim), embeddings.dtype)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        # A multimodal engine's steps come with embeddings, after
        # `embed_input_ids` kept their per-layer ids; an engine allowing no
        # images hands the ids alone, and they are the per-layer ids.
        if inputs_embeds is not None:
            input_ids = self._per_layer_ids[: inputs_embeds.shape[0]]
        return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
