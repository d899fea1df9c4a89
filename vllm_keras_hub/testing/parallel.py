"""Tensor-parallel engines for tests, and what each rank holds."""

import contextlib
import math

from vllm_keras_hub.testing.engines import in_process_engine_env
from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS


@contextlib.contextmanager
def parallel_llm(model, tensor_parallel_size=1, pipeline_parallel_size=1, **kwargs):
    """A `KerasHubLLM` on vLLM's multiprocessing executor, one worker a rank.

    The engine core runs in this process (so `collective_rpc` can send the
    workers a test's function); the workers are spawned processes talking
    over vLLM's CPU communicator, as in serving.

    Args:
        model: Passed to `KerasHubLLM`.
        tensor_parallel_size: Tensor-parallel ranks.
        pipeline_parallel_size: Pipeline stages.
        **kwargs: `vllm.LLM` arguments over `TEST_ENGINE_KWARGS`.
    """
    from vllm_keras_hub.entrypoints.llm import KerasHubLLM

    with in_process_engine_env():
        llm = KerasHubLLM(
            model,
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
            **{**TEST_ENGINE_KWARGS, **kwargs},
        )
        try:
            yield llm
        finally:
            llm.close()
            del llm


def rank_report(worker):
    """What one worker's model holds; run on each with `collective_rpc`.

    Returns:
        A dict: `rank`; `linears`, `(held, full, shards)` elements of each
        vLLM parallel linear layer (`held` read from the tensors it holds,
        `held_elements`); `keras_kernels`, elements left in the
        Keras kernels those layers replaced; `heads`, `(query, kv)` heads
        of each vLLM `Attention`; `alibi_slopes` and `sinks` per layer;
        `experts`, each `FusedMoE`'s intermediate size on this rank;
        `head`, the output head's vocabulary rows here and in all;
        `input_rows`, the same for the input lookup, `lookup_is_head`
        whether it is the head's table, `tied` whether the preset ties
        them, `head_copies`, `"weight and packed"` where the head also
        looks up, else `"packed only"` (`"weight only"` where vLLM's CPU
        GEMM dispatch does not pack), and
        `keras_table`, elements left in Keras's table;
        `sliced_kernels`, `(held, whole)` elements of each Keras kernel
        sliced in place (`layers/parallel/parallel_mlp.py`), held where it
        is now; `states`, what each Gated DeltaNet layer holds (`heads`, `conv_channels`, `recurrent`
        slot shape, `a_log`).
    """
    from vllm.distributed import get_tensor_model_parallel_rank

    from vllm_keras_hub.layers.attention.attention import token_embedding
    from vllm_keras_hub.layers.parallel import vocab_parallel

    model = worker.model_runner.model
    linears = [
        (held_elements(layer), layer.input_size * layer.output_size, layer.tp_size)
        for layer in model.parallel_linears
        if hasattr(layer, "input_size")
    ]
    keras_kernels = sum(
        layer._kernel.value.numel()
        for layer in model.backbone._flatten_layers(include_self=False)
        if hasattr(layer, "_packed_kernel") and hasattr(layer, "_kernel")
    )
    sliced = [
        (kernel_elements(layer), math.prod(layer._tensor_parallel_whole_shape))
        for layer in model.backbone._flatten_layers(include_self=False)
        if hasattr(layer, "_tensor_parallel_whole_shape")
    ]
    embedding = token_embedding(model.backbone)
    table = vocab_parallel.vocab_parallel_table(embedding)
    specs = model.attention_specs
    return dict(
        sliced_kernels=sliced,
        keras_table=vocab_parallel.table_layer(embedding)._embeddings.value.numel(),
        input_rows=(table.num_embeddings_per_partition, table.org_vocab_size),
        lookup_is_head=table is model.lm_head,
        head_copies=_head_copies(model.lm_head),
        tied=getattr(embedding, "tie_weights", True),
        rank=get_tensor_model_parallel_rank(),
        linears=linears,
        keras_kernels=keras_kernels,
        heads=[(spec.num_heads, spec.num_kv_heads) for spec in specs],
        alibi_slopes=[spec.alibi_slopes for spec in specs],
        sinks=[spec.sinks for spec in specs],
        experts=[
            runner.routed_experts.intermediate_size_per_partition
            for runner in model.moe
        ],
        head=(model.lm_head.num_embeddings_per_partition, model.lm_head.org_vocab_size),
        states=[_state_report(state) for state in model.states],
    )


def _state_report(state):
    # What one Gated DeltaNet layer holds on this rank: its heads, its
    # convolution's channels, its slots' recurrent shape and its decay.
    layer = state.keras_layer
    return dict(
        heads=(state.spec.num_k_heads, state.spec.num_v_heads),
        conv_channels=layer.conv1d_weight.value.shape[0],
        recurrent=tuple(state._recurrent_view().shape[1:]),
        a_log=layer.A_log.value.float().tolist(),
    )


def held_elements(layer):
    """Elements of the weight a vLLM linear layer holds on this rank.

    Its weight tensor; or, once vLLM's CPU GEMM has prepacked it and freed
    the tensor, the matrix it handed oneDNN (the handler keeps its shape),
    or the tensors the GEMM it chose keeps.
    """
    import torch

    from vllm_keras_hub.layers.linear import onednn

    if layer.weight.numel():
        return layer.weight.numel()
    handler = onednn.handler(layer.cpu_linear)
    if handler is not None:
        return handler.k * handler.n
    cells = (cell.cell_contents for cell in layer.cpu_linear.__closure__ or ())
    return sum(value.numel() for value in cells if isinstance(value, torch.Tensor))


def kernel_elements(layer):
    """Elements of a Keras layer's kernel on this rank: Keras's tensor, or,
    once vLLM's CPU GEMM holds it (`layers/linear/linear.py`), what the GEMM keeps."""
    import functools

    import torch

    if layer._kernel.value.numel():
        return layer._kernel.value.numel()
    matmul = layer._packed_kernel.matmul
    if hasattr(matmul, "handler"):
        return matmul.handler.k * matmul.handler.n
    if isinstance(matmul, functools.partial):
        return held_elements(matmul.args[0])
    cells = (cell.cell_contents for cell in matmul.__closure__ or ())
    return sum(value.numel() for value in cells if isinstance(value, torch.Tensor))


def _head_copies(lm_head):
    from vllm_keras_hub.layers.linear import onednn

    if onednn.handler(lm_head.cpu_linear) is None:
        return "weight only"
    if lm_head.weight.numel() == 0:
        return "packed only"
    return "weight and packed"


def state_heads(worker):
    """`(key heads, value heads)` of each Gated DeltaNet layer one worker
    holds; run on each with `collective_rpc`, in any layout."""
    model = worker.model_runner.model
    return [(state.spec.num_k_heads, state.spec.num_v_heads) for state in model.states]


def stage_report(worker):
    """What one pipeline stage's worker holds; run with `collective_rpc`.

    Returns:
        A dict: `stage`, its `(start, end)` layers; `ranks`, its `(pp, tp)`
        ranks; `attention`, the names of its vLLM `Attention` layers;
        `kv_sharing`, each KV-sharing one's name to its target's;
        `states`, its recurrent-state layers (Gated DeltaNet);
        `experts`, its `FusedMoE` count; `others`, elements Keras holds
        for other stages' transformer layers; `embedding` and `head`,
        whether it holds the input table and an output projection;
        `vocab_parallel_head`, whether that is vLLM's `ParallelLMHead`;
        `tied`, whether the output projection is the input table;
        `vision_encoder`, elements its vision encoder holds (`None`
        without one); `model_class`, the vLLM model class's name.
    """
    from vllm.distributed import get_pp_group
    from vllm.distributed import get_tensor_model_parallel_rank

    from vllm_keras_hub.layers.attention.attention import token_embedding
    from vllm_keras_hub.layers.attention.attention import transformer_layers
    from vllm_keras_hub.layers.parallel import vocab_parallel

    model = worker.model_runner.model
    stage = model.stage
    layers = transformer_layers(model.backbone)
    own = set(range(stage.start, stage.end))

    def held(layer):
        return sum(v.value.numel() for v in layer.variables)

    embedding = token_embedding(model.backbone)
    tied = getattr(embedding, "tie_weights", True)
    if tied:
        output = embedding.embeddings.value.numel() > 0
    else:
        # Moved to vLLM's CPU GEMM, or still Keras's.
        output = hasattr(embedding, "_packed_kernel") or (
            embedding.__dict__["reverse_embeddings"].value.numel() > 0
        )
    return dict(
        stage=(stage.start, stage.end),
        ranks=(get_pp_group().rank_in_group, get_tensor_model_parallel_rank()),
        attention=[layer.layer_name for layer in model.attention],
        kv_sharing={
            layer.layer_name: layer.kv_sharing_target_layer_name
            for layer in model.attention
            if layer.kv_sharing_target_layer_name is not None
        },
        experts=len(model.moe),
        states=len(model.states),
        others=sum(held(layer) for i, layer in enumerate(layers) if i not in own),
        embedding=(
            embedding.embeddings.value.numel() > 0
            or vocab_parallel.vocab_parallel_table(embedding) is not None
        ),
        head=model.lm_head is not None or output,
        vocab_parallel_head=model.lm_head is not None,
        tied=tied,
        vision_encoder=(
            held(model.backbone.vision_encoder)
            if getattr(model.backbone, "vision_encoder", None) is not None
            else None
        ),
        model_class=type(model).__name__,
    )


def lora_report(worker):
    """The LoRA layers one worker's model holds; run with `collective_rpc`.

    Each worker's LoRA manager picks its own slot for an adapter (the order
    of a set of requests), so slots are named by the adapters they hold.

    Returns:
        A dict: `stage`, `rank`, and `layers`, adapter-file index to `(wrapper class,
        the base layer's shards, {adapter id: (its A, its B) as lists})`.
    """
    from vllm.distributed import get_pp_group
    from vllm.distributed import get_tensor_model_parallel_rank

    model = worker.model_runner.model
    slots = {
        adapter: slot
        for slot, adapter in enumerate(model.lora_manager.lora_index_to_id)
        if adapter is not None
    }
    layers = {
        key: (
            type(module).__name__,
            module.base_layer.tp_size,
            {
                adapter: (
                    module.lora_a_stacked[0][slot, 0].tolist(),
                    module.lora_b_stacked[0][slot, 0].tolist(),
                )
                for adapter, slot in slots.items()
            },
        )
        for key, module in model.lora_layers.items()
    }
    return dict(
        stage=get_pp_group().rank_in_group,
        rank=get_tensor_model_parallel_rank(),
        layers=layers,
    )


def image_rows_report(worker):
    """The image rows each of a worker's attention layers re-attended
    (`image_attention.ATTENDED_ROWS`); run with `collective_rpc`."""
    from vllm.distributed import get_pp_group

    from vllm_keras_hub.layers.attention import image_attention

    return get_pp_group().rank_in_group, dict(image_attention.ATTENDED_ROWS)
