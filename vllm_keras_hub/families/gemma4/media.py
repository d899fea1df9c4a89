"""The vLLM model class of Gemma4 presets served with images (and audio and
video), on `models/images.py`'s `ImagesMixin`.

Its ViT encodes each image alone; the images are scaled by 1/sqrt(hidden),
merged, then all embeddings scaled by sqrt(hidden), as `Gemma4Backbone`
does; its per-layer token ids are zero at image tokens (`is_multimodal`).
With `use_vision_bidirectional_attention` its sliding-window layers attend
bidirectionally within each image; otherwise causal. Each audio clip is
encoded by its audio encoder and placed as an image is (`embed_clip`), and
each video's frames go through its vision encoder (`video.py`).
"""

import torch
from keras import ops
from vllm.model_executor.models.interfaces import SupportsMultiModal
from vllm.model_executor.models.utils import _merge_multimodal_embeddings

from vllm_keras_hub.export.audio_format import frame_tokens
from vllm_keras_hub.families.gemma4.video import embed_video
from vllm_keras_hub.layers.attention.attention import token_embedding
from vllm_keras_hub.models.causal import KerasHubForCausalLM
from vllm_keras_hub.models.images import ImagesMixin
from vllm_keras_hub.models.images import register
from vllm_keras_hub.models.multimodal import image_converter
from vllm_keras_hub.models.probe import RouteError


def embed_clip(backbone, features, mask):
    """One clip's soft-token embeddings, as `Gemma4Backbone` places them.

    Its audio encoder takes the converter's frames, padding and all; the
    backbone scales its outputs by 1/sqrt(hidden) and puts the first of
    them at the clip's tokens, one per 4 valid frames, rounded up
    (`audio_format.clip_tokens`).

    Args:
        backbone: The `Gemma4Backbone`.
        features: `(frames, mel bins)` features of one clip.
        mask: `(frames,)` bool, True at padding frames.

    Returns:
        A `(tokens, hidden_size)` tensor.
    """
    valid = ~mask
    embeddings = backbone.audio_encoder(features[None, None], valid[None, None])[0, 0]
    count = frame_tokens(int(valid.sum()))
    scale = torch.tensor(float(backbone.hidden_dim) ** -0.5, dtype=embeddings.dtype)
    return embeddings[:count] * scale


@register
class KerasHubGemma4VisionForCausalLM(ImagesMixin, KerasHubForCausalLM, SupportsMultiModal):
    """A KerasHub Gemma4 preset with a vision encoder."""

    placeholder = "<|image|>"
    audio_placeholder = "<|audio|>"
    video_placeholder = "<|video|>"
    family_name = "Gemma4"

    def _embed_clip(self, features, mask):
        return embed_clip(self.backbone, features, mask)

    def _embed_videos(self, video_pixel_values, video_pixel_position_ids, video_frame_tokens, **_):
        return tuple(
            embed_video(self.backbone, values, positions, count).to(self._dtype)
            for values, positions, count in zip(
                video_pixel_values, video_pixel_position_ids, video_frame_tokens, strict=True
            )
        )

    def _check_backbone(self, backbone):
        converter = image_converter(self.preset)
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
