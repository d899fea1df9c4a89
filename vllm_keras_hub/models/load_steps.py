"""The named steps that put a loaded KerasHub model onto vLLM's layers.

Shared by every model class (`base.py`) and the Gemma4 drafter
(`families/gemma4/mtp.py`): routes installed, the start-up probe, the CPU
GEMM, the attention layers built and bound. A class using them has
`vllm_config`, `model_config` (its own: a drafter's is its draft config),
`family`, `prefix`, `_dtype` and `_name`.
"""

from torch import nn
from vllm.logger import init_logger
from vllm.platforms import current_platform

from vllm_keras_hub import speculative
from vllm_keras_hub.compile.direct_calls import use_direct_calls
from vllm_keras_hub.compile.dynamo_substitutes import substitute_keras_helpers
from vllm_keras_hub.layers.attention import attention as attention_layers
from vllm_keras_hub.layers.attention import paged_attention
from vllm_keras_hub.layers.attention.rotary_tables import use_rotary_tables
from vllm_keras_hub.layers.linear.linear import use_vllm_cpu_gemm
from vllm_keras_hub.layers.moe import moe_routes
from vllm_keras_hub.layers.state import state_routes
from vllm_keras_hub.loading.scope import building_scope
from vllm_keras_hub.models import probe

logger = init_logger(__name__)


class LoadSteps:
    """Load steps onto vLLM's layers, for a model holding a KerasHub stage."""

    # Whether attention is bidirectional, through vLLM's encoder-only kind.
    encoder_only = False
    # Whether its layers read another model's KV cache (a drafter's target's),
    # which `_build_attention` is told by name, not its own earlier layers'.
    reads_target_cache = False

    def _init_steps(self):
        self.attention = nn.ModuleList()
        self.moe_blocks = []
        # Each attending layer's kernel, in layer order (`paged_attention.py`).
        self.kernels = []
        self._route_layers = []
        self._state_layers = []
        # Matmul layers moved to vLLM's prepacked CPU GEMM (`layers/linear/`).
        self.cpu_gemm_layers = 0
        # The backbone's index of each vLLM `Attention`'s layer.
        self.attending_layers = []
        # The kernels' indices in the order a step calls them, where the
        # backbone calls some layers more than once (`Family.layer_calls`).
        self.attention_calls = None

    def _vllm_scope(self):
        return building_scope(self.vllm_config)

    def _install_routes(self, backbone, stage, kv_sharing_targets=None, experts=True):
        """Points the stage's layers at vLLM; returns its state layers, MoE blocks.

        Args:
            backbone: The loaded backbone.
            stage: This rank's `pipeline.Stage` of it.
            kv_sharing_targets: Per layer, what it reads the K/V of, over
                its family's route's (`attention.install`).
            experts: Whether MoE blocks hand their experts to vLLM (whose
                `FusedMoE`s the caller builds from the preset's weights).
        """
        state_layers = state_routes.install(stage.layers)
        attention_layers.install(backbone, self.family, kv_sharing_targets)
        moe_blocks = []
        if experts:
            moe_blocks = moe_routes.install(
                backbone, stage.layers if stage.size > 1 else None
            )
        use_direct_calls(backbone)
        if stage.model is not None:
            use_direct_calls(stage.model)
        use_rotary_tables(backbone, self.model_config.max_model_len)
        substitute_keras_helpers()
        return state_layers, moe_blocks

    def _probe(self, stage, state_layers=(), moe_blocks=()):
        """One token through the stage: every layer must route to vLLM."""
        routes = probe.run(stage, moe_blocks, state_layers)
        layer_calls = self.family.layer_calls
        calls = None if layer_calls is None else layer_calls(stage.backbone)
        probe.check_attention_routes(routes, stage.layers, self._name, calls)
        if calls is not None:
            routes.first_calls()
            attending = attention_layers.attention_indices(stage.layers)
            self.attention_calls = [attending.index(i) for i in calls if i in attending]
        probe.check_moe_routes(routes, moe_blocks, self._name)
        probe.check_state_routes(routes, state_layers, self._name)
        if not self.reads_target_cache:
            attending = attention_layers.attention_indices(stage.layers)
            probe.check_kv_sharing(
                routes.specs, [stage.start + index for index in attending]
            )
        self.attention_specs = routes.specs
        self._state_layers = list(state_layers)
        return routes

    def _serving_step(self, stage):
        """Runs the stage once as serving will (the CPU GEMM's check)."""
        probe.run(stage, self.moe_blocks, self._state_layers)

    def _use_cpu_gemm(self, model, stage):
        """`model`'s matmuls on vLLM's packed CPU GEMM (the CPU only).

        Args:
            model: What holds the matmuls: the backbone, or a task whose
                own layers run too (a drafter's projections).
            stage: The stage `_serving_step` runs to check them.
        """
        if not current_platform.is_cpu():
            return
        self.cpu_gemm_layers = use_vllm_cpu_gemm(
            model, lambda: self._serving_step(stage)
        )
        logger.info(
            "%d KerasHub matmul layers run on vLLM's CPU GEMM", self.cpu_gemm_layers
        )

    def _build_attention(self, stage, routes, target_names=None):
        """One vLLM `Attention` per attending layer of the stage, bound to it.

        Args:
            stage: This rank's stage.
            routes: What `_probe` recorded.
            target_names: Per layer, the vLLM name of the target model's
                layer whose cache it reads (a drafter reading its target's).
        """
        if target_names is None and self.prefix == f"{speculative.DRAFT_PREFIX}.":
            speculative.check_draft_attention(
                routes.specs,
                not self.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager,
                self._name,
            )
        attending = attention_layers.attention_indices(stage.layers)
        self.attending_layers = [stage.start + index for index in attending]
        self.attention = nn.ModuleList(
            attention_layers.build(
                routes.specs,
                f"{self.prefix}attention.",
                self.vllm_config.cache_config,
                self.attending_layers,
                encoder_only=self.encoder_only,
                target_names=target_names,
            )
        )
        self.kernels = [
            paged_attention.Served(attention, self._dtype, index)
            for index, attention in enumerate(self.attention)
        ]
        paged_attention.bind(routes.attention_layers, self.kernels)
        self._route_layers = routes.attention_layers
