"""The encoder's text, as vLLM 0.32 takes an encoder-decoder model's encoder input.

vLLM keeps an encoder prompt of token ids only where it came with
multimodal data (`vllm/inputs/engine.py`, `build_enc_dec_input`): a text-only
encoder prompt is emptied. So the encoder's text is an item of a `"text"`
modality, as vLLM's BART plugin takes it: packed here as the preset's own
preprocessor packs it (BART: `[start] tokens [end]`; the family's part
says, `fields.py`), run once by the model's
`embed_multimodal`, and held by vLLM as an encoder input of that many
tokens (the cross-attention's keys and values). The decoder prompt is
vLLM's prompt, after the decoder start token vLLM puts first.
"""

import torch
from transformers.feature_extraction_utils import BatchFeature
from vllm.multimodal.inputs import MultiModalFieldConfig
from vllm.multimodal.parse import MultiModalDataParser
from vllm.multimodal.parse import ProcessorBatchItems
from vllm.multimodal.processing import BaseProcessingInfo
from vllm.multimodal.processing import EncDecMultiModalProcessor
from vllm.multimodal.processing import PromptReplacement
from vllm.multimodal.processing.dummy_inputs import BaseDummyInputsBuilder

MODALITY = "text"
# The encoder prompt vLLM is given before the text's tokens replace it.
_PLACEHOLDER = 0


class EncoderTextItems(ProcessorBatchItems):
    """Encoder texts: strings, or token ids without the start and end tokens."""

    def __init__(self, data):
        super().__init__(data, MODALITY)


class EncoderTextParser(MultiModalDataParser):
    def _parse_text(self, data):
        if isinstance(data, str) or _is_ids(data):
            data = [data]
        if isinstance(data, list) and not data:
            raise ValueError("The encoder text is empty.")
        if not isinstance(data, list) or not all(isinstance(x, str) or _is_ids(x) for x in data):
            raise ValueError(
                "An encoder-decoder preset's encoder input is a text, or a list "
                f"of token ids; got {type(data).__name__}."
            )
        return EncoderTextItems(data)

    def _get_subparsers(self):
        return {MODALITY: self._parse_text}


def _is_ids(value):
    return isinstance(value, list) and bool(value) and all(isinstance(x, int) for x in value)


class Seq2SeqProcessingInfo(BaseProcessingInfo):
    """One encoder text a request, up to the preset's encoder length."""

    @property
    def encoder(self):
        return self.get_hf_config().keras_hub_seq2seq

    def get_data_parser(self):
        return EncoderTextParser()

    def get_supported_mm_limits(self):
        return {MODALITY: 1}

    def get_mm_max_tokens_per_item(self, seq_len, mm_counts):
        return {MODALITY: self.encoder["max_encoder_tokens"]}

    def encoder_ids(self, item):
        """The packed token ids of one encoder text.

        Raises:
            ValueError: it is empty, or longer than the encoder takes.
        """
        if isinstance(item, str):
            if not item:
                raise ValueError("The encoder text is empty.")
            item = self.get_tokenizer().encode(item, add_special_tokens=False)
        encoder = self.encoder
        ids = [
            *([encoder["start_token_id"]] if encoder["encoder_start"] else []),
            *item,
            *([encoder["end_token_id"]] if encoder["encoder_end"] else []),
        ]
        limit = encoder["max_encoder_tokens"]
        if len(ids) > limit:
            raise ValueError(
                f"The encoder text is {len(ids)} tokens as the preprocessor packs "
                f"it, over the {limit} this preset's encoder takes."
            )
        return ids


class Seq2SeqDummyInputsBuilder(BaseDummyInputsBuilder[Seq2SeqProcessingInfo]):
    """The longest encoder text, for vLLM's profiling run."""

    def get_dummy_text(self, mm_counts):
        return ""

    def get_dummy_mm_data(self, seq_len, mm_counts, mm_options=None):
        if not mm_counts.get(MODALITY):
            return {}
        encoder = self.info.encoder
        packed = int(encoder["encoder_start"]) + int(encoder["encoder_end"])
        return {MODALITY: [[encoder["end_token_id"]] * (encoder["max_encoder_tokens"] - packed)]}


class Seq2SeqProcessor(EncDecMultiModalProcessor[Seq2SeqProcessingInfo]):
    """Packs the encoder text; its tokens stand in the encoder prompt."""

    def create_encoder_prompt(self, prompt, mm_items):
        return [_PLACEHOLDER]

    def create_decoder_prompt(self, prompt, mm_items):
        # Only where a request gives no decoder prompt (`renderer.py`): the
        # preprocessor's empty one, after vLLM's decoder start token.
        return list(self.info.encoder["decoder_prompt"])

    def _call_hf_processor(self, hf_data, hf_kwargs):
        ids = [
            torch.tensor(self.info.encoder_ids(item), dtype=torch.int64)
            for item in hf_data.get(f"{MODALITY}s", ())
        ]
        return BatchFeature({"encoder_token_ids": ids})

    def _get_mm_fields_config(self, hf_inputs, hf_processor_mm_kwargs):
        return {"encoder_token_ids": MultiModalFieldConfig.batched(MODALITY)}

    def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
        def replacement(index):
            count = len(out_mm_kwargs[MODALITY][index]["encoder_token_ids"].data)
            return [_PLACEHOLDER] * count

        return [PromptReplacement(modality=MODALITY, target=[_PLACEHOLDER], replacement=replacement)]
