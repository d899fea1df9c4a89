"""Gated DeltaNet layers with their recurrent state in vLLM's state cache.

Qwen3.5's linear-attention layers (`Qwen3_5GatedDeltaNet`) keep, per
request, a short convolution window and a `(heads, key, value)` recurrent
state instead of a KV cache. vLLM keeps such states for its own hybrid
models in its state cache (`MambaBase` layers): one slot per request, with
its prefix caching ("align" mode copies a block's state forward) and
chunked prefill. Each KerasHub GDN layer here gets a `GatedDeltaNetState`,
a vLLM `MambaBase` layer owning the layer's slots, and its route
(`state_routes.py`) hands it each step's tokens:

- in bfloat16, where vLLM's CPU kernels apply, the layer's own projections
  go to vLLM's `cpu_gdn_attention_core` (convolution, gating and the delta
  rule over the slots), then to the layer's own gated norm and output
  projection;
- otherwise (float32; head sizes vLLM's kernels do not take) the layer's
  own `call` runs on each request's tokens with its cache read from and
  written back to the request's slot, so the math is KerasHub's: its
  convolution, its chunked delta rule for a prefill chunk and its
  recurrent one for a decode step.
"""

import dataclasses

import keras
import torch
from torch import nn
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.utils.torch_utils import LayerNameType
from vllm.utils.torch_utils import _resolve_layer_name

from vllm_keras_hub.layers.custom_ops import register_output_op


@dataclasses.dataclass(frozen=True)
class GatedDeltaNetSpec:
    """What one KerasHub GDN layer asks of vLLM's state cache.

    Args:
        num_k_heads: Query/key heads.
        num_v_heads: Value heads (a multiple of `num_k_heads`).
        head_k_dim: Query/key head size.
        head_v_dim: Value head size.
        conv_kernel_size: The causal convolution's width.
    """

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel_size: int

    @classmethod
    def of(cls, layer):
        return cls(
            int(layer.num_k_heads),
            int(layer.num_v_heads),
            int(layer.head_k_dim),
            int(layer.head_v_dim),
            int(layer.conv_kernel_size),
        )

    def state_shape(self, ranks=1):
        """vLLM's `(conv, recurrent)` slot shapes for this layer.

        Args:
            ranks: The tensor-parallel ranks the heads are split over (a
                layer already sharded counts its own heads: 1).
        """
        from vllm.model_executor.layers.mamba.mamba_utils import (
            MambaStateShapeCalculator,
        )

        return MambaStateShapeCalculator.gated_delta_net_state_shape(
            ranks,
            self.num_k_heads,
            self.num_v_heads,
            self.head_k_dim,
            self.head_v_dim,
            self.conv_kernel_size,
        )


def state_dtypes(model_dtype):
    """`(conv, recurrent)` state dtypes: the model's, and float32 as KerasHub keeps it."""
    return model_dtype, torch.float32


def vllm_kernels_apply(spec, dtype):
    """Whether vLLM's CPU GDN kernels compute this layer: `(bool, reason)`.

    They take bfloat16 only and query/key and value heads of one size, 64
    or 128; where vLLM packs the convolution for its C++ kernel (CPUs with
    AVX-512 BF16, or Arm with bfloat16), a width of 4. Elsewhere the layer
    runs KerasHub's own math.
    """
    from vllm.model_executor.layers.mamba.ops.cpu.gdn_attention import is_arm_bf16
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False, "vLLM's GDN kernels are wired here for the CPU only"
    if dtype != torch.bfloat16:
        return False, f"vLLM's CPU GDN kernels take bfloat16, not {dtype}"
    if spec.head_k_dim != spec.head_v_dim or spec.head_k_dim not in (64, 128):
        return False, (
            f"vLLM's CPU GDN kernels take key and value heads of one size, 64 "
            f"or 128, not {spec.head_k_dim} and {spec.head_v_dim}"
        )
    packed = torch.cpu._is_avx512_bf16_supported() or is_arm_bf16()
    if packed and spec.conv_kernel_size != 4:
        return False, (
            f"vLLM's packed CPU convolution takes width 4, not {spec.conv_kernel_size}"
        )
    return True, ""


class GatedDeltaNetState(nn.Module, MambaBase):
    """One KerasHub GDN layer's slots in vLLM's state cache, and its step.

    Registered with the engine under `prefix` (its index is the layer's
    index in the backbone), which binds the layer's `(conv, recurrent)`
    state tensors to `kv_cache` and builds `GDNAttentionMetadata` for it
    every step.

    Args:
        layer: The KerasHub `Qwen3_5GatedDeltaNet`, its weights loaded.
        prefix: The layer's name in vLLM's forward context.
        model_dtype: The model's torch dtype.
        vllm_kernels: Whether vLLM's CPU kernels compute it
            (`vllm_kernels_apply`).
    """

    def __init__(self, layer, prefix, model_dtype, vllm_kernels):
        from vllm.config import get_current_vllm_config

        super().__init__()
        spec = GatedDeltaNetSpec.of(layer)
        self.spec = spec
        self.prefix = prefix
        self.model_dtype = model_dtype
        self.vllm_kernels = vllm_kernels
        # What vLLM's CPU GDN op reads from its layer; under tensor
        # parallelism `layer` holds the rank's heads already.
        self.tp_size = 1
        self.num_k_heads = spec.num_k_heads
        self.num_v_heads = spec.num_v_heads
        self.head_k_dim = spec.head_k_dim
        self.head_v_dim = spec.head_v_dim
        self.key_dim = spec.num_k_heads * spec.head_k_dim
        self.value_dim = spec.num_v_heads * spec.head_v_dim
        self.activation = "silu"
        self.kv_cache = ()
        # Not a submodule: the KerasHub layer belongs to the backbone.
        self.__dict__["keras_layer"] = layer
        if vllm_kernels:
            self._take_kernel_weights(layer)
        config = get_current_vllm_config().compilation_config
        if prefix in config.static_forward_context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        config.static_forward_context[prefix] = self

    def _take_kernel_weights(self, layer):
        # Copies of the small tensors vLLM's op reads; the layer keeps its
        # own. The convolution is packed as vLLM packs its own
        # (`dispatch_cpu_unquantized_gemm`, for a `(dim, 1, width)` weight).
        from vllm.model_executor.layers.mamba.ops.cpu.gdn_attention import (
            register_cpu_gdn_attention_ops,
        )
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        register_cpu_gdn_attention_ops()
        dtype = self.model_dtype
        self.A_log = nn.Parameter(
            layer.A_log.value.detach().float().clone(), requires_grad=False
        )
        self.dt_bias = nn.Parameter(
            layer.dt_bias.value.detach().to(dtype).clone(), requires_grad=False
        )
        self.conv1d = nn.Module()
        self.conv1d.weight = nn.Parameter(
            layer.conv1d_weight.value.detach().to(dtype).unsqueeze(1).contiguous(),
            requires_grad=False,
        )
        self.conv1d.bias = None
        dispatch_cpu_unquantized_gemm(self.conv1d, remove_weight=False)

    @property
    def mamba_type(self):
        from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

        return MambaAttentionBackendEnum.GDN_ATTN

    def get_state_shape(self):
        return self.spec.state_shape()

    def get_state_dtype(self):
        return state_dtypes(self.model_dtype)

    def rearrange_mixed_qkv(self, mixed_qkv):
        from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
            QwenGatedDeltaNetAttention,
        )

        return QwenGatedDeltaNetAttention.rearrange_mixed_qkv(self, mixed_qkv)

    def forward(self, layer, hidden_states):
        """The layer's output on `(num_tokens, 1, hidden)` packed tokens."""
        from vllm.utils.torch_utils import _encode_layer_name

        if not self.vllm_kernels:
            output = torch.empty_like(hidden_states)
            torch.ops.vllm_keras_hub.keras_gated_delta_net(
                hidden_states, output, _encode_layer_name(self.prefix)
            )
            return output
        spec = self.spec
        num_tokens = hidden_states.shape[0]
        # `Qwen3_5GatedDeltaNet.call` up to its recurrence: the projections.
        mixed_qkv = layer.in_proj_qkv(hidden_states).reshape(num_tokens, -1)
        z = layer.in_proj_z(hidden_states)
        b = layer.in_proj_b(hidden_states).reshape(num_tokens, -1)
        a = layer.in_proj_a(hidden_states).reshape(num_tokens, -1)
        core = torch.zeros(
            num_tokens, spec.num_v_heads, spec.head_v_dim, dtype=mixed_qkv.dtype
        )
        torch.ops.vllm.cpu_gdn_attention_core(
            mixed_qkv.to(self.model_dtype),
            b.to(self.model_dtype),
            a.to(self.model_dtype),
            core,
            _encode_layer_name(self.prefix),
        )
        # ... and after it: the gated norm and the output projection.
        core = layer.norm(core.reshape(-1, spec.head_v_dim))
        core = core * keras.activations.silu(z.reshape(-1, spec.head_v_dim))
        return layer.out_proj(core.reshape(num_tokens, 1, -1))

    def run_keras(self, hidden_states, output, metadata):
        """The layer's own `call` on each request's tokens, over its slot.

        Decode requests (one token each, first in vLLM's order) run as one
        batch, each row with its own slot's state; each prefill chunk runs
        alone, from its slot's state or, for a request's first chunk, from
        zeros, as KerasHub's cache starts.

        Args:
            hidden_states: `(num_tokens, 1, hidden)`.
            output: Filled with the layer's output, zeros past the
                scheduled tokens.
            metadata: This layer's `GDNAttentionMetadata` for the step.
        """
        output.zero_()
        if metadata.num_actual_tokens == 0:
            return
        if metadata.spec_sequence_masks is not None:
            raise NotImplementedError("speculative decoding with GDN layers")
        layer = self.keras_layer
        call = type(layer).call  # KerasHub's own, not the route
        slots = metadata.non_spec_state_indices_tensor
        starts = metadata.non_spec_query_start_loc.tolist()
        decodes = metadata.num_decodes
        if decodes:
            index = slots[:decodes]
            out, state = call(
                layer, hidden_states[:decodes], cache=self._read(index), cache_update_index=0
            )
            self._write(index, *state)
            output[:decodes] = out
        has_initial_state = metadata.has_initial_state
        for request in range(decodes, decodes + metadata.num_prefills):
            start, end = starts[request], starts[request + 1]
            index = slots[request : request + 1]
            cache = self._read(index) if bool(has_initial_state[request]) else self._zeros()
            out, state = call(
                layer,
                hidden_states[start:end].reshape(1, end - start, -1),
                cache=cache,
                cache_update_index=0,
            )
            self._write(index, *state)
            output[start:end] = out.reshape(end - start, 1, -1)

    def _recurrent_view(self):
        # vLLM declares `(heads, value, key)` but its CPU kernels, and so
        # every reader here, hold `(heads, key, value)`, KerasHub's layout.
        spec = self.spec
        recurrent = self.kv_cache[1]
        return recurrent.view(
            recurrent.shape[0], spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
        )

    def _conv_view(self):
        # KerasHub's `(slots, dim, width - 1)`.
        from vllm.model_executor.layers.mamba.mamba_utils import (
            is_conv_state_dim_first,
        )

        conv = self.kv_cache[0]
        return conv if is_conv_state_dim_first() else conv.transpose(1, 2)

    def _read(self, index):
        return self._conv_view()[index], self._recurrent_view()[index]

    def _write(self, index, conv, recurrent):
        self._conv_view()[index] = conv.to(self.kv_cache[0].dtype)
        self._recurrent_view()[index] = recurrent.to(torch.float32)

    def _zeros(self):
        spec = self.spec
        conv_dim = 2 * self.key_dim + self.value_dim
        return (
            torch.zeros(1, conv_dim, spec.conv_kernel_size - 1, dtype=self.kv_cache[0].dtype),
            torch.zeros(
                1, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim, dtype=torch.float32
            ),
        )


def _keras_gated_delta_net(
    hidden_states: torch.Tensor, output: torch.Tensor, layer_name: LayerNameType
) -> None:
    context = get_forward_context()
    state = context.no_compile_layers[_resolve_layer_name(layer_name)]
    if context.attn_metadata is None:  # profiling and dummy steps: no slots
        output.zero_()
        return
    state.run_keras(hidden_states, output, context.attn_metadata[state.prefix])


register_output_op("keras_gated_delta_net", _keras_gated_delta_net)
