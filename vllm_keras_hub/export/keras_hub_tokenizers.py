"""A preset's own KerasHub tokenizer under vLLM, for tokenizers that do not export.

vLLM loads the class of a tokenizer mode by name, in its front-end process,
where plain `vllm serve` has set no Keras backend: importing keras-hub there
would pick TensorFlow, which is not installed. So both modes load from here,
after `default_to_torch`:
- `keras_hub`: keras-hub's own `KerasHubTokenizer` adapter, which adds only
  the start token, as `generate()` does;
- `keras_hub_embedder`: a pooling task's (`tasks/`: a text embedder's or
  classifier's; BERT's WordPiece, XLM-RoBERTa's SentencePiece unigram),
  packing each text between its start token (Qwen3's embedders have none)
  and its end token, as its preprocessor does; and a cross-encoder's text
  pairs with its preprocessor's own packer.
"""

import json
import os

from transformers import BatchEncoding

from vllm_keras_hub import backend
from vllm_keras_hub import tasks

backend.default_to_torch()

import keras_hub  # noqa: E402
from keras_hub.src.vllm.tokenizer import KerasHubTokenizer  # noqa: E402


class KerasHubEmbedderTokenizer(KerasHubTokenizer):
    """`KerasHubTokenizer`, packing each text as a pooling task's preprocessor.

    Args:
        preset: The preset whose tokenizer to load.
        add_start_token: Whether texts start with the start token.
        pairs: Whether it packs text pairs, as vLLM's scoring asks of a
            cross-encoder: with the packer of the preset's
            `TextClassifierPreprocessor`, whose tokenizer it then uses.
        segment_ids: Whether a pair's segment ids are returned, as
            `token_type_ids`.
    """

    def __init__(self, preset, add_start_token=True, pairs=False, segment_ids=False):
        self.packer = None
        if pairs:
            preprocessor = keras_hub.models.TextClassifierPreprocessor.from_preset(preset)
            preprocessor.build(None)
            self.packer = preprocessor.packer
            super().__init__(preprocessor.tokenizer)
            self.preset_name = preset
        else:
            super().__init__(preset)
        self.add_start_token = add_start_token and self.bos_token_id is not None
        self.segment_ids = segment_ids

    @classmethod
    def from_pretrained(cls, path_or_repo_id, *args, **kwargs):
        """Loads the tokenizer of the model folder vLLM opens."""
        with open(os.path.join(str(path_or_repo_id), "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        _, fields = tasks.of_config(config)
        return cls(
            config["keras_hub_preset"],
            add_start_token=fields["start_token"],
            pairs=fields.get("pairs", False),
            segment_ids=fields.get("segment_ids", False),
        )

    @property
    def num_special_tokens_to_add(self):
        return int(self.add_start_token) + 1

    def encode(self, text, truncation=None, max_length=None, add_special_tokens=True):
        """Token ids of `text`, between the start and end tokens.

        Truncation keeps both special tokens and cuts the text's own tokens
        on `truncation_side`, which vLLM's renderer sets.
        """
        ids = super().encode(text, add_special_tokens=False)
        if not add_special_tokens:
            return ids if not truncation or max_length is None else self._cut(ids, max_length)
        start = [int(self.bos_token_id)] if self.add_start_token else []
        end = [int(self.eos_token_id)]
        if truncation and max_length is not None:
            ids = self._cut(ids, max(0, max_length - len(start) - len(end)))
        return start + ids + end

    def __call__(
        self, text, text_pair=None, add_special_tokens=True, truncation=False,
        max_length=None, **kwargs,
    ):  # fmt: skip
        """HF-style call; a pair is packed as the preset's preprocessor packs it.

        Truncation cuts a pair as the packer does (`round_robin`), or only
        its second text for vLLM's `only_second` (`max_tokens_per_doc`).
        """
        if kwargs:
            raise ValueError(
                f"A KerasHub tokenizer takes no {sorted(kwargs)} (it returns token "
                "ids only); leave out the request option that asks for them."
            )
        if text_pair is None:
            return super().__call__(
                text, add_special_tokens=add_special_tokens, truncation=truncation,
                max_length=max_length,
            )  # fmt: skip
        if self.packer is None:
            raise ValueError(
                f"'{self.preset_name}' takes single texts: only a classifier with one "
                "output (a cross-encoder) scores text pairs."
            )
        if not add_special_tokens:
            raise ValueError("A text pair is packed with its special tokens.")
        first = super().encode(text, add_special_tokens=False)
        second = super().encode(text_pair, add_special_tokens=False)
        packer = self.packer
        length = len(first) + len(second) + sum(
            len(value) for value in (packer.start_value, packer.sep_value, packer.end_value)
        )
        if truncation and max_length is not None and length > max_length:
            if truncation == "only_second":
                second = second[: max(0, len(second) - (length - max_length))]
            length = max_length
        token_ids, segment_ids = packer((first, second), sequence_length=length)
        encoding = {"input_ids": [int(i) for i in token_ids]}
        encoding["attention_mask"] = [1] * len(encoding["input_ids"])
        if self.segment_ids:
            encoding["token_type_ids"] = [int(i) for i in segment_ids]
        return BatchEncoding(encoding)

    def _cut(self, ids, length):
        return ids[-length:] if self.truncation_side == "left" and length else ids[:length]
