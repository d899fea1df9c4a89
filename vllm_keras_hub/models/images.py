"""What every model class of a preset served with images shares.

vLLM serves a `SupportsMultiModal` model in three calls per step: its
encoder cache asks `embed_multimodal` for each new image's embeddings,
`embed_input_ids` merges them into the step's token embeddings, and
`forward` runs the layers on those embeddings (with the step's token ids
too: `requires_raw_input_tokens`, for Gemma3n's and Gemma4's per-layer
inputs). `ImagesMixin` holds those calls; each family's class (its
`families/<name>/media.py`) gives its encoder and how its backbone places
the embeddings. The processor is `multimodal.py`'s.
"""

from vllm_keras_hub.backend import require_torch_backend

# Before anything below imports Keras (`layers.attention.attention` does): plain `vllm`
# in a fresh shell names no backend.
require_torch_backend()

import math

import numpy as np
import torch
from vllm.model_executor.models.utils import _merge_multimodal_embeddings
from vllm.multimodal import MULTIMODAL_REGISTRY

from vllm_keras_hub.export.audio_format import read_audio_format
from vllm_keras_hub.export.image_format import read_image_format
from vllm_keras_hub.export.video_format import read_video_format
from vllm_keras_hub.layers.attention import image_attention
from vllm_keras_hub.layers.attention.attention import token_embedding
from vllm_keras_hub.layers.attention.attention import transformer_layers
from vllm_keras_hub.models import staged_images
from vllm_keras_hub.models.audio import to_features
from vllm_keras_hub.models.multimodal import KerasHubDummyInputsBuilder
from vllm_keras_hub.models.multimodal import KerasHubMultiModalProcessor
from vllm_keras_hub.models.multimodal import KerasHubProcessingInfo

register = MULTIMODAL_REGISTRY.register_processor(
    KerasHubMultiModalProcessor,
    info=KerasHubProcessingInfo,
    dummy_inputs=KerasHubDummyInputsBuilder,
)


class ImagesMixin(staged_images.ImagesInStages):
    """A KerasHub preset's vision encoder (and audio and video encoders),
    served with images (vLLM's `SupportsMultiModal`).

    Listed before the causal class; a family's class gives its placeholders
    and its parts: `_encode` (the encoder on a batch of images), `_embed`
    (its input embeddings, the images in place), and where it has them
    `_check_backbone`, `_embed_clip`, `_embed_videos` and `_smallest_image`.
    """

    takes_embeddings = True
    requires_raw_input_tokens = True
    # What vLLM's chat renderer writes for an image part, where a chat
    # template takes string contents: the family's placeholder.
    placeholder = None
    family_name = None

    # The same for audio and video parts, where the family takes them.
    audio_placeholder = None
    video_placeholder = None
    # Whether each image's span runs to its prompt's end (a prefix LM's).
    prefix_lm = False

    @classmethod
    def get_placeholder_str(cls, modality, i):
        if modality.startswith("image"):
            return cls.placeholder
        if modality.startswith("audio") and cls.audio_placeholder:
            return cls.audio_placeholder
        if modality.startswith("video") and cls.video_placeholder:
            return cls.video_placeholder
        served = ["images"] + ["audio"] * bool(cls.audio_placeholder)
        served += ["video"] * bool(cls.video_placeholder)
        raise ValueError(
            f"KerasHub {cls.family_name} presets take {' and '.join(served)}, not {modality}."
        )

    def __init__(self, *, vllm_config, prefix=""):
        # Before the base class checks the engine settings against it.
        self.image = read_image_format(vllm_config.model_config.hf_config)
        self.audio = read_audio_format(vllm_config.model_config.hf_config)
        self.video = read_video_format(vllm_config.model_config.hf_config)
        super().__init__(vllm_config=vllm_config, prefix=prefix)

    def load_preset(self, lora_weights=None):
        super().load_preset(lora_weights)
        layers = transformer_layers(self.backbone)
        bidirectional = self.image["bidirectional"]
        for attention, index in zip(self.attention, self.attending_layers, strict=True):
            image_attention.mark(
                attention,
                bidirectional in ("all", "prefix")
                or (bidirectional == "sliding" and not layers[index].is_global_attention),
            )
        # Where images attend bidirectionally and clips come too, the image
        # attention must see the image (and video frame) tokens alone: clips
        # stay causal.
        self._image_token_ids = None
        if bidirectional and self.audio is not None:
            from keras_hub.src.tokenizers.tokenizer import Tokenizer

            tokenizer = self.preset.load(Tokenizer)
            tokens = [self.image["image_token"]]
            tokens += [self.video["video_token"]] if self.video else []
            self._image_token_ids = torch.tensor([tokenizer.token_to_id(t) for t in tokens])

    def _check_backbone(self, backbone):
        """Raises where the encoder would not fill an image's soft tokens
        as KerasHub fills them (Gemma3's always does)."""

    def _serving_step(self, stage):
        # The encoder too: layers that read their own weights (Gemma4's
        # clippable linears) keep them. Under pipeline parallelism the
        # first stage alone holds the encoders (`pipeline.py`).
        super()._serving_step(stage)
        if not stage.first:
            return
        with torch.inference_mode():
            self.embed_multimodal(**self._smallest_image())
            if self.audio is not None:
                self.embed_multimodal(**to_features(self.preset, [np.zeros(3200, "float32")]))

    def _smallest_image(self):
        """The cheapest input the encoder takes: an image of its size."""
        from PIL import Image

        from vllm_keras_hub.models.multimodal import to_pixels

        size = self.image["image_size"]
        return to_pixels(self.preset, [Image.new("RGB", (size, size))])

    def get_language_model(self):
        return self

    def embed_multimodal(self, **fields):
        """The preset's vision encoder on a batch of images or videos, or
        its audio encoder on a batch of clips (vLLM batches one modality a
        call).

        Args:
            **fields: `pixel_values` (and what else the family's
                converter gives), one row per image, from the preset's
                image converter (`multimodal.to_pixels`); `input_features`
                and `input_features_mask`, one per clip
                (`audio.to_features`); or the `video_*` fields, one per
                video (the family's `video.to_inputs`), for the family's
                `_embed_videos`.

        Returns:
            One `(tokens_per_image, hidden_size)` tensor per image,
            `(tokens_per_clip, hidden_size)` per clip, or `(frames *
            tokens_per_frame, hidden_size)` per video.
        """
        if self.stage is not None and not self.stage.first:
            return staged_images.no_embeddings(fields, self.config.hidden_size, self._dtype)
        if "input_features" in fields:
            return self._embed_clips(fields["input_features"], fields["input_features_mask"])
        if "video_pixel_values" in fields:
            return self._embed_videos(**fields)
        pixel_values = fields.get("pixel_values")
        if pixel_values is None:
            return []
        fields = {
            key: torch.stack(list(value)) if isinstance(value, (list, tuple)) else value
            for key, value in fields.items()
        }
        return tuple(self._encode(**fields).to(self._dtype))

    def _embed_clips(self, features, masks):
        return tuple(
            self._embed_clip(f, m).to(self._dtype) for f, m in zip(features, masks, strict=True)
        )

    def embed_input_ids(
        self,
        input_ids,
        multimodal_embeddings=None,
        *,
        is_multimodal=None,
        handle_oov_mm_token=False,
    ):
        """The family's input embeddings, the images' embeddings in place.

        Also tells the image attention which of the step's tokens are image
        tokens (vLLM calls this before every step of a multimodal model).
        """
        has_images = bool(multimodal_embeddings) and is_multimodal is not None
        is_image = is_multimodal
        if has_images and self._image_token_ids is not None:
            ids = self._image_token_ids.to(input_ids.device)
            is_image = is_multimodal & torch.isin(input_ids, ids)
        image_attention.set_step(
            is_image if has_images else None, spans_end_prompts=self.prefix_lm
        )
        if not has_images:
            return self._embed(input_ids, None, None)
        return self._embed(input_ids, multimodal_embeddings, is_multimodal)


def scaled_text_embeddings(backbone, input_ids, images, is_image):
    """Token embeddings scaled by sqrt(hidden), images merged in unscaled.

    As Gemma3's backbone and PaliGemma's task compute them: `x *
    ops.cast(ops.sqrt(hidden_dim), x.dtype)` on the text only.
    """
    embeddings = token_embedding(backbone)(input_ids)
    scale = torch.tensor(math.sqrt(backbone.hidden_dim), dtype=torch.float32)
    embeddings = embeddings * scale.to(embeddings.dtype)
    if images is None:
        return embeddings
    return _merge_multimodal_embeddings(embeddings, images, is_image)
