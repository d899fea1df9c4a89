"""The vocabulary under tensor parallelism: each rank holds its rows.

As in vLLM's own models, the output head is a `ParallelLMHead` and the
input embedding a `VocabParallelEmbedding`, each holding this rank's rows
of the vocabulary. A tied table is one tensor on a rank that both looks up
and projects (vLLM's `tie_weights`): the head's. Keras's table is then
released, so a rank holds `1 / ranks` of a vocabulary that can be most of
a small model (Gemma3 1B: 262,144 x 1,152).

The KerasHub embedding layer keeps its place in the backbone's graph (and
Gemma's scaling after it); only its lookup becomes vLLM's, which masks the
ids outside the rank's rows and all-reduces.
"""

from keras import ops

from vllm_keras_hub.parallel_settings import UnsupportedParallelismError

_LOOKUP_CLASSES = {}


def table_layer(embedding):
    """The Keras layer holding the token table of `token_embedding(backbone)`.

    A `ReversibleEmbedding` itself, or for Gemma3n (whose text model's
    `token_embedding` is a method reading its scaled embedding's table) the
    plain `Embedding` inside that.
    """
    text_model = getattr(embedding, "__self__", None)
    if text_model is not None:
        return text_model.embed_tokens.embedding
    return embedding


def head(embedding, prefix, weights):
    """The output projection as vLLM's `ParallelLMHead` over the vocabulary.

    Each rank computes the logits of its slice of the vocabulary and vLLM's
    `LogitsProcessor` gathers them (and applies the final soft cap, as
    KerasHub does after its output projection). Replicating the head
    instead cost 30% of the throughput at 32 requests on 2 ranks (bench,
    `llama_tp2`): every rank multiplied by the whole vocabulary.

    An untied output projection moves to the head and Keras's copy is
    freed; the caller frees a tied table once the input lookup is made,
    then calls `prepare_head`.

    Call inside `set_current_vllm_config`.

    Args:
        embedding: `token_embedding(backbone)`.
        prefix: The head's name.
        weights: The backbone's `PresetWeights`.

    Returns:
        `(head, logits_processor)`; `logits_processor(head, hidden_states)`
        gives the logits (on the ranks vLLM samples on).
    """
    from keras.layers import ReversibleEmbedding
    from keras.src.backend.torch.core import to_torch_dtype
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    text_model = getattr(embedding, "__self__", None)
    if text_model is not None:
        # Gemma3n: always tied, its soft cap on the text model.
        soft_cap = text_model.final_logit_soft_cap
        table, axis = table_layer(embedding).embeddings, 0
    elif isinstance(embedding, ReversibleEmbedding) and not embedding.reverse_dtype:
        soft_cap = embedding.logit_soft_cap
        if embedding.tie_weights:
            table, axis = embedding.embeddings, 0
        else:
            # Stored `(hidden, vocab)`: the rank's rows are columns there.
            table, axis = embedding.reverse_embeddings, 1
    else:
        raise UnsupportedParallelismError(
            f"{embedding.name} ({type(embedding).__name__}) is not a plain "
            "ReversibleEmbedding; its output projection cannot be sharded."
        )
    vocab, hidden = table.shape[axis], table.shape[1 - axis]
    lm_head = ParallelLMHead(
        vocab, hidden, params_dtype=to_torch_dtype(table.dtype), prefix=prefix
    )
    _load_rows(lm_head, table, axis, weights)
    if axis == 1:
        weights.release([table])
    return lm_head, LogitsProcessor(vocab, soft_cap=soft_cap)


def _load_rows(table, variable, axis, weights):
    """Loads this rank's vocabulary rows of `variable` into vLLM's `table`.

    As `VocabParallelEmbedding.weight_loader` does (its rows, zeros in the
    padding after them), but reading only those rows from the preset: the
    whole table at once would be a rank's largest allocation (Gemma3 1B:
    1.2 GB, where the rank keeps 0.6 GB).
    """
    indices = table.shard_indices
    start, stop = indices.org_vocab_start_index, indices.org_vocab_end_index
    rows = weights.read_slice(variable, start, stop, axis).detach()
    if axis == 1:
        rows = rows.t()
    table.weight.data[: stop - start].copy_(rows)
    table.weight.data[stop - start :].fill_(0)


def prepare_head(lm_head, looks_up):
    """Readies `lm_head`'s matmul once it is known whether it also looks up.

    On the CPU, as vLLM's embedding method does: a table that also looks
    up keeps its weight beside the copy the GEMM packs
    (`remove_weight=False`), and one that only projects keeps the packed
    copy alone. Elsewhere vLLM's own.

    Args:
        lm_head: The `ParallelLMHead` from `head`.
        looks_up: Whether it is also the input lookup (tied, first stage).
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        dispatch_cpu_unquantized_gemm(lm_head, remove_weight=not looks_up)
    else:
        lm_head.quant_method.process_weights_after_loading(lm_head)
    # The layer's own method instance (`VocabParallelEmbedding` makes one).
    lm_head.quant_method.process_weights_after_loading = _processed


def _processed(layer):
    # vLLM's `BaseModelLoader.load_model` processes every layer's weights
    # again after `load_weights`; this head's are processed here, once, and
    # a second pass would pack a second copy beside the one it keeps.
    pass


def input_lookup(embedding, lm_head, prefix, weights):
    """Makes `embedding`'s lookup vLLM's, over this rank's rows.

    Call inside `set_current_vllm_config`, before Keras's table is released.

    Args:
        embedding: `token_embedding(backbone)`.
        lm_head: This rank's `ParallelLMHead`, or `None` on a stage
            without the head.
        prefix: The name of a new `VocabParallelEmbedding`.
        weights: The backbone's `PresetWeights`.

    Returns:
        The `VocabParallelEmbedding` that looks up: `lm_head` itself for a
        tied table, else a new one, to be registered as a submodule.
    """
    from keras.src.backend.torch.core import to_torch_dtype
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        VocabParallelEmbedding,
    )

    layer = table_layer(embedding)
    if lm_head is not None and getattr(layer, "tie_weights", True):
        table = lm_head
    else:
        variable = layer.embeddings
        table = VocabParallelEmbedding(
            *variable.shape, params_dtype=to_torch_dtype(variable.dtype), prefix=prefix
        )
        _load_rows(table, variable, 0, weights)
    layer.__dict__["_vocab_parallel"] = table
    layer.__class__ = _lookup_class(type(layer))
    return table


def vocab_parallel_table(embedding):
    """The `VocabParallelEmbedding` that `embedding` looks up in, if any."""
    return table_layer(embedding).__dict__.get("_vocab_parallel")


def lookup(embedding, token_ids):
    """`embedding`'s vocabulary-parallel lookup of `token_ids`."""
    return _lookup(vocab_parallel_table(embedding), token_ids)


def _lookup(table, token_ids):
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        VocabParallelEmbedding,
    )

    # `ParallelLMHead.forward` refuses to run; its lookup is its base's.
    return VocabParallelEmbedding.forward(table, token_ids)


def _lookup_class(cls):
    if cls not in _LOOKUP_CLASSES:

        def call(self, inputs, reverse=False):
            if reverse:
                raise RuntimeError(
                    f"{self.name}: under tensor parallelism the output "
                    "projection is vLLM's ParallelLMHead, not this layer."
                )
            table = self.__dict__["_vocab_parallel"]
            return ops.cast(_lookup(table, inputs), self.compute_dtype)

        _LOOKUP_CLASSES[cls] = type(cls.__name__, (cls,), {"call": call})
    return _LOOKUP_CLASSES[cls]
