"""Bidirectional attention within each image, on vLLM's CPU attention.

Gemma3 attends causally over text and bidirectionally within each image's
soft tokens (`Gemma3DecoderBlock._compute_image_bidirectional_attention_mask`):
an image token also sees the image tokens after it. So do the sliding-window
layers of Gemma4 presets with `use_vision_bidirectional_attention`. vLLM
0.32's CPU attention has no such mask (its own Gemma3 serves images causally
there). So each marked attention layer (`mark`) first runs as usual,
causally, which also writes the step's keys and values to the paged cache;
then the image rows are attended again with a second call of the same
kernel, non-causal, each image's rows over the request's cache up to the
image's last token, within the layer's sliding window as KerasHub's mask
has it. (Gemma4's mask, (causal and windowed) or within the image, is that
band while an image fits in the window: `export/image_format.py` refuses others.)
vLLM must never split an image across steps (`disable_chunked_mm_input` and
`scheduler.ImageScheduler`).

The image rows of a step come from `is_multimodal`, which vLLM hands the
model's `embed_input_ids` before each step (`set_step`); the second call is
the custom op `vllm_keras_hub::image_attention`, opaque to torch.compile.
"""

import collections

import torch
from vllm.forward_context import get_forward_context
from vllm.utils.torch_utils import LayerNameType
from vllm.utils.torch_utils import _encode_layer_name
from vllm.utils.torch_utils import _resolve_layer_name

from vllm_keras_hub.layers import step
from vllm_keras_hub.layers.custom_ops import register_output_op


class ImageSplitError(RuntimeError):
    """An image's tokens arrived in two steps; its attention cannot be exact."""


class ImageMaskError(RuntimeError):
    """A step's image mask does not fit the step; its attention cannot be exact."""


_MARK = "_keras_hub_bidirectional_images"

# Layer name -> image rows it has re-attended, in this process: what a
# pipeline stage's layers attended is otherwise invisible from outside.
ATTENDED_ROWS = collections.Counter()


def mark(attention, bidirectional):
    """Marks whether `attention`'s image rows attend bidirectionally.

    Args:
        attention: A vLLM `Attention` of the model.
        bidirectional: Whether its layer attends within each image both ways.
    """
    setattr(attention, _MARK, bool(bidirectional))


def marked(attention):
    """Whether `mark` marked `attention` bidirectional."""
    return getattr(attention, _MARK, False)


def set_step(is_multimodal, spans_end_prompts=False):
    """Records which of the next step's tokens are image tokens.

    Args:
        is_multimodal: `(num_tokens,)` bool, or `None` for a text-only step.
        spans_end_prompts: Whether an image's span may end its prompt
            (PaliGemma's spans the whole prompt, `families/pali_gemma/media.py`).
    """
    is_image = None
    if is_multimodal is not None and bool(is_multimodal.any()):
        is_image = is_multimodal.to("cpu", torch.bool)
    context = step.current()
    context.is_image = is_image
    context.spans_end_prompts = spans_end_prompts
    context.image_metadata = None
    context.image_spans = {}


def flag_column(rows):
    """The step's image flags as a column beside a stage's hidden states.

    Under pipeline parallelism only the first stage embeds the step, so it
    sends the flags on: 1 at image rows, 0 at the step's other flagged
    rows, -1 past them and in a text-only step.

    Args:
        rows: The hidden states' rows.
    """
    column = torch.full((rows, 1), -1.0)
    is_image = step.current().is_image
    if is_image is not None:
        column[: len(is_image), 0] = is_image.to(column.dtype)
    return column


def set_step_from_column(column, spans_end_prompts=False):
    """`set_step` on a later pipeline stage, from `flag_column`'s column."""
    flags = column[:, 0].to("cpu", torch.float32)
    flags = flags[flags >= 0]
    set_step(flags > 0.5 if len(flags) else None, spans_end_prompts)


def image_spans(is_image, query_start_loc, seq_lens, spans_end_prompts=False):
    """The image spans of a step: rows, and the context each attends.

    Args:
        is_image: `(num_tokens,)` bool, True at image tokens.
        query_start_loc: `(num_requests + 1,)` each request's first row.
        seq_lens: `(num_requests,)` each request's length after the step.
        spans_end_prompts: Whether a span may end where its request's rows
            do: a prompt-long span, which vLLM never splits (as it never
            splits an image: `disable_chunked_mm_input`).

    Returns:
        A list of `(request, first_row, end_row, seq_len)`: rows
        `[first_row, end_row)` are one image's tokens in this step, which
        attend to the request's tokens `[0, seq_len)`, up to the image's end.

    Raises:
        ImageSplitError: an image's tokens continue past the step.
    """
    spans = []
    starts = query_start_loc.tolist()
    lengths = seq_lens.tolist()
    flags = is_image.tolist()
    for request, (first, end) in enumerate(zip(starts[:-1], starts[1:])):
        row = first
        while row < end:
            if not flags[row]:
                row += 1
                continue
            start = row
            while row < end and flags[row]:
                row += 1
            if row == end and not spans_end_prompts:
                # A prompt never ends in an image token (its end marker
                # follows), so the image goes on in a later step.
                raise ImageSplitError(
                    "An image's tokens were scheduled over two steps, so its "
                    "bidirectional attention cannot be computed exactly. "
                    "Serve with --disable-chunked-mm-input and --scheduler-cls "
                    "vllm_keras_hub.scheduler.ImageScheduler."
                )
            position_of_end = lengths[request] - (end - row)
            spans.append((request, start, row, position_of_end))
    return spans


def attend_images(attention, query, output):
    """Re-attends the step's image rows of `attention`'s output.

    Args:
        attention: The layer's vLLM `Attention`.
        query: The step's queries, as `attention` was given them (one row
            of `heads * head_dim` per token).
        output: `(num_tokens, heads * head_dim)`: `attention`'s causal
            output; the image rows are overwritten.

    Returns:
        `output`.
    """
    # Called in every step (whether a step has images is decided at run
    # time, inside the op, not while torch.compile traces).
    torch.ops.vllm_keras_hub.image_attention(
        query, output, _encode_layer_name(attention.layer_name)
    )
    return output


def _image_attention(
    query: torch.Tensor, output: torch.Tensor, layer_name: LayerNameType
) -> None:
    context = get_forward_context()
    name = _resolve_layer_name(layer_name)
    spans = step_spans(context, name)
    if not spans:
        return
    ATTENDED_ROWS[name] += sum(end - first for _, first, end, _ in spans)
    layer = context.no_compile_layers[name]
    metadata = context.attn_metadata[name]
    heads, head_dim = layer.impl.num_heads, layer.impl.head_size
    queries = query.reshape(-1, heads, head_dim)
    window = layer.impl.sliding_window
    plain = [span for span in spans if window == -1 or span[3] <= window]
    if plain:
        _attend_within(layer, metadata, queries, output, plain)
    for span in spans:
        if span not in plain:
            _attend_within_window(layer, metadata, queries, output, span, window)


def step_spans(context, layer_name):
    """The image spans of `layer_name`'s rows in the step `context` runs.

    Args:
        context: vLLM's forward context of the step.
        layer_name: An attention layer's name.

    Returns:
        `image_spans`'s list; empty in a step with no images.

    Raises:
        ImageMaskError: the image mask set for this step does not have one
            flag per token of it.
    """
    current = step.current()
    if context.attn_metadata is None or current.is_image is None:
        return []
    if current.image_metadata is None:
        current.image_metadata = context.attn_metadata
    elif current.image_metadata is not context.attn_metadata:
        # A step whose tokens vLLM did not embed (`set_step` marks each it
        # does): its warm-up and profiling runs, which carry no images.
        return []
    metadata = context.attn_metadata[layer_name]
    if len(current.is_image) != metadata.num_actual_tokens:
        raise ImageMaskError(
            f"The step's image mask has {len(current.is_image)} flags for "
            f"{metadata.num_actual_tokens} tokens; its images cannot be "
            "attended exactly."
        )
    key = id(metadata)
    if key not in current.image_spans:
        current.image_spans[key] = image_spans(
            current.is_image,
            metadata.query_start_loc.cpu(),
            metadata.seq_lens.cpu(),
            current.spans_end_prompts,
        )
    return current.image_spans[key]


def _attend_within(layer, metadata, queries, output, spans):
    # Each image's rows over the request's tokens up to the image's end:
    # all of them are within any window the layer has.
    rows = torch.cat([torch.arange(start, end) for _, start, end, _ in spans])
    result = _kernel(
        layer,
        queries[rows].contiguous(),
        [end - start for _, start, end, _ in spans],
        [length for *_, length in spans],
        metadata.block_table[[request for request, *_ in spans]],
        window=-1,
    )
    _write(output, rows, result)


def _attend_within_window(layer, metadata, queries, output, span, window):
    # An image ending past the window. The kernel's window is KerasHub's
    # (|query - key| < window), but non-causal queries sit at positions 0,
    # 1, ... of their block table: the table starts at the block holding
    # the first key any image row sees, and the rows from there to the
    # image are attended too (zero queries), then dropped.
    request, start, end, length = span
    block_size = layer.kv_cache.shape[2]
    first = length - (end - start)  # the first image row's position
    offset = max(0, first - window + 1) // block_size * block_size
    padded = queries.new_zeros((length - offset, *queries.shape[1:]))
    padded[first - offset :] = queries[start:end]
    table = metadata.block_table[request]
    shifted = torch.zeros_like(table)
    shifted[: len(table) - offset // block_size] = table[offset // block_size :]
    result = _kernel(
        layer, padded, [len(padded)], [length - offset], shifted[None], window
    )
    _write(output, torch.arange(start, end), result[first - offset :])


def _kernel(layer, queries, query_lengths, seq_lens, block_table, window):
    """vLLM's CPU attention, non-causal, over `layer`'s paged cache."""
    from vllm import _custom_ops as ops

    impl = layer.impl
    query_start_loc = torch.tensor([0, *query_lengths]).cumsum(0).int()
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
    scheduler_metadata = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(seq_lens),
        num_heads=impl.num_heads,
        num_kv_heads=impl.num_kv_heads,
        head_dim=impl.head_size,
        seq_lens=seq_lens,
        dtype=queries.dtype,
        query_start_loc=query_start_loc,
        causal=False,
        sliding_window_size=window,
        isa=layer.isa,
        enable_kv_split=False,
        kv_cache_dtype=impl.kv_cache_dtype,
    )
    num_blocks, kv_heads, block_size, _ = layer.kv_cache.shape
    kv_cache = layer.kv_cache.view(num_blocks, kv_heads, block_size * 2, -1)
    key_cache, value_cache = kv_cache.chunk(2, dim=2)
    result = torch.empty_like(queries)
    ops.cpu_attention_with_kv_cache(
        query=queries,
        key_cache=key_cache,
        value_cache=value_cache,
        output=result,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        scale=impl.scale,
        causal=False,
        alibi_slopes=None,
        sliding_window=window,
        block_table=block_table,
        softcap=impl.logits_soft_cap,
        scheduler_metadata=scheduler_metadata,
        s_aux=None,
        k_scale=layer._k_scale_float,
        v_scale=layer._v_scale_float,
        kv_cache_dtype=impl.kv_cache_dtype,
    )
    return result


def _write(output, rows, result):
    heads, head_dim = result.shape[1:]
    output.view(-1, heads, head_dim)[rows] = result.to(output.dtype)


register_output_op("image_attention", _image_attention)
