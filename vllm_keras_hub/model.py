"""The vLLM model class that runs a KerasHub preset's own layers.

`KerasHubForCausalLM` holds the preset's KerasHub backbone (Keras on torch, so
its layers are `torch.nn.Module`s) and one vLLM `Attention` per transformer
layer. Each forward step publishes keras-hub's serving context; every routed
KerasHub attention layer projects q/k/v, applies its own position encoding at
vLLM's per-token positions and hands q/k/v to keras-hub's paged-attention
bridge, which calls the layer's vLLM `Attention`. vLLM's paged KV cache and the
platform's attention kernel do the attention; everything else stays KerasHub.

The backbone's layers call their own `call()` directly (`compile/direct_calls.py`), so
vLLM's default mode can compile the whole step with torch.compile, as it does
for its own models. On the CPU their Dense/EinsumDense matmuls run on the
weights prepacked for vLLM's CPU GEMM, as vLLM's own linear layers do
(`layers/linear.py`).
"""

import dataclasses
import sys

from vllm_keras_hub.backend import require_torch_backend

# Before anything below imports Keras: a clear error for another backend.
require_torch_backend()

import torch
from keras_hub.src.vllm.context import vllm_context_scope
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import set_current_vllm_config
from vllm.model_executor.layers.attention import Attention
from vllm.logger import init_logger
from vllm.platforms import current_platform

from vllm_keras_hub import families
from vllm_keras_hub.compile.direct_calls import use_direct_calls
from vllm_keras_hub.compile.dynamo_substitutes import substitute_keras_helpers
from vllm_keras_hub.compile.saved_compile import load_saved_compiles
from vllm_keras_hub.config import LOAD_FORMAT
from vllm_keras_hub.layers import attention as attention_layers
from vllm_keras_hub.layers.linear import use_vllm_cpu_gemm
from vllm_keras_hub.layers.rotary_tables import use_rotary_tables
from vllm_keras_hub.text_forward import text_forward

logger = init_logger(__name__)


class RouteError(RuntimeError):
    """Transformer layers that did not hand attention to vLLM exactly once."""


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """What one KerasHub attention layer asks of vLLM's `Attention`.

    Args:
        num_heads: Query heads.
        head_size: Per-head size.
        num_kv_heads: Key/value heads, unexpanded.
        scale: Softmax scale.
        sliding_window: Tokens each query sees, itself included, or `None`.
        soft_cap: Attention-logit soft cap, or `None`.
        alibi_slopes: Per-query-head ALiBi slopes, added after the softmax
            scale as `slope * (key_position - query_position)`, or `None`.
        sinks: Per-query-head learned attention-sink logits, each an extra
            softmax column with no value (GPT-OSS), or `None`.
        kv_sharing_target: Index of the earlier layer whose keys and values
            this layer attends over, with no cache of its own (Gemma3n and
            Gemma4's last `num_kv_shared_layers`), or `None`.
    """

    num_heads: int
    head_size: int
    num_kv_heads: int
    scale: float
    sliding_window: int | None
    soft_cap: float | None
    alibi_slopes: tuple[float, ...] | None = None
    sinks: tuple[float, ...] | None = None
    kv_sharing_target: int | None = None


def _routing_attention_layer():
    """The KerasHub attention layer whose vLLM route is calling us.

    keras-hub's bridge hands the paged-attention function only tensors and
    attention options, not the layer; the layer is `self` of the
    `_compute_vllm_attention` frame up the stack.
    """
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "_compute_vllm_attention":
            return frame.f_locals.get("self")
        frame = frame.f_back
    return None


def _transformer_layers(backbone):
    try:
        return attention_layers.transformer_layers(backbone)
    except ValueError as e:
        raise RouteError(str(e)) from e


def _layer_owners(transformer_layers):
    """Maps `id()` of every sublayer to its transformer layer's index."""
    owners = {}
    for index, layer in enumerate(transformer_layers):
        for sublayer in layer._flatten_layers(include_self=True):
            owners[id(sublayer)] = index
    return owners


def backbone_dtype(preset, dtype):
    """The `dtype` to build a preset's backbone in, quantized ones included.

    A backbone saved after `quantize("int8")` carries a `DTypePolicyMap` of
    its quantized layers. `Backbone.from_preset(dtype="float32")` replaces
    that map with the plain policy (keras-hub 0.32), so the layers are built
    unquantized and their int8 weights fail to load. For such a preset this
    returns the saved map with `dtype` as its default and as the quantized
    layers' source dtype, as keras-hub does when a map is kept.
    """
    from keras_hub.src.utils.preset_utils import CONFIG_FILE
    from keras_hub.src.utils.preset_utils import load_json
    from keras_hub.src.utils.preset_utils import set_dtype_in_config

    config = load_json(preset, CONFIG_FILE)
    saved = config.get("config", {}).get("dtype")
    if isinstance(saved, dict) and "DTypePolicyMap" in saved.get("class_name", ""):
        return set_dtype_in_config(config, dtype)["config"]["dtype"]
    return dtype


def task_final_logit_cap(preset):
    """The soft cap a preset's task, not its backbone, puts on the logits.

    `Gemma4CausalLM(final_logit_cap=...)` caps the logits again after the
    backbone's own `final_logit_soft_cap`; `None` where the preset's
    `task.json` sets none (or it has none).
    """
    from keras_hub.src.utils.preset_utils import TASK_CONFIG_FILE
    from keras_hub.src.utils.preset_utils import check_file_exists
    from keras_hub.src.utils.preset_utils import load_json

    if not check_file_exists(preset, TASK_CONFIG_FILE):
        return None
    cap = load_json(preset, TASK_CONFIG_FILE).get("config", {}).get("final_logit_cap")
    return float(cap) if cap else None


def _forward(backbone, input_ids, positions):
    # vLLM packs the tokens of all requests into one ragged sequence. Fed as a
    # batch of one-token rows, decoder masks degenerate and only vLLM's
    # attention mixes tokens.
    token_ids = input_ids.reshape(-1, 1)
    return text_forward(
        backbone, token_ids, torch.ones_like(token_ids), positions.reshape(-1, 1)
    )


def _check_kv_sharing(specs):
    """Raises `RouteError` unless each KV-sharing layer fits its target's cache.

    vLLM hands the sharing layer its target's cache as is: it must be an
    earlier layer with the same KV heads and head size.
    """
    for index, spec in enumerate(specs):
        target = spec.kv_sharing_target
        if target is None:
            continue
        if not 0 <= target < index or specs[target].kv_sharing_target is not None:
            raise RouteError(
                f"Layer {index} shares the K/V of layer {target}, which is not "
                "an earlier layer with a cache of its own."
            )
        mine = (spec.num_kv_heads, spec.head_size)
        theirs = (specs[target].num_kv_heads, specs[target].head_size)
        if mine != theirs:
            raise RouteError(
                f"Layer {index} reads the K/V of layer {target} as "
                f"{mine[0]} heads of {mine[1]}, but that layer caches "
                f"{theirs[0]} heads of {theirs[1]}."
            )


# vLLM compiles `forward` (unless enforce_eager) with dynamic token counts.
@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": -1})
class KerasHubForCausalLM(nn.Module):
    """A KerasHub `CausalLM` preset served by vLLM's model runner.

    Built empty by vLLM; the `keras_hub` load format then calls
    `load_preset()`, which loads the backbone and weights once with
    `from_preset` and creates the vLLM `Attention` modules.

    Args:
        vllm_config: The engine's `VllmConfig`; `model_config.hf_config` is a
            `KerasHubConfig`.
        prefix: Module prefix vLLM gives the model.
    """

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
        self.preset = hf_config.keras_hub_preset
        self.vllm_config = vllm_config
        # Before vLLM's first (compiled) call, which loads a saved compile.
        load_saved_compiles(type(self))
        self.prefix = prefix
        self.backbone = None
        self._final_logit_cap = None
        self.attention = nn.ModuleList()
        self._route_layers = []
        # Matmul layers moved to vLLM's prepacked CPU GEMM (`layers/linear.py`).
        self.cpu_gemm_layers = 0

    def load_preset(self):
        """Loads the backbone and its weights from the preset, once.

        Built in vLLM's resolved dtype. A one-token probe through the
        backbone then asks every attention layer for its heads, scale,
        sliding window and soft cap, and checks that each transformer layer
        routes; a family that does not fails here, at start-up.
        """
        import keras_hub

        dtype = str(self.vllm_config.model_config.dtype).removeprefix("torch.")
        backbone = keras_hub.models.Backbone.from_preset(
            self.preset, dtype=backbone_dtype(self.preset, dtype)
        )
        attention_layers.install(backbone, self.family)
        use_direct_calls(backbone)
        use_rotary_tables(backbone, self.vllm_config.model_config.max_model_len)
        substitute_keras_helpers()
        specs, route_layers = self._probe(backbone)
        if current_platform.is_cpu():
            self.cpu_gemm_layers = use_vllm_cpu_gemm(
                backbone, lambda: self._probe(backbone)
            )
            logger.info(
                "%d KerasHub matmul layers run on vLLM's CPU GEMM",
                self.cpu_gemm_layers,
            )
        _check_kv_sharing(specs)
        device = self.vllm_config.device_config.device
        with set_current_vllm_config(self.vllm_config), torch.device(device):
            self.attention = nn.ModuleList(
                Attention(
                    spec.num_heads,
                    spec.head_size,
                    spec.scale,
                    num_kv_heads=spec.num_kv_heads,
                    cache_config=self.vllm_config.cache_config,
                    logits_soft_cap=spec.soft_cap,
                    per_layer_sliding_window=spec.sliding_window,
                    alibi_slopes=(
                        None if spec.alibi_slopes is None else list(spec.alibi_slopes)
                    ),
                    prefix=self._attention_prefix(index),
                    kv_sharing_target_layer_name=(
                        None
                        if spec.kv_sharing_target is None
                        else self._attention_prefix(spec.kv_sharing_target)
                    ),
                    # Only where used: not every backend's impl takes `sinks`.
                    **(
                        {}
                        if spec.sinks is None
                        else {"sinks": torch.tensor(spec.sinks, dtype=torch.float32)}
                    ),
                )
                for index, spec in enumerate(specs)
            )
        self.backbone = backbone
        self._final_logit_cap = task_final_logit_cap(self.preset)
        self.attention_specs = specs
        self._route_layers = route_layers
        self._dtype = self.vllm_config.model_config.dtype

    def _attention_prefix(self, index):
        # vLLM's layer name for the `Attention` of transformer layer `index`;
        # it orders KV caches by the integer in it.
        return f"{self.prefix}attention.{index}"

    def _probe(self, backbone):
        """Runs one token through `backbone`, recording each route's options.

        Returns:
            `(specs, route_layers)`: an `AttentionSpec` per transformer layer,
            and the KerasHub attention layer that routes for each.
        """
        transformer_layers = _transformer_layers(backbone)
        specs, callers = [], []

        def record(
            cache,
            query,
            key,
            value,
            scale,
            head_size,
            num_heads,
            num_kv_heads,
            sliding_window=None,
            soft_cap=None,
            alibi_slopes=None,
            sinks=None,
            kv_sharing_target=None,
        ):
            callers.append(_routing_attention_layer())
            specs.append(
                AttentionSpec(
                    num_heads=int(num_heads),
                    head_size=int(head_size),
                    num_kv_heads=int(num_kv_heads),
                    scale=float(scale),
                    sliding_window=int(sliding_window) if sliding_window else None,
                    soft_cap=float(soft_cap) if soft_cap else None,
                    alibi_slopes=(
                        None
                        if alibi_slopes is None
                        else tuple(float(slope) for slope in alibi_slopes)
                    ),
                    sinks=(
                        None
                        if sinks is None
                        else tuple(torch.as_tensor(sinks).float().flatten().tolist())
                    ),
                    kv_sharing_target=kv_sharing_target,
                )
            )
            return cache, torch.zeros_like(query)

        input_ids = torch.zeros(1, dtype=torch.int64)
        with torch.inference_mode(), vllm_context_scope(
            paged_attention_func=record,
            positions=torch.zeros_like(input_ids),
            kv_caches=list(range(len(transformer_layers))),
        ):
            _forward(backbone, input_ids, torch.zeros_like(input_ids))
        self._check_routes(callers, transformer_layers)
        return specs, callers

    def _check_routes(self, callers, transformer_layers):
        """Raises `RouteError` unless layer i, and only it, routed i-th."""
        owners = _layer_owners(transformer_layers)
        routed = [owners.get(id(caller)) for caller in callers]
        expected = list(range(len(transformer_layers)))
        if routed == expected:
            return
        missing = [i for i in expected if i not in routed]
        repeated = sorted({i for i in routed if i is not None and routed.count(i) > 1})
        problems = []
        if missing:
            names = ", ".join(transformer_layers[i].name for i in missing)
            problems.append(f"did not route: {names}")
        if repeated:
            names = ", ".join(transformer_layers[i].name for i in repeated)
            problems.append(f"routed more than once: {names}")
        if None in routed or not problems:
            problems.append(f"dispatch order was {routed}")
        raise RouteError(
            f"{self.family.display_name} ({self.preset}): "
            f"{len(transformer_layers)} transformer layers must each hand "
            f"attention to vLLM exactly once, in order, but some "
            + "; ".join(problems)
            + ". Serving them would give wrong output."
        )

    def embed_input_ids(self, input_ids):
        """The token embedding (Gemma3n's includes its embedding scale)."""
        return attention_layers.token_embedding(self.backbone)(input_ids)

    def forward(
        self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None
    ):
        """Runs the backbone on vLLM's packed tokens.

        Args:
            input_ids: `(num_tokens,)` token ids of all scheduled requests.
            positions: `(num_tokens,)` absolute position of each token.
            intermediate_tensors: Pipeline-parallel inputs; unsupported.
            inputs_embeds: Precomputed embeddings; unsupported.

        Returns:
            `(num_tokens, hidden_size)` final hidden states.
        """
        if inputs_embeds is not None or intermediate_tensors is not None:
            raise NotImplementedError(
                "KerasHub models take token ids only (no inputs_embeds or "
                "pipeline parallelism)."
            )
        routed = []

        def paged_attention(attention, query, key, value, *args, **kwargs):
            routed.append(attention)
            dtype = self._dtype
            if attention.kv_sharing_target_layer_name is not None:
                # It attends over its target's cache and writes none.
                return attention, attention(query.to(dtype), None, None)
            return attention, attention(
                query.to(dtype), key.to(dtype), value.to(dtype)
            )

        with vllm_context_scope(
            paged_attention_func=paged_attention,
            positions=positions,
            kv_caches=self.attention,
        ):
            hidden_states = _forward(self.backbone, input_ids, positions)
        # The start-up probe named the routing layers; a step that routed
        # differently (a layer that fell back to its own attention) must not
        # return. Under torch.compile this is decided once, while tracing.
        if len(routed) != len(self.attention):
            raise RouteError(
                f"{self.family.display_name} ({self.preset}): "
                f"{len(routed)} of {len(self.attention)} transformer layers "
                "handed attention to vLLM in this step; serving it would "
                "give wrong output."
            )
        return hidden_states[:, 0, :]

    def compute_logits(self, hidden_states):
        """Logits through the backbone's own (possibly tied) output embedding.

        KerasHub's `ReversibleEmbedding` also applies a family's final logit
        soft cap (Gemma2); a task-level one (Gemma4's `final_logit_cap`)
        follows.
        """
        logits = attention_layers.token_embedding(self.backbone)(hidden_states, reverse=True)
        cap = self._final_logit_cap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits
