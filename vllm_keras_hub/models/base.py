"""The base of every vLLM model class that runs a KerasHub preset's own layers.

`KerasHubBase` is built empty by vLLM; the `keras_hub` load format then calls
`load_preset()`, which loads the preset as named steps (`_load`): this rank's
pipeline stage, an adapter merged, the routes installed, the parallel
shards and fused experts built, the state layers and adapter layers built,
the start-up probe, the CPU GEMM, the attention layers.

Each routed layer holds its own vLLM kernel from the build on. Each
`forward` step, every routed attention layer hands q/k/v to its vLLM
`Attention` (`layers/attention/paged_attention.py`), every Gated DeltaNet
layer its tokens to its state layer (`layers/state/state_routes.py`), every
MoE block its experts to its `FusedMoE` (`layers/moe/moe.py`); the layers
call their own `call()` directly (`compile/direct_calls.py`), so vLLM
compiles the whole step. The model
classes are one line of parts: this base, what they serve (`CausalMixin`,
`EmbeddingMixin`, images) and what some take (`mixins.py`).
"""

from vllm_keras_hub.backend import require_torch_backend

# Before anything below imports Keras: a clear error for another backend.
require_torch_backend()

from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.logger import init_logger
from vllm.model_executor.models.utils import (
    make_empty_intermediate_tensors_factory,
)
from vllm.sequence import IntermediateTensors

from vllm_keras_hub import families
from vllm_keras_hub import settings
from vllm_keras_hub.export.hf_config import LOAD_FORMAT
from vllm_keras_hub.layers import eagle3
from vllm_keras_hub.layers import step
from vllm_keras_hub.layers.attention import attention as attention_layers
from vllm_keras_hub.layers.attention import paged_attention
from vllm_keras_hub.layers.moe import moe_routes
from vllm_keras_hub.layers.parallel import parallel_linear
from vllm_keras_hub.layers.state import state_routes
from vllm_keras_hub.loading import heap
from vllm_keras_hub.loading import preset_weights
from vllm_keras_hub.loading.load_format import backbone_dtype
from vllm_keras_hub.loading.load_format import task_final_logit_cap
from vllm_keras_hub.lora import merged as lora
from vllm_keras_hub.models import pipeline
from vllm_keras_hub.models import probe
from vllm_keras_hub.models.load_steps import LoadSteps
from vllm_keras_hub.preset import served
from vllm_keras_hub.vllm_fixes import apply_for_model

logger = init_logger(__name__)

# vLLM compiles a model class's `forward` (unless enforce_eager) with dynamic
# token counts.
compiled = support_torch_compile(
    dynamic_arg_dims={
        "input_ids": 0,
        "positions": -1,
        "intermediate_tensors": 0,
        "inputs_embeds": 0,
    }
)


class KerasHubBase(LoadSteps, nn.Module):
    """A KerasHub preset's backbone in vLLM's model runner, loaded as named steps.

    Under pipeline parallelism each rank holds and runs its stage of the
    layers (`pipeline.py`).

    Args:
        vllm_config: The engine's `VllmConfig`; `model_config.hf_config` is a
            `KerasHubConfig`.
        prefix: Module prefix vLLM gives the model.
    """

    # Whether `forward` takes `inputs_embeds` (presets served with images).
    takes_embeddings = False
    # The preset's image format (`export/image_format.py`); `None`: text only.
    image = None

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()
        require_torch_backend()
        load_format = vllm_config.load_config.load_format
        if load_format != LOAD_FORMAT:
            raise ValueError(
                f"A KerasHub model loads its weights from its preset with "
                f"load_format='{LOAD_FORMAT}' (--load-format {LOAD_FORMAT}), "
                f"got load_format='{load_format}'."
            )
        hf_config = vllm_config.model_config.hf_config
        self.family = families.family_by_name(hf_config.keras_hub_family)
        families.family_for_backbone(self.family.backbone, hf_config.keras_hub_preset)
        # The config this worker was given, as vLLM's config hook checked it.
        settings.verify(vllm_config)
        # Before vLLM's first (compiled) call, which loads a saved compile.
        apply_for_model(KerasHubBase, vllm_config)
        self.make_empty_intermediate_tensors = make_empty_intermediate_tensors_factory(
            ["hidden_states"], hf_config.hidden_size
        )
        self.config = hf_config
        # Each of the preset's files is read once, by whichever step first asks.
        self.preset = served(hf_config.keras_hub_preset)
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        # vLLM names a draft model's modules under `draft_model`, with no dot.
        self.prefix = f"{prefix}." if prefix and not prefix.endswith(".") else prefix
        self.backbone = None
        self.stage = None
        self._final_logit_cap = None
        self._init_steps()
        self.moe = nn.ModuleList()
        # One vLLM state layer per recurrent-state layer (hybrid presets).
        self.states = nn.ModuleList()
        # vLLM's parallel linear layers holding this rank's shards, and
        # the vocabulary-parallel output head (tensor parallelism only).
        self.parallel_linears = nn.ModuleList()
        self.lm_head = None
        self.logits_processor = None
        # What EAGLE-3 drafters read (`layers/eagle3.py`), once loaded.
        self.model = None
        # vLLM linears under the LoRA-capable matmuls (with --enable-lora).
        self.lora_layers = nn.ModuleDict()

    @property
    def _name(self):
        return f"{self.family.display_name} ({self.preset})"

    def load_preset(self, lora_weights=None):
        """Loads this rank's part of the backbone from the preset, once.

        The backbone is built with no weights (`preset_weights.py`); each
        weight is then read from the preset only where this rank uses it:
        its pipeline stage's layers (`pipeline.py`), and of those, under
        tensor parallelism, only the shards vLLM's parallel linears and
        fused experts keep. A LoRA adapter `lora_weights` (a KerasHub
        `.lora.h5` file), if given, is merged into its layers' kernels
        first. A one-token probe through the stage then asks every
        attention layer for its heads, scale, sliding window and soft cap,
        and checks that each transformer layer and each MoE block routes; a
        family that does not fails here, at start-up.
        """
        model_config = self.vllm_config.model_config
        dtype = str(model_config.dtype).removeprefix("torch.")
        backbone = preset_weights.unloaded_backbone(
            self.preset, backbone_dtype(self.preset, dtype)
        )
        weights = preset_weights.PresetWeights(backbone, self.preset)
        try:
            self._load(backbone, weights, lora_weights)
        finally:
            weights.close()
        heap.release_free_memory()

    def _load(self, backbone, weights, lora_weights):
        self._dtype = self.vllm_config.model_config.dtype
        self._check_backbone(backbone)
        stage = self._own_stage(backbone, weights)
        if lora_weights is not None:
            self._merge_adapter(backbone, weights, lora_weights)
        state_layers, moe_blocks = self._install_routes(backbone, stage)
        with self._vllm_scope():
            self._build_shards(stage, weights, moe_blocks)
        weights.finish()
        # After the weights are loaded: a state layer copies its small ones.
        with self._vllm_scope():
            self._build_states(stage, state_layers)
            self._build_adapters(backbone, stage)
        routes = self._probe(stage, state_layers, moe_blocks)
        self.backbone = backbone
        self._use_cpu_gemm(backbone, stage)
        with self._vllm_scope():
            self._build_attention(stage, routes)
        self.stage = stage
        self._final_logit_cap = task_final_logit_cap(self.preset)
        self.model = eagle3.EagleTarget(backbone)

    def _own_stage(self, backbone, weights):
        """This rank's pipeline stage; the other stages' weights are never read."""
        from vllm.distributed import get_pp_group

        pp = get_pp_group()
        prompt_embeddings = self.vllm_config.model_config.enable_prompt_embeds
        stage = pipeline.stage(backbone, pp.rank_in_group, pp.world_size, prompt_embeddings)
        # Every token then comes as an embedding (`prompt_embeds.py`).
        self.takes_embeddings = stage.embedding is not None or self.takes_embeddings
        weights.release(stage.unused_variables())
        if stage.size > 1:
            # What crosses between stages can be wider than the hidden
            # states (Gemma4's per-layer inputs travel with them).
            self.make_empty_intermediate_tensors = (
                make_empty_intermediate_tensors_factory(
                    ["hidden_states"], self._crossing_width(stage)
                )
            )
        return stage

    def _crossing_width(self, stage):
        """The width of the hidden states crossing between stages."""
        return stage.hidden_size

    def _merge_adapter(self, backbone, weights, lora_weights):
        rank = lora.load_adapter(backbone, lora_weights, weights)
        logger.info(
            "LoRA adapter %s (rank %d): %d layers merged into their kernels",
            lora_weights, rank, lora.merge_lora(backbone),
        )  # fmt: skip

    def _build_shards(self, stage, weights, moe_blocks):
        """vLLM's parallel linears and fused experts, each holding this rank's shard."""
        linears, self.lm_head, self.logits_processor = parallel_linear.shard_stage(
            stage, weights, self.prefix
        )
        self.parallel_linears = nn.ModuleList(linears)
        self.moe = nn.ModuleList(
            moe_routes.build_experts(
                moe_blocks, f"{self.prefix}moe.", self._dtype, weights
            )
        )
        self.moe_blocks = moe_blocks

    def _build_states(self, stage, state_layers):
        self.states = nn.ModuleList(
            state_routes.build(
                state_layers, f"{self.prefix}state.", self._dtype, stage.start
            )
        )

    def _build_adapters(self, backbone, stage):
        """The vLLM layers adapters need (`mixins.LoRAMixin`); none here."""

    def _check_backbone(self, backbone):
        """Raises for a backbone this model class cannot serve exactly."""

    def embed_input_ids(self, input_ids):
        """The token embedding (Gemma3n's includes its embedding scale); with
        prompt embeddings, what enters the first transformer layer."""
        if self.stage is not None and self.stage.embedding is not None:
            return self.stage.embed(input_ids)
        return attention_layers.token_embedding(self.backbone)(input_ids)

    def forward(
        self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None
    ):
        """Runs this rank's pipeline stage of the backbone on vLLM's packed tokens.

        Args:
            input_ids: `(num_tokens,)` token ids of all scheduled requests.
            positions: `(num_tokens,)` absolute position of each token, or
                `(3, num_tokens)` M-RoPE positions (`families/qwen3_5/
                media.py`), which the attention routes read from the step;
                the rest of the step sees their first row.
            intermediate_tensors: The previous stage's `hidden_states`, on
                every stage but the first.
            inputs_embeds: `(num_tokens, hidden_size)` embeddings in place
                of `input_ids`, for presets served with images (`images.py`).

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
        aux = [] if self.model.aux_hidden_state_layers else None
        routed = step.Routed()
        with (
            paged_attention.serving(self.kernels, positions),
            step.scope(
                rotary_rows={},
                aux_hidden=aux,
                mrope_positions=mrope,
                routed=routed,
            ),
        ):
            hidden_states = self.stage.packed_forward(input_ids, positions, hidden)
        probe.check_step(
            self._name,
            routed.attention,
            routed.moe,
            routed.states,
            (len(self.attention), len(self.moe), len(self.states)),
            self.attention_calls,
        )
        if not self.stage.last:
            return IntermediateTensors({"hidden_states": hidden_states})
        if aux is not None:
            return hidden_states, aux
        return hidden_states
