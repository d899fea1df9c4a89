"""The vLLM model class of Qwen3.5 presets served with images: M-RoPE.

A Qwen3.5 image is as many soft tokens as its merged patches, which vary
with its size, and each soft token rotates its query and key by its
image's row and column as well as its place in the text (M-RoPE):
- the preset's own `Qwen3_5ImageConverter` cuts each image into patches,
  and `<|image_pad|>` expands to one pad per merged patch (`inputs.py`);
- the preset's own `Qwen3_5VisionEncoder` embeds each image, and the
  embeddings take the pads' places, as `Qwen3_5InterleaveEmbeddings`
  places them (unscaled);
- vLLM asks the model for each prompt's 3 rows of positions (temporal,
  height, width: `get_mrope_input_positions`), as the preprocessor
  computes them (`mrope_positions`), and continues them past the prompt
  by the returned delta; the full-attention layers rotate with KerasHub's
  own `_apply_mrope` at those rows (its route, `__init__.py`).
Videos are pairs of frames, each placed as an image (`video.py`). The
Gated DeltaNet layers keep their state as in `models/hybrid.py`.
"""

import torch
from vllm.model_executor.models.interfaces import SupportsMRoPE
from vllm.model_executor.models.interfaces import SupportsMultiModal
from vllm.model_executor.models.utils import _merge_multimodal_embeddings

from vllm_keras_hub.families.qwen3_5.inputs import frame_images
from vllm_keras_hub.families.qwen3_5.inputs import mrope_positions
from vllm_keras_hub.families.qwen3_5.inputs import to_pixels
from vllm_keras_hub.layers.attention.attention import token_embedding
from vllm_keras_hub.models import staged_images
from vllm_keras_hub.models.hybrid import KerasHubHybridForCausalLM
from vllm_keras_hub.models.images import ImagesMixin
from vllm_keras_hub.models.images import register
from vllm_keras_hub.models.multimodal import image_converter
from vllm_keras_hub.models.probe import RouteError


@register
class KerasHubQwen3_5VisionForCausalLM(
    ImagesMixin, KerasHubHybridForCausalLM, SupportsMultiModal, SupportsMRoPE
):
    """A KerasHub Qwen3.5 (or Qwen3.5-MoE) preset with a vision encoder."""

    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    video_placeholder = "<|vision_start|><|video_pad|><|vision_end|>"
    family_name = "Qwen3.5"
    requires_raw_input_tokens = False

    def _check_backbone(self, backbone):
        converter = image_converter(self.preset)
        encoder = backbone.vision_encoder
        cut = (converter.patch_size, converter.temporal_patch_size, converter.spatial_merge_size)
        taken = (encoder.patch_size, encoder.temporal_patch_size, encoder.spatial_merge_size)
        if cut != taken:
            raise RouteError(
                f"{self._name}: its image converter cuts (patch, temporal "
                f"patch, merge) {cut}, its vision encoder takes {taken}."
            )
        if backbone.rope_scaling_factor != 1.0:
            # Its `_apply_mrope` leaves the factor out, its text RoPE not:
            # the same text would rotate one way with images, one without.
            raise RouteError(
                f"{self._name}: its rope_scaling_factor is "
                f"{backbone.rope_scaling_factor}, which KerasHub's M-RoPE "
                "does not apply; only presets without RoPE scaling (as "
                "published) are served with images."
            )
        self._merge_size = converter.spatial_merge_size
        if self.video is not None:
            from keras_hub.src.tokenizers.tokenizer import Tokenizer

            tokenizer = self.preset.load(Tokenizer)
            self._vision_start = tokenizer.token_to_id(self.video["start_token"])

    def _smallest_image(self):
        # One merge window; the converter scales it up to its `min_pixels`.
        from PIL import Image

        converter = image_converter(self.preset)
        side = converter.patch_size * converter.spatial_merge_size
        return to_pixels(converter, [Image.new("RGB", (side, side))])

    def embed_multimodal(self, **fields):
        """The preset's vision encoder on each image, or each video, alone.

        Args:
            **fields: `pixel_values`, the images' patches one after
                another, and `image_grid_thw`, one row per image
                (`inputs.to_pixels`); or the videos' `video_pixel_values`
                and `video_grid_thw` (`video.to_inputs`).

        Returns:
            One `(soft_tokens, hidden_size)` tensor per image or video.
        """
        if self.stage is not None and not self.stage.first:
            grids = fields.get("video_grid_thw", fields.get("image_grid_thw"))
            return staged_images.no_embeddings(
                {"pixel_values": grids}, self.config.hidden_size, self._dtype
            )
        if "video_pixel_values" in fields:
            patches, grids = fields["video_pixel_values"], fields["video_grid_thw"]
        else:
            patches, grids = fields.get("pixel_values"), fields.get("image_grid_thw")
        if patches is None:
            return []
        if isinstance(patches, (list, tuple)):
            patches = torch.cat(list(patches))
        grids = torch.stack(list(grids)) if isinstance(grids, (list, tuple)) else grids
        encoder = self.backbone.vision_encoder
        return tuple(
            encoder(values, grid[None].int()).to(self._dtype)
            for values, grid in zip(patches.split(grids.prod(-1).tolist()), grids, strict=True)
        )

    def _embed(self, input_ids, images, is_image):
        embeddings = token_embedding(self.backbone)(input_ids)
        if images is None:
            return embeddings
        return _merge_multimodal_embeddings(embeddings, images, is_image)

    def get_mrope_input_positions(self, input_tokens, mm_features):
        images = []
        for feature in mm_features:
            offset = feature.mm_position.offset
            if feature.modality == "video":
                grid = feature.data["video_grid_thw"].data.tolist()
                images += frame_images(input_tokens, offset, grid, self._vision_start)
            else:
                images.append((offset, feature.data["image_grid_thw"].data.tolist()))
        return mrope_positions(len(input_tokens), images, self._merge_size)
