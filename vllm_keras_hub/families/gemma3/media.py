"""The vLLM model class of Gemma3 presets served with images (`gemma3_4b`
and up), on `models/images.py`'s `ImagesMixin`.

Its SigLIP encoder's pooled, projected embeddings take the image tokens'
places, as `Gemma3InterleaveEmbeddings` places them: the text embeddings
scaled by sqrt(hidden), the images not. Every layer attends bidirectionally
within each image (`layers/attention/image_attention.py`).
"""

from vllm.model_executor.models.interfaces import SupportsMultiModal

from vllm_keras_hub.models.causal import KerasHubForCausalLM
from vllm_keras_hub.models.images import ImagesMixin
from vllm_keras_hub.models.images import register
from vllm_keras_hub.models.images import scaled_text_embeddings


@register
class KerasHubGemma3VisionForCausalLM(ImagesMixin, KerasHubForCausalLM, SupportsMultiModal):
    """A KerasHub Gemma3 preset with a vision encoder (`gemma3_4b` and up)."""

    placeholder = "<start_of_image>"
    family_name = "Gemma3"

    def _encode(self, pixel_values):
        return self.backbone.vision_encoder(pixel_values[:, None])

    def _embed(self, input_ids, images, is_image):
        return scaled_text_embeddings(self.backbone, input_ids, images, is_image)
