"""A tiny Gemma4 assistant for the tiny Gemma4 target, and its own drafts.

The oracle of a Gemma4 MTP drafter is its preset's own
`Gemma4AssistantCausalLM.call_with_cache`, fed what vLLM's proposer feeds a
drafter: after the target has attended tokens `0..n-1` and chosen token
`n`, the first draft step takes token `n` (embedded by the target, scaled)
with the target's last hidden state at `n - 1`, at position `n - 1`, over
the target's cache of `0..n-1`; each further step takes the drafted token
and the step's `post_projection` output, at the same position.

`Gemma4CausalLM.generate(assistant_model=...)` pairs them otherwise on its
first cycle after the prompt (the prompt's last token with its own hidden
state, at its position), so it is not the oracle here; from its second
cycle on it pairs them as vLLM does. Greedy output with any drafter is the
target's own either way.
"""

import contextlib
import inspect

import keras
import keras_hub
import numpy as np

from vllm_keras_hub.testing import presets

# The assistant's shape: its own width and depth, and the target's heads on
# each kind of layer, since it attends over the target's cache. Ordered
# embeddings with 4 centroids, 2 active: half the vocabulary is masked at
# each draft.
ASSISTANT = dict(
    num_layers=2,
    hidden_dim=64,
    intermediate_dim=128,
    num_kv_shared_layers=2,
    hidden_size_per_layer_input=0,
)
NUM_CENTROIDS = 4
ACTIVE_CENTROIDS = 2


def build_tiny_assistant(target, directory, seed=0):
    """Saves a random-weight Gemma4 assistant for the tiny `target` preset.

    Args:
        target: A tiny `"gemma4"` preset folder (`presets.build_tiny_preset`).
        directory: Where to save; created if missing.
        seed: Weight initialisation seed.

    Returns:
        `directory`.
    """
    target_backbone = keras_hub.models.Backbone.from_preset(target)
    tokenizer = keras_hub.models.Tokenizer.from_preset(target)
    heads = {
        name: getattr(target_backbone, name)
        for name in (
            "vocabulary_size",
            "num_query_heads",
            "num_key_value_heads",
            "head_dim",
            "sliding_window_size",
            "sliding_window_pattern",
            "global_head_dim",
            "num_global_key_value_heads",
            "global_rope_partial_rotary_factor",
        )
    }
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.Gemma4Backbone(image_size=None, **heads, **ASSISTANT)
    assistant = keras_hub.models.Gemma4AssistantCausalLM(
        backbone=backbone,
        backbone_hidden_size=target_backbone.hidden_dim,
        num_centroids=NUM_CENTROIDS,
        centroid_intermediate_top_k=ACTIVE_CENTROIDS,
        use_ordered_embeddings=True,
        preprocessor=None,
    )
    vocabulary = heads["vocabulary_size"]
    ordering = np.random.default_rng(seed).permutation(vocabulary)
    assistant.token_ordering.assign(ordering.astype("float32"))
    for layer in backbone.transformer_layers:
        for variable in layer.weights:
            if len(variable.shape) >= 2:
                variable.assign(variable * presets.DEFAULT_LAYER_KERNEL_SCALE)
    assistant.save_to_preset(directory)
    tokenizer.save_to_preset(directory)
    return directory


def assistant_drafts(target, assistant, tokens, k):
    """The assistant's `k` greedy drafts after `tokens`, as vLLM feeds it.

    Args:
        target: The target's `Gemma4CausalLM`.
        assistant: The `Gemma4AssistantCausalLM`.
        tokens: The request's tokens so far, the last one just chosen by the
            target and not yet attended.
        k: Draft steps.
    """
    n = len(tokens) - 1
    ids = np.array([tokens[:n]], dtype="int32")
    hidden, cache = target._build_cache(ids, None, None, np.ones_like(ids), None)
    sources = {}
    for index, layer in enumerate(target.backbone.transformer_layers):
        if not layer.is_kv_shared_layer:
            sources[target.backbone.layer_types[index] == "full_attention"] = index
    scale = float(target.backbone.hidden_dim) ** 0.5
    last_hidden = hidden[:, n - 1 : n]
    token, drafts = tokens[n], []
    for _ in range(k):
        embedding = target.backbone.token_embedding(np.array([[token]])) * scale
        logits, last_hidden = assistant.call_with_cache(
            embedding,
            last_hidden,
            cache,
            n - 1,
            target_kv_source_full_idx=sources.get(True),
            target_kv_source_local_idx=sources.get(False),
        )
        token = int(keras.ops.argmax(logits[0, -1]))
        drafts.append(token)
    return drafts


def _record(drafter):
    """Wraps `drafter.propose` to record its rows; returns `(calls, undo)`."""
    propose = drafter.propose
    signature = inspect.signature(propose)
    calls = []

    def recording(*args, **kwargs):
        drafts = propose(*args, **kwargs)
        arguments = signature.bind(*args, **kwargs).arguments
        calls.append(
            (
                arguments["next_token_ids"].tolist(),
                arguments["common_attn_metadata"].seq_lens.tolist(),
                drafts.tolist(),
            )
        )
        return drafts

    drafter.propose = recording

    def undo():
        drafter.propose = propose

    return calls, undo


@contextlib.contextmanager
def recorded_drafts(llm):
    """Records each row of drafts the engine's proposer returns.

    An observer on an `in_process_llm` engine's drafter: the proposer and
    the model run as they would, and each call's chosen tokens, the
    requests' lengths in the target's cache and the `(batch, k)` drafts are
    appended to the yielded list.
    """
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    calls, undo = _record(executor.driver_worker.worker.model_runner.drafter)
    try:
        yield calls
    finally:
        undo()


def start_recording(worker):
    """`recorded_drafts` on a spawned worker (run with `collective_rpc`)."""
    drafter = worker.model_runner.drafter
    drafter._keras_hub_calls, _ = _record(drafter)


def recorded_calls(worker):
    """`(tensor-parallel rank, calls)` since `start_recording`, emptied."""
    from vllm.distributed import get_tensor_model_parallel_rank

    calls = worker.model_runner.drafter._keras_hub_calls
    taken = list(calls)
    calls.clear()
    return get_tensor_model_parallel_rank(), taken


def drafter_heads(worker):
    """`(rank, [(query heads, KV heads)] per drafter block)` on a worker."""
    from vllm.distributed import get_tensor_model_parallel_rank

    attention = worker.model_runner.drafter.model.attention
    heads = [(layer.num_heads, layer.num_kv_heads) for layer in attention]
    return get_tensor_model_parallel_rank(), heads


def expected_calls(tokens, prompt_length, calls, k, oracle):
    """Pairs one request's recorded drafts with the oracle's, step by step.

    Args:
        tokens: The request's prompt and output tokens.
        prompt_length: Its prompt's length.
        calls: `recorded_drafts`' calls of a batch of this request alone.
        k: Draft steps per call.
        oracle: `oracle(tokens_so_far)`, the drafts expected after them.

    Returns:
        `(recorded, expected)`: lists of `(chosen token, drafts)`, one per
        call that drafted for a token inside `tokens`. A call in the middle
        of a prompt's chunked prefill is left out: vLLM discards its drafts
        (its chosen token is none of the request's).
    """
    recorded, expected = [], []
    length = prompt_length + 1
    for next_tokens, seq_lens, drafts in calls:
        if seq_lens[0] < prompt_length:
            continue
        if length >= len(tokens):
            break
        recorded.append((next_tokens[0], drafts[0]))
        expected.append((tokens[length - 1], oracle(tokens[:length])))
        accepted = 0
        while accepted < k and length + accepted < len(tokens):
            if drafts[0][accepted] != tokens[length + accepted]:
                break
            accepted += 1
        length += accepted + 1
    return recorded, expected
