"""The vLLM model classes of presets served with images (and Gemma3n's and
Gemma4's audio), one per family.

vLLM serves a `SupportsMultiModal` model in three calls per step: its
encoder cache asks `embed_multimodal` for each new image's embeddings,
`embed_input_ids` merges them into the step's token embeddings, and
`forward` runs the layers on those embeddings (with the step's token ids
too: `requires_raw_input_tokens`, for Gemma3n's and Gemma4's per-layer
inputs). Each family's own vision encoder computes the embeddings, and they
take the image tokens' places as its backbone places them:
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
The layers are `KerasHubForCausalLM`'s; the processor is `multimodal.py`'s.
"""

from vllm_keras_hub.backend import require_torch_backend

# Before anything below imports Keras (`layers.attention` does): plain `vllm`
# in a fresh shell names no backend.
require_torch_backend()

import math  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.model_executor.models.interfaces import SupportsMultiModal  # noqa: E402
from vllm.model_executor.models.utils import _merge_multimodal_embeddings  # noqa: E402
from vllm.multimodal import MULTIMODAL_REGISTRY  # noqa: E402

from vllm_keras_hub.export.audio_format import read_audio_format  # noqa: E402
from vllm_keras_hub.export.image_format import read_image_format  # noqa: E402
from vllm_keras_hub.export.video_format import read_video_format  # noqa: E402
from vllm_keras_hub.layers import image_attention  # noqa: E402
from vllm_keras_hub.layers.attention import token_embedding  # noqa: E402
from vllm_keras_hub.layers.attention import transformer_layers  # noqa: E402
from vllm_keras_hub.models.audio import Gemma3nTranscription  # noqa: E402
from vllm_keras_hub.models.audio import embed_clip  # noqa: E402
from vllm_keras_hub.models.audio import embed_gemma4_clip  # noqa: E402
from vllm_keras_hub.models.audio import to_features  # noqa: E402
from vllm_keras_hub.models.causal import KerasHubForCausalLM  # noqa: E402
from vllm_keras_hub.models.multimodal import KerasHubDummyInputsBuilder  # noqa: E402
from vllm_keras_hub.models.multimodal import KerasHubMultiModalProcessor  # noqa: E402
from vllm_keras_hub.models.multimodal import KerasHubProcessingInfo  # noqa: E402
from vllm_keras_hub.models import staged_images  # noqa: E402
from vllm_keras_hub.models.probe import RouteError  # noqa: E402
from vllm_keras_hub.models.video import embed_video  # noqa: E402

_register = MULTIMODAL_REGISTRY.register_processor(
    KerasHubMultiModalProcessor,
    info=KerasHubProcessingInfo,
    dummy_inputs=KerasHubDummyInputsBuilder,
)


class _KerasHubImages(staged_images.ImagesInStages, KerasHubForCausalLM, SupportsMultiModal):
    """A KerasHub preset with a vision encoder, served with images.

    Args:
        vllm_config: The engine's `VllmConfig`.
        prefix: Module prefix vLLM gives the model.
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
    # Whether each image's span runs to its prompt's end (`prefix_lm.py`).
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
            **fields: `pixel_values` (and Gemma4's `pixel_position_ids`),
                one row per image, from the preset's image converter
                (`multimodal.to_pixels`); `input_features` and
                `input_features_mask`, one per clip (`audio.to_features`);
                or Gemma4's `video_*` fields, one per video
                (`video.to_frames`).

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

    def _embed_videos(self, video_pixel_values, video_pixel_position_ids, video_frame_tokens, **_):
        return tuple(
            embed_video(self.backbone, values, positions, count).to(self._dtype)
            for values, positions, count in zip(
                video_pixel_values, video_pixel_position_ids, video_frame_tokens, strict=True
            )
        )

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


@_register
class KerasHubVisionForCausalLM(_KerasHubImages):
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


@_register
class KerasHubGemma3nVisionForCausalLM(_KerasHubImages, Gemma3nTranscription):
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


@_register
class KerasHubGemma4VisionForCausalLM(_KerasHubImages):
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
