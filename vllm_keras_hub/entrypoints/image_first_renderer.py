"""vLLM's renderer for a preset whose every prompt starts with its image.

`PaliGemmaCausalLM` generates from an image and a prompt, never from text
alone (its `generate()` takes `images`). vLLM hands a prompt without
images straight to the engine, past the model's multimodal processor, so
the renderer is where such a request is refused: a 400, and the server
keeps serving. vLLM picks a renderer by tokenizer mode; the image-first
modes (`hf_config.IMAGE_FIRST_TOKENIZER_MODES`) use the tokenizer the
folder's own mode would (`plugin.py` registers them).
"""

from vllm.exceptions import VLLMValidationError
from vllm.renderers.hf import HfRenderer


def check_has_image(prompt):
    """Raises for a prompt without an image.

    Args:
        prompt: vLLM's `TokensPrompt`.
    """
    images = (prompt.get("multi_modal_data") or {}).get("image")
    if images is None or (isinstance(images, (list, tuple)) and not images):
        raise VLLMValidationError(
            "This PaliGemma preset generates from an image and a prompt, as "
            "KerasHub's PaliGemmaCausalLM does: send exactly one image with "
            "the prompt.",
            parameter="multi_modal_data",
        )


class ImageFirstRenderer(HfRenderer):
    """vLLM's `HfRenderer`, refusing a prompt without an image."""

    _warming_up = False

    def warmup(self, chat_params):
        # vLLM warms the chat template up on a text-only message, rendered
        # for no engine.
        self._warming_up = True
        try:
            super().warmup(chat_params)
        finally:
            self._warming_up = False

    def _process_tokens(self, prompt, *, skip_mm_cache=False):
        if not self._warming_up:
            check_has_image(prompt)
        return super()._process_tokens(prompt, skip_mm_cache=skip_mm_cache)

    async def _process_tokens_async(self, prompt, *, skip_mm_cache=False):
        check_has_image(prompt)
        return await super()._process_tokens_async(prompt, skip_mm_cache=skip_mm_cache)
