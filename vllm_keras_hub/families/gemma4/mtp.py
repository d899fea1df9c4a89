"""The vLLM drafter class that runs a Gemma4 assistant preset's own layers.

vLLM drafts for Gemma4 with its `mtp` method (`v1/spec_decode/gemma4.py:
Gemma4Proposer`), which vLLM's own `Gemma4MTP` serves from Hugging Face
checkpoints. `KerasHubGemma4MTP` is that drafter for a KerasHub
`Gemma4AssistantCausalLM` preset: the same interface, the preset's own
layers. Each draft step, as `Gemma4AssistantCausalLM.call_with_cache`
computes it:

- the target's embedding of the token just chosen, times
  `sqrt(target hidden size)`, beside the target's last hidden state (after
  its final norm), through the assistant's `pre_projection`;
- the assistant's decoder blocks, whose attention computes only its query
  and reads the keys and values the target's last full or sliding layer
  wrote (vLLM's KV sharing, `kv_sharing_target_layer_name`);
- the final norm: its logits are the assistant's own (the centroid-masked
  ones of `_apply_centroid_logits` where the preset orders its
  embeddings), and `post_projection` gives the hidden state the next step
  is fed.

What vLLM's proposer reads of it, and why it is shaped so:
- `model.embed_tokens`, which the proposer replaces with the target's
  token embedding (`_maybe_share_embeddings`);
- no `model.layers`: the proposer would point them at target layers named
  `<...>.layers.<i>.self_attn.attn`, which a KerasHub target does not have
  (`_setup_gemma4_kv_sharing`). Each layer's target is set here instead,
  from the target's vLLM attention layers;
- no `masked_embedding`: with one, the proposer captures CUDA graphs of the
  centroid masking at load (`_setup_centroids_cuda_graphs`), which CPU torch
  cannot. The masking runs in `compute_logits` instead, outside the
  compiled graph, as KerasHub computes it.

Under tensor parallelism a rank's cache holds its KV heads of the target,
so each rank keeps the query heads that read them and its shard of the
output projection and MLP (`parallel_linear.shard`, as the target's
layers); the projections, norms and output embedding are small and stay
whole, so every rank drafts the same tokens.
"""

from vllm_keras_hub.backend import require_torch_backend

require_torch_backend()

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.model_executor.models.utils import maybe_prefix

from vllm_keras_hub import families
from vllm_keras_hub.layers import eagle3
from vllm_keras_hub.layers import step
from vllm_keras_hub.layers.attention import paged_attention
from vllm_keras_hub.layers.parallel import parallel_linear
from vllm_keras_hub.loading.preset_weights import LoadedWeights
from vllm_keras_hub.models import pipeline
from vllm_keras_hub.models.load_steps import LoadSteps
from vllm_keras_hub.speculative import DRAFT_PREFIX


class DrafterInputs(nn.Module):
    """The drafter's `model`: what vLLM's proposer swaps the target's into.

    Args:
        embed_tokens: The assistant's own token embedding, until vLLM
            replaces it with the target's.
    """

    def __init__(self, embed_tokens):
        super().__init__()
        self.embed_tokens = embed_tokens


# Compiled with the target (unless enforce_eager), as vLLM's `Gemma4MTP` is.
@support_torch_compile(
    dynamic_arg_dims={
        "input_ids": 0,
        "positions": -1,
        "hidden_states": 0,
        "inputs_embeds": 0,
    }
)
class KerasHubGemma4MTP(LoadSteps, nn.Module):
    """A KerasHub Gemma4 assistant preset as vLLM's Gemma4 MTP drafter.

    Built empty by the `keras_hub` loader for a draft config whose type is
    `gemma4_mtp`; `load_preset()` then loads the preset's task and, with
    the model classes' load steps (`models/load_steps.py`), builds a vLLM
    `Attention` per decoder block over its target layer's cache.

    Args:
        vllm_config: The engine's `VllmConfig`; the drafter's
            `KerasHubConfig` is its speculative config's
            `draft_model_config.hf_config`, as vLLM's `Gemma4MTP` reads it.
        prefix: Module prefix vLLM gives the drafter.
    """

    # Its layers read the target's cache (`_target_names`), not their own.
    reads_target_cache = True

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()
        self.model_config = vllm_config.speculative_config.draft_model_config
        hf_config = self.model_config.hf_config
        self.config = hf_config
        self.vllm_config = vllm_config
        self.preset = hf_config.keras_hub_preset
        self.family = families.family_by_name(hf_config.keras_hub_family)
        # As vLLM's `Gemma4MTP` names its layers (the proposer gives none).
        self.prefix = f"{maybe_prefix(prefix, DRAFT_PREFIX)}."
        self._init_steps()
        # vLLM's parallel linears holding this rank's shards (TP only).
        self.parallel_linears = nn.ModuleList()
        self.model = None
        self._task = None
        self._embed_scale = float(hf_config.backbone_hidden_size) ** 0.5

    @property
    def _name(self):
        return f"The Gemma4 assistant {self.preset!r}"

    def load_preset(self, lora_weights=None):
        """Loads the assistant's task from its preset and routes its attention.

        Args:
            lora_weights: Must be `None`: a merged adapter is the target's.
        """
        import keras_hub

        if lora_weights is not None:
            raise ValueError(
                f"{self._name} takes no merged adapter (lora_weights="
                f"{lora_weights!r} is the target's)."
            )
        self._dtype = self.model_config.dtype
        dtype = str(self._dtype).removeprefix("torch.")
        task = keras_hub.models.Gemma4AssistantCausalLM.from_preset(
            self.preset, dtype=dtype, preprocessor=None
        )
        backbone = task.backbone
        stage = pipeline.stage(backbone)
        # Any value routes a layer to its query only; `_target_names` then
        # names the target layer whose cache its vLLM `Attention` reads.
        # Loaded whole by `from_preset`: any experts stay Keras's own.
        self._install_routes(
            backbone,
            stage,
            kv_sharing_targets=["target"] * len(stage.layers),
            experts=False,
        )
        with self._vllm_scope():
            self.parallel_linears = nn.ModuleList(self._shards(stage))
        routes = self._probe(stage)
        # The projections and blocks on vLLM's packed GEMM, as the target's.
        self._use_cpu_gemm(task, stage)
        targets = _target_names(
            self.vllm_config.compilation_config.static_forward_context,
            self.prefix,
            routes.specs,
            self._name,
        )
        # Every layer reads its target's cache and writes none.
        with self._vllm_scope():
            self._build_attention(stage, routes, target_names=targets)
        self._task = task
        self.model = DrafterInputs(eagle3.SharedEmbedding(backbone))
        target = self.vllm_config.model_config.hf_config
        if getattr(target, "keras_hub_image", None) and not hasattr(
            target, "image_token_index"
        ):
            # vLLM's proposer copies a multimodal target's `image_token_index`
            # onto its drafter's config (`SpecDecodeBaseProposer.load_model`)
            # for drafters that take image embeddings; this one takes none.
            target.image_token_index = None

    def _shards(self, stage):
        """This rank's shards of the blocks' matmuls; none at one rank."""
        from vllm.distributed import get_tensor_model_parallel_rank
        from vllm.distributed import get_tensor_model_parallel_world_size

        ranks = get_tensor_model_parallel_world_size()
        if ranks == 1:
            return []
        return parallel_linear.shard(
            stage.layers,
            get_tensor_model_parallel_rank(),
            ranks,
            f"{self.prefix}parallel_linears.",
            LoadedWeights(),
        )

    def embed_input_ids(self, input_ids):
        """The target's token embedding, scaled as the target scales it."""
        embeddings = self.model.embed_tokens(input_ids)
        return embeddings * torch.tensor(self._embed_scale, dtype=embeddings.dtype)

    def forward(
        self,
        input_ids,
        positions,
        hidden_states,
        intermediate_tensors=None,
        inputs_embeds=None,
        spec_step_idx=0,
        **kwargs,
    ):
        """One draft step on vLLM's packed tokens.

        Args:
            input_ids: `(num_tokens,)` the tokens to draft after.
            positions: `(num_tokens,)` their positions, which stay the
                target's last one for every draft step.
            hidden_states: `(num_tokens, target hidden size)` the target's
                last hidden states, or the previous draft step's
                `post_projection` output.
            inputs_embeds: The target-embedded tokens, in place of
                `input_ids`.

        Returns:
            `(draft hidden states, hidden states for the next step)`.
        """
        if inputs_embeds is None:
            inputs_embeds = self.embed_input_ids(input_ids)
        num_tokens = positions.shape[-1]
        combined = torch.cat([inputs_embeds, hidden_states], dim=-1).to(self._dtype)
        x = self._task.pre_projection(combined.reshape(num_tokens, 1, -1))

        backbone = self._task.backbone
        padding_mask = torch.ones(num_tokens, 1, dtype=torch.int32, device=x.device)
        with (
            paged_attention.serving(self.kernels, positions),
            step.scope(rotary_rows={}, routed=step.Routed()),
        ):
            for layer in backbone.transformer_layers:
                x, _ = layer(
                    x,
                    padding_mask=padding_mask,
                    per_layer_input=None,
                    shared_kv=None,
                    positions=positions.reshape(-1, 1),
                )
        draft = backbone.layer_norm(x)
        next_hidden = self._task.post_projection(draft)
        return draft.reshape(num_tokens, -1), next_hidden.reshape(num_tokens, -1)

    def compute_logits(self, hidden_states, spec_step_idx=0):
        """The assistant's logits, as `call_with_cache` computes them."""
        hidden = hidden_states.reshape(-1, 1, hidden_states.shape[-1])
        if self._task.use_ordered_embeddings:
            logits = self._task._apply_centroid_logits(hidden)
        else:
            logits = self._task.backbone.token_embedding(hidden, reverse=True)
        return logits.reshape(hidden.shape[0], -1)


def _target_names(forward_context, own_prefix, specs, name):
    """The target's vLLM attention layer each drafter layer reads.

    As vLLM's proposer and KerasHub's `Gemma4CausalLM` both pick it: the
    target's last layer of the same kind (full or sliding window) that
    keeps its own cache.

    Args:
        forward_context: The engine's registered attention layers by name.
        own_prefix: The drafter's module prefix, whose layers are skipped.
        specs: The probe's `AttentionSpec` of each drafter layer.
        name: The drafter, for messages.

    Raises:
        ValueError: a drafter layer whose heads do not match its target's.
    """
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.models.utils import extract_layer_index

    last = {}
    for layer_name, layer in forward_context.items():
        if (
            not isinstance(layer, Attention)
            or layer_name.startswith(own_prefix)
            or layer.kv_sharing_target_layer_name is not None
        ):
            continue
        kind = layer.sliding_window is not None
        index = extract_layer_index(layer_name)
        if kind not in last or index > last[kind][0]:
            last[kind] = (index, layer_name, layer)
    names = []
    for index, spec in enumerate(specs):
        kind = spec.sliding_window is not None
        label = "sliding-window" if kind else "full"
        if kind not in last:
            raise ValueError(
                f"{name}'s layer {index} attends over a {label} layer of the "
                "target, which has none that keeps its own cache."
            )
        _, target_name, target = last[kind]
        ours = (spec.head_size, spec.num_kv_heads, spec.sliding_window)
        theirs = (target.head_size, target.num_kv_heads, target.sliding_window)
        if ours != theirs:
            raise ValueError(
                f"{name}'s layer {index} reads the target's {label} layer "
                f"{target_name!r}, whose cache has (head size, KV heads, "
                f"window) {theirs}, but it attends with {ours}: it was not "
                "made for this target."
            )
        names.append(target_name)
    return names
