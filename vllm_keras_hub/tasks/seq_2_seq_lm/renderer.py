"""vLLM's renderer for encoder-decoder presets: a plain prompt is the encoder's text.

`Seq2SeqLM.generate("text")` encodes the text and decodes from the empty
decoder prompt. vLLM takes a plain prompt of an encoder-decoder model as
its encoder prompt, which it keeps only with multimodal data
(`processor.py`), so a plain prompt (`LLM.generate("text")`, or the
`prompt` of `/v1/completions`) would reach the decoder with no encoder
input. Here it becomes the encoder's text item, and the decoder prompt is
left to the processor (the start token, after vLLM's decoder start), as
`generate()` has it. A prompt that names its encoder text itself is
served as it is.
"""

from vllm.renderers.hf import HfRenderer

from vllm_keras_hub.tasks.seq_2_seq_lm import FIELD
from vllm_keras_hub.tasks.seq_2_seq_lm.processor import MODALITY


class Seq2SeqRenderer(HfRenderer):
    """vLLM's `HfRenderer`, with plain prompts as encoder texts."""

    def _as_encoder_text(self, prompt):
        encoder = prompt["encoder_prompt"]
        if encoder.get("multi_modal_data"):
            return prompt
        ids = list(encoder.get("prompt_token_ids") or ())
        # The exported tokenizer starts every text with the start token;
        # the processor packs the encoder's own start and end tokens.
        start = getattr(self.model_config.hf_config, FIELD)["start_token_id"]
        if ids[:1] == [start]:
            ids = ids[1:]
        if not ids:
            # It would reach the decoder with no encoder input at all.
            raise ValueError("The encoder text is empty.")
        encoder = {"prompt_token_ids": [], "multi_modal_data": {MODALITY: ids}}
        return {**prompt, "encoder_prompt": encoder}

    def _process_enc_dec(self, prompt, *, skip_mm_cache=False):
        return super()._process_enc_dec(self._as_encoder_text(prompt), skip_mm_cache=skip_mm_cache)

    async def _process_enc_dec_async(self, prompt, *, skip_mm_cache=False):
        return await super()._process_enc_dec_async(
            self._as_encoder_text(prompt), skip_mm_cache=skip_mm_cache
        )
