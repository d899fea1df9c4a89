"""vLLM's renderer for speech-to-text presets: every request brings a clip.

vLLM takes a prompt without multimodal data as an encoder prompt of text,
which it empties (`build_enc_dec_input`), so a request without a clip
would reach the decoder with nothing to transcribe. It is refused here,
naming what to send.
"""

from vllm.renderers.hf import HfRenderer

from vllm_keras_hub.tasks.audio_to_text import MODALITY


class AudioToTextRenderer(HfRenderer):
    """vLLM's `HfRenderer`, refusing encoder prompts without a clip."""

    @staticmethod
    def _check(prompt):
        if not (prompt["encoder_prompt"].get("multi_modal_data") or {}).get(MODALITY):
            raise ValueError(
                "A speech-to-text preset transcribes a clip: send it to "
                "/v1/audio/transcriptions, or as the prompt's "
                "multi_modal_data {'audio': (samples, sampling_rate)}."
            )
        return prompt

    def _process_enc_dec(self, prompt, *, skip_mm_cache=False):
        return super()._process_enc_dec(self._check(prompt), skip_mm_cache=skip_mm_cache)

    async def _process_enc_dec_async(self, prompt, *, skip_mm_cache=False):
        return await super()._process_enc_dec_async(
            self._check(prompt), skip_mm_cache=skip_mm_cache
        )
