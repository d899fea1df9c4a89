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
  and its end token, as its preprocessor does.
"""

import json
import os

from vllm_keras_hub import backend
from vllm_keras_hub import tasks

backend.default_to_torch()

from keras_hub.src.vllm.tokenizer import KerasHubTokenizer  # noqa: E402


class KerasHubEmbedderTokenizer(KerasHubTokenizer):
    """`KerasHubTokenizer`, packing each text as a pooling task's preprocessor.

    Args:
        preset: The preset whose tokenizer to load.
        add_start_token: Whether texts start with the start token.
    """

    def __init__(self, preset, add_start_token=True):
        super().__init__(preset)
        self.add_start_token = add_start_token and self.bos_token_id is not None

    @classmethod
    def from_pretrained(cls, path_or_repo_id, *args, **kwargs):
        """Loads the tokenizer of the model folder vLLM opens."""
        with open(os.path.join(str(path_or_repo_id), "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        _, fields = tasks.of_config(config)
        return cls(config["keras_hub_preset"], add_start_token=fields["start_token"])

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

    def _cut(self, ids, length):
        return ids[-length:] if self.truncation_side == "left" and length else ids[:length]
