"""The vLLM model class of KerasHub `CausalLM` presets, one line of parts.

The base (`base.py`) holds the preset's backbone and the vLLM layers its
routed layers hand work to, and runs each step; `CausalMixin` adds the
logits; `mixins.py` adds LoRA per request and EAGLE-3 taps. Hybrid presets
are served by `hybrid.py`'s class, which tells vLLM their state's shapes.
"""

from vllm_keras_hub.backend import require_torch_backend

# Before anything below imports Keras: a clear error for another backend.
require_torch_backend()

import torch
from vllm.model_executor.models.interfaces import SupportsEagle3
from vllm.model_executor.models.interfaces import SupportsLoRA
from vllm.model_executor.models.interfaces import SupportsPP

from vllm_keras_hub.layers.attention import attention as attention_layers
from vllm_keras_hub.models.base import compiled
from vllm_keras_hub.models.base import KerasHubBase
from vllm_keras_hub.models.mixins import Eagle3TargetMixin
from vllm_keras_hub.models.mixins import LoRAMixin


class CausalMixin:
    """Logits of the last stage's hidden states, as the preset's task has them."""

    def compute_logits(self, hidden_states):
        """Logits through the backbone's own (possibly tied) output embedding.

        KerasHub's `ReversibleEmbedding` also applies a family's final logit
        soft cap (Gemma2); a task-level one (Gemma4's `final_logit_cap`)
        follows. Under tensor parallelism the projection is vLLM's
        vocabulary-parallel head, holding the same weights.
        """
        if self.lm_head is not None:
            logits = self.logits_processor(self.lm_head, hidden_states)
            if logits is None:
                return None  # another rank samples
        else:
            embedding = attention_layers.token_embedding(self.backbone)
            logits = embedding(hidden_states, reverse=True)
        cap = self._final_logit_cap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


@compiled
class KerasHubForCausalLM(
    CausalMixin, LoRAMixin, Eagle3TargetMixin, KerasHubBase, SupportsLoRA, SupportsPP, SupportsEagle3
):
    """A KerasHub `CausalLM` preset served by vLLM's model runner.

    The base's layers and step (`base.py`), its logits, with LoRA per request
    and EAGLE-3 taps (`mixins.py`).

    Args:
        vllm_config: The engine's `VllmConfig`; `model_config.hf_config` is a
            `KerasHubConfig`.
        prefix: Module prefix vLLM gives the model.
    """
