"""The vLLM model class of presets served with images (Gemma3 vision).

vLLM serves a `SupportsMultiModal` model in three calls per step: its
encoder cache asks `embed_multimodal` for each new image's embeddings,
`embed_input_ids` merges them into the step's token embeddings, and
`forward` runs the layers on those embeddings. Here the preset's own vision
encoder (`Gemma3VisionEncoder`: SigLIP, pooled and projected to the text
width) computes the embeddings, and they take the image tokens' places as
`Gemma3InterleaveEmbeddings` places them: the text embeddings scaled by
sqrt(hidden), the image embeddings not. The layers are
`KerasHubForCausalLM`'s, with each attention layer's image rows attended
bidirectionally (`layers/image_attention.py`). The processor is
`multimodal.py`'s.
"""

from vllm_keras_hub.backend import require_torch_backend

# Before anything below imports Keras (`layers.attention` does): plain `vllm`
# in a fresh shell names no backend.
require_torch_backend()

import math  # noqa: E402

import torch  # noqa: E402
from vllm.model_executor.models.interfaces import SupportsMultiModal  # noqa: E402
from vllm.model_executor.models.utils import _merge_multimodal_embeddings  # noqa: E402
from vllm.multimodal import MULTIMODAL_REGISTRY  # noqa: E402

from vllm_keras_hub.config import check_image_settings  # noqa: E402
from vllm_keras_hub.layers import image_attention  # noqa: E402
from vllm_keras_hub.layers.attention import token_embedding  # noqa: E402
from vllm_keras_hub.model import KerasHubForCausalLM  # noqa: E402
from vllm_keras_hub.multimodal import KerasHubDummyInputsBuilder  # noqa: E402
from vllm_keras_hub.multimodal import KerasHubMultiModalProcessor  # noqa: E402
from vllm_keras_hub.multimodal import KerasHubProcessingInfo  # noqa: E402


@MULTIMODAL_REGISTRY.register_processor(
    KerasHubMultiModalProcessor,
    info=KerasHubProcessingInfo,
    dummy_inputs=KerasHubDummyInputsBuilder,
)
class KerasHubVisionForCausalLM(KerasHubForCausalLM, SupportsMultiModal):
    """A KerasHub Gemma3 preset with a vision encoder, served with images.

    Args:
        vllm_config: The engine's `VllmConfig`.
        prefix: Module prefix vLLM gives the model.
    """

    takes_embeddings = True

    @classmethod
    def get_placeholder_str(cls, modality, i):
        # Where vLLM's chat renderer puts an image part: Gemma3's marker.
        if modality.startswith("image"):
            return "<start_of_image>"
        raise ValueError(
            f"KerasHub Gemma3 presets take images, not {modality}: send "
            "image parts only."
        )

    def __init__(self, *, vllm_config, prefix=""):
        scheduler = vllm_config.scheduler_config
        mm_config = vllm_config.model_config.get_multimodal_config()
        check_image_settings(
            mm_config.get_limit_per_prompt("image"),
            scheduler.enable_chunked_prefill,
            not scheduler.disable_chunked_mm_input,
            vllm_config.parallel_config.pipeline_parallel_size,
            scheduler.scheduler_cls,
        )
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.bidirectional_images = True

    def get_language_model(self):
        return self

    def embed_multimodal(self, pixel_values=None, **kwargs):
        """The preset's vision encoder on a batch of images.

        Args:
            pixel_values: `(num_images, size, size, 3)` from the preset's
                image converter (`multimodal.to_pixels`).

        Returns:
            One `(tokens_per_image, hidden_size)` tensor per image.
        """
        if pixel_values is None:
            return []
        encoder = self.backbone.vision_encoder
        if isinstance(pixel_values, (list, tuple)):
            pixel_values = torch.stack(list(pixel_values))
        embeddings = encoder(pixel_values[:, None])
        return tuple(embeddings.to(self._dtype))

    def embed_input_ids(
        self,
        input_ids,
        multimodal_embeddings=None,
        *,
        is_multimodal=None,
        handle_oov_mm_token=False,
    ):
        """Scaled token embeddings with the images' embeddings in place.

        Also tells the image attention which of the step's tokens are image
        tokens (vLLM calls this before every step of a multimodal model).
        """
        has_images = bool(multimodal_embeddings) and is_multimodal is not None
        image_attention.set_step(is_multimodal if has_images else None)
        embeddings = token_embedding(self.backbone)(input_ids)
        # `Gemma3Backbone`: `x * ops.cast(ops.sqrt(hidden_dim), x.dtype)`.
        scale = torch.tensor(math.sqrt(self.backbone.hidden_dim), dtype=torch.float32)
        embeddings = embeddings * scale.to(embeddings.dtype)
        if has_images:
            embeddings = _merge_multimodal_embeddings(
                embeddings, multimodal_embeddings, is_multimodal
            )
        return embeddings
