"""The vLLM model class that runs a KerasHub preset's own layers.

`KerasHubForCausalLM` holds the preset's KerasHub backbone (Keras on torch, so
its layers are `torch.nn.Module`s), one vLLM `Attention` per attending
transformer layer, one vLLM state layer per Gated DeltaNet layer and one vLLM
`FusedMoE` per MoE block. Each forward step publishes keras-hub's serving
context: every routed KerasHub attention layer projects q/k/v, applies its
own position encoding at vLLM's per-token positions and hands q/k/v to
keras-hub's paged-attention bridge, which calls the layer's vLLM `Attention`
(`layers/attention.py`); every Gated DeltaNet layer hands its tokens to its
state layer, over vLLM's state cache (`layers/state_routes.py`); every MoE
block routes with its own router and hands its experts to its `FusedMoE`
(`layers/moe.py`). Everything else stays KerasHub. Hybrid presets are served
by the `hybrid.py` subclass, which tells vLLM their state's shapes.

The backbone's layers call their own `call()` directly
(`compile/direct_calls.py`), so vLLM's default mode can compile the whole
step with torch.compile, as it does for its own models. On the CPU their
Dense/EinsumDense matmuls run on the weights prepacked for vLLM's CPU GEMM,
as vLLM's own linear layers do (`layers/linear.py`).
"""

from vllm_keras_hub.backend import require_torch_backend

# Before anything below imports Keras: a clear error for another backend.
require_torch_backend()

import torch
from keras_hub.src.vllm.context import vllm_context_scope
from vllm.compilation.decorators import support_torch_compile
from vllm.model_executor.models.interfaces import SupportsEagle3
from vllm.model_executor.models.interfaces import SupportsLoRA
from vllm.model_executor.models.interfaces import SupportsPP
from vllm.sequence import IntermediateTensors

from vllm_keras_hub.layers import attention as attention_layers
from vllm_keras_hub.layers import image_attention
from vllm_keras_hub.layers import step
from vllm_keras_hub.models import probe
from vllm_keras_hub.models.base import KerasHubBase
from vllm_keras_hub.models.mixins import Eagle3TargetMixin
from vllm_keras_hub.models.mixins import LoRAMixin


# vLLM compiles `forward` (unless enforce_eager) with dynamic token counts.
@support_torch_compile(
    dynamic_arg_dims={
        "input_ids": 0,
        "positions": -1,
        "intermediate_tensors": 0,
        "inputs_embeds": 0,
    }
)
class KerasHubForCausalLM(
    LoRAMixin, Eagle3TargetMixin, KerasHubBase, SupportsLoRA, SupportsPP, SupportsEagle3
):
    """A KerasHub `CausalLM` preset served by vLLM's model runner.

    The base's layers (`base.py`), with LoRA per request and EAGLE-3 taps
    (`mixins.py`); each step runs this rank's stage on vLLM's packed tokens.

    Args:
        vllm_config: The engine's `VllmConfig`; `model_config.hf_config` is a
            `KerasHubConfig`.
        prefix: Module prefix vLLM gives the model.
    """

    def forward(
        self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None
    ):
        """Runs this rank's pipeline stage of the backbone on vLLM's packed tokens.

        Args:
            input_ids: `(num_tokens,)` token ids of all scheduled requests.
            positions: `(num_tokens,)` absolute position of each token, or
                `(3, num_tokens)` M-RoPE positions (`mrope.py`), which the
                attention routes read from the step; the rest of the step
                sees their first row.
            intermediate_tensors: The previous stage's `hidden_states`, on
                every stage but the first.
            inputs_embeds: `(num_tokens, hidden_size)` embeddings in place
                of `input_ids`, for presets served with images (`vision.py`).

        Returns:
            `(num_tokens, hidden_size)` final hidden states on the last
            stage, with the EAGLE-3 aux hidden states `(hidden, [aux...])`
            where a drafter asked for them; on the others,
            `IntermediateTensors` holding the hidden states for the next.
        """
        if inputs_embeds is not None and not self.takes_embeddings:
            raise NotImplementedError("This KerasHub model takes token ids only.")
        hidden = inputs_embeds
        if not self.stage.first:
            hidden = intermediate_tensors["hidden_states"]
        mrope = None
        if positions.ndim == 2:
            mrope, positions = positions, positions[0]
        routed, experts_routed, states_routed = [], [], []
        aux = [] if self.model.aux_hidden_state_layers else None

        def paged_attention(attention, query, key, value, *args, **kwargs):
            routed.append(attention)
            dtype = self._dtype
            query = query.to(dtype)
            if attention.kv_sharing_target_layer_name is not None:
                # It attends over its target's cache and writes none.
                output = attention(query, None, None)
            else:
                output = attention(query, key.to(dtype), value.to(dtype))
            if image_attention.marked(attention):
                output = image_attention.attend_images(attention, query, output)
            return attention, output

        def experts(block, hidden_states, routing):
            experts_routed.append(block)
            return self.moe[block._vllm_moe_index](hidden_states, routing)

        def state_step(layer, hidden_states):
            states_routed.append(layer._vllm_state_index)
            return self.states[layer._vllm_state_index](layer, hidden_states)

        with (
            vllm_context_scope(
                paged_attention_func=paged_attention,
                positions=positions,
                kv_caches=self.attention,
            ),
            step.scope(
                experts=experts,
                states=state_step,
                rotary_rows={},
                aux_hidden=aux,
                mrope_positions=mrope,
            ),
        ):
            hidden_states = self.stage.packed_forward(input_ids, positions, hidden)
        probe.check_step(
            self._name,
            len(routed),
            [block._vllm_moe_index for block in experts_routed],
            states_routed,
            (len(self.attention), len(self.moe), len(self.states)),
        )
        if not self.stage.last:
            return IntermediateTensors({"hidden_states": hidden_states})
        if aux is not None:
            return hidden_states, aux
        return hidden_states

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
