"""PaliGemma: a prefix LM, served with the image each prompt starts with.

`PaliGemmaCausalLM` generates from an image and a prompt. The ViT's
embeddings (one per patch) come first, then the prompt's token embeddings
(the start token first, scaled by sqrt(hidden)). Every layer attends over
that whole prefix, image and text, both ways (`PaliGemmaDecoderBlock`: the
prefill mask is the padding mask or causal); the tokens it generates attend
causally.

In vLLM, a request's prefix is its one image item:
- the processor puts the image's rows before the prompt, and the item's
  placeholder spans the whole prompt, embedded by `embed_multimodal` as
  KerasHub concatenates it (the ViT's output, then the prompt's own token
  embeddings);
- the scheduler computes the prefix in one step (`disable_chunked_mm_input`,
  `scheduler.ImageScheduler`), and `layers/attention/image_attention.py` attends its
  rows again, bidirectionally;
- the item's hash covers the prompt's ids as well as the image. A prefix's
  KV depends on all of it, so a prefix-cache hit (and an encoder-cache hit)
  needs the same image and the same prompt;
- a prompt without an image is refused by the renderer
  (`entrypoints/image_first_renderer.py`), as `generate()` takes none.
"""

import dataclasses

import torch
from vllm.model_executor.models.interfaces import SupportsMultiModal
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.processing.processor import PlaceholderFeaturesInfo
from vllm.multimodal.processing.processor import PromptIndexTargets
from vllm.multimodal.processing.processor import PromptInsertion

from vllm_keras_hub.models.causal import KerasHubForCausalLM
from vllm_keras_hub.models.images import ImagesMixin
from vllm_keras_hub.models.images import scaled_text_embeddings
from vllm_keras_hub.models.multimodal import KerasHubDummyInputsBuilder
from vllm_keras_hub.models.multimodal import KerasHubMultiModalProcessor
from vllm_keras_hub.models.multimodal import KerasHubProcessingInfo
from vllm_keras_hub.models.multimodal import to_pixels

# The processor's kwarg, and the item's field, carrying the prompt's ids.
PREFIX_IDS = "keras_hub_prefix_ids"


class PrefixProcessingInfo(KerasHubProcessingInfo):
    """One image per prompt; its item spans the prompt (up to the context)."""

    def get_supported_mm_limits(self):
        return {"image": 1}

    def get_mm_max_tokens_per_item(self, seq_len, mm_counts):
        return {"image": seq_len}


class PrefixDummyInputsBuilder(KerasHubDummyInputsBuilder):
    """Profiling inputs: an image of the encoder's size, and no text."""

    def get_dummy_text(self, mm_counts):
        return ""


class PrefixProcessor(KerasHubMultiModalProcessor):
    """The image first, and one item over the image and the prompt."""

    def apply(self, inputs, timing_ctx):
        images = inputs.mm_data_items.get_all_counts().get("image", 0)
        if images != 1:
            raise ValueError(
                f"A PaliGemma prompt takes exactly one image, as KerasHub's "
                f"PaliGemmaCausalLM does; this one has {images}."
            )
        # The prompt's ids travel with the image: they are embedded with it,
        # and its hash covers them.
        kwargs = {**inputs.hf_processor_mm_kwargs, PREFIX_IDS: tuple(inputs.prompt)}
        inputs = dataclasses.replace(inputs, hf_processor_mm_kwargs=kwargs)
        return super().apply(inputs, timing_ctx)

    def _call_hf_processor(self, hf_data, hf_kwargs):
        from transformers.feature_extraction_utils import BatchFeature

        preset = self.info.get_hf_config().keras_hub_preset
        outputs = to_pixels(preset, hf_data["images"])
        outputs[PREFIX_IDS] = torch.tensor([hf_kwargs[PREFIX_IDS]], dtype=torch.long)
        return BatchFeature(outputs)

    def _get_mm_fields_config(self, hf_inputs, hf_processor_mm_kwargs):
        from vllm.multimodal.inputs import MultiModalFieldConfig

        return {key: MultiModalFieldConfig.batched("image") for key in hf_inputs}

    def _image_rows(self):
        image = self.info.image
        image_id = self.info.get_tokenizer().get_vocab()[image["image_token"]]
        return [image_id] * image["tokens_per_image"]

    def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
        return [PromptInsertion("image", PromptIndexTargets.start(), self._image_rows())]

    def _apply_prompt_updates(self, token_ids, mm_prompt_updates):
        new_ids = self._image_rows() + list(token_ids)
        prefix = PlaceholderFeaturesInfo(
            modality="image", item_idx=0, start_idx=0, tokens=new_ids, is_embed=None
        )
        return new_ids, {"image": [prefix]}


@MULTIMODAL_REGISTRY.register_processor(
    PrefixProcessor, info=PrefixProcessingInfo, dummy_inputs=PrefixDummyInputsBuilder
)
class KerasHubPaliGemmaForCausalLM(ImagesMixin, KerasHubForCausalLM, SupportsMultiModal):
    """A KerasHub PaliGemma preset (its ViT and Gemma decoder)."""

    family_name = "PaliGemma"
    prefix_lm = True

    @classmethod
    def get_placeholder_str(cls, modality, i):
        # The processor puts the image first; a chat prompt writes nothing.
        if modality.startswith("image"):
            return None
        return super().get_placeholder_str(modality, i)

    def _smallest_image(self):
        fields = super()._smallest_image()
        start = torch.tensor([[self.vllm_config.model_config.hf_config.bos_token_id]])
        return {**fields, PREFIX_IDS: start}

    def embed_multimodal(self, **fields):
        """Each prompt's prefix: its image's ViT embeddings, then its
        tokens' embeddings, as `PaliGemmaCausalLM` concatenates them.

        Args:
            **fields: `pixel_values`, one image per prompt
                (`multimodal.to_pixels`), and each prompt's token ids.

        Returns:
            One `(tokens_per_image + prompt_length, hidden_size)` tensor per
            prompt.
        """
        pixel_values = fields.get("pixel_values")
        if pixel_values is None:
            return []
        if isinstance(pixel_values, (list, tuple)):
            pixel_values = torch.stack(list(pixel_values))
        images = self.backbone.vit_encoder(pixel_values)
        return tuple(
            torch.cat([image, self._embed(ids.reshape(-1), None, None)]).to(self._dtype)
            for image, ids in zip(images, fields[PREFIX_IDS], strict=True)
        )

    def _embed(self, input_ids, images, is_image):
        return scaled_text_embeddings(self.backbone, input_ids, images, is_image)
