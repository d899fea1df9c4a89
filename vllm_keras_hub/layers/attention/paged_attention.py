"""A routed attention layer's own kernel: the vLLM `Attention` it was built with.

Each routed KerasHub attention layer holds its kernel (`ATTENTION`), bound
when the model is built (`bind`): the vLLM `Attention` made for it, whose
heads, scale, window, soft cap, ALiBi slopes, sinks and KV sharing were
fixed then, from what the start-up probe recorded. A route of ours hands it
the layer's q/k/v (`paged_attention`). keras-hub's own routes reach vLLM
only through keras-hub's bridge, which hands the n-th call the n-th entry
of its context's `kv_caches`: `serving` puts the same kernels there, in
layer order. Per step, only the step itself changes: the positions, vLLM's
forward context, and what `step.py` holds.

A kernel is called as keras-hub's bridge calls its paged-attention
function, without the cache: `kernel(query, key, value, scale, head_size,
num_heads, num_kv_heads, sliding_window=None, soft_cap=None, **options)`,
q/k/v flattened to one row of `heads * head_size` per token. What a built
kernel was built with, it ignores; the probe's kernel records it.
"""

import contextlib

from keras import ops
from keras_hub.src.vllm.context import vllm_context_scope

from vllm_keras_hub.layers import step
from vllm_keras_hub.layers.attention import image_attention

# The attribute a routed attention layer keeps its kernel in.
ATTENTION = "_vllm_attention"


class Served:
    """A layer's vLLM `Attention`, as a served step calls it.

    Args:
        attention: The layer's vLLM `Attention`.
        dtype: The model's torch dtype; queries, keys and values are cast to it.
        index: Its index among the model's attending layers.
    """

    def __init__(self, attention, dtype, index):
        self.attention = attention
        self.dtype = dtype
        self.index = index
        # It attends over its target's cache and writes none.
        self.reads_only = attention.kv_sharing_target_layer_name is not None

    def __call__(self, query, key, value, *built_with, **options):
        step.current().routed.attention.append(self.index)
        query = query.to(self.dtype)
        if self.reads_only:
            output = self.attention(query, None, None)
        else:
            output = self.attention(query, key.to(self.dtype), value.to(self.dtype))
        if image_attention.marked(self.attention):
            output = image_attention.attend_images(self.attention, query, output)
        return output


def paged_attention(
    layer,
    query,
    key,
    value,
    scale,
    num_kv_heads=None,
    sliding_window=None,
    soft_cap=None,
    **options,
):
    """`layer`'s heads through its own kernel, in KerasHub's layout.

    Args:
        layer: The routed attention layer.
        query, key, value: `(..., heads, head_size)` projected heads; K/V
            unexpanded (their own head count).
        scale: The softmax scale.
        num_kv_heads: If given, checked against `key`'s heads: a caller
            that expanded K/V would break grouped-query attention.
        sliding_window: Tokens each query sees, itself included, or `None`.
        soft_cap: The attention-logit soft cap, or `None`.
        **options: `alibi_slopes`, `sinks`, `kv_sharing_target`.

    Returns:
        The output, shaped as `query`.
    """
    num_heads, head_size = query.shape[-2:]
    kv_heads = key.shape[-2]
    if num_kv_heads is not None and kv_heads != num_kv_heads:
        raise ValueError(
            f"{layer.name} hands {kv_heads} key/value heads to vLLM, not its "
            f"{num_kv_heads}: K/V must be unexpanded."
        )
    output = getattr(layer, ATTENTION)(
        ops.reshape(query, (-1, num_heads * head_size)),
        ops.reshape(key, (-1, kv_heads * head_size)),
        ops.reshape(value, (-1, kv_heads * head_size)),
        scale,
        head_size,
        num_heads,
        kv_heads,
        sliding_window=sliding_window,
        soft_cap=soft_cap,
        **options,
    )
    return ops.reshape(output, (*query.shape[:-2], num_heads, head_size))


def _through_bridge(kernel, query, key, value, *args, **kwargs):
    # keras-hub's bridge: `kernel` is its context's n-th `kv_caches` entry,
    # returned as the "updated cache" (vLLM's `Attention` keeps its own).
    return kernel, kernel(query, key, value, *args, **kwargs)


@contextlib.contextmanager
def serving(kernels, positions):
    """keras-hub's serving context for one step, on `kernels`.

    Args:
        kernels: The attending layers' kernels in call order: what
            keras-hub's own routes reach through its bridge.
        positions: `(num_tokens,)` vLLM's per-token positions.
    """
    with vllm_context_scope(
        paged_attention_func=_through_bridge,
        positions=positions,
        kv_caches=kernels,
    ):
        yield


def bind(layers, kernels):
    """Gives each of `layers` its kernel, as the model is built.

    Args:
        layers: The routed attention layers, in call order.
        kernels: One kernel each.
    """
    for layer, kernel in zip(layers, kernels, strict=True):
        setattr(layer, ATTENTION, kernel)
