"""vLLM's CPU GEMM under KerasHub layers: Keras's results, one weight copy."""

import functools

import keras
import pytest
import torch
from keras import ops

from vllm_keras_hub.compile.direct_calls import use_direct_calls
from vllm_keras_hub.compile.direct_calls_test import serving_step
from vllm_keras_hub.compile.direct_calls_test import tiny_gemma
from vllm_keras_hub.layers.linear.linear import matmul_plan
from vllm_keras_hub.layers.linear.linear import use_vllm_cpu_gemm

# Same math, another kernel library: float32 sums differ in the last bits.
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}


@pytest.mark.parametrize(
    "equation, plan",
    [
        ("btd,dnh->btnh", ((0, 1, 2), 1)),
        ("btnh,nhd->btd", ((0, 1, 2), 2)),
        ("btd,ndh->btnh", ((1, 0, 2), 1)),
        ("bsd,kdh->bskh", ((1, 0, 2), 1)),
        ("ab,cb->ac", ((1, 0), 1)),
        ("abc,cd->abd", ((0, 1), 1)),
        ("...b,bc->...c", ((0, 1), 1)),
        ("btd, df -> btf", ((0, 1), 1)),
        # Not a plain x @ W: a kernel axis kept per output position, a
        # permuted output, a repeated letter, a contraction not trailing.
        ("bij,ijk->bik", None),
        ("btd,dnh->bnth", None),
        ("ab,bc->ca", None),
        ("aab,bc->ac", None),
        ("bdt,dn->btn", None),
    ],
)
def test_matmul_plan(equation, plan):
    assert matmul_plan(equation) == plan


def layers_under_test(dtype):
    keras.utils.set_random_seed(0)
    return [
        keras.layers.Dense(48, activation="gelu", dtype=dtype),
        keras.layers.EinsumDense(
            "btd,dnh->btnh", output_shape=(None, 4, 8), bias_axes="nh", dtype=dtype
        ),
        keras.layers.EinsumDense(
            "btnh,nhd->btd", output_shape=(None, 32), dtype=dtype
        ),
        keras.layers.EinsumDense(
            "btd,ndh->btnh", output_shape=(None, 4, 8), dtype=dtype
        ),
    ]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layers_match_keras_and_free_their_kernel(dtype):
    dense, query, output, gemma_query = layers = layers_under_test(dtype)
    inputs = torch.randn(2, 5, 32).to(getattr(torch, dtype))

    def outputs():
        return [
            dense(inputs),
            query(inputs),
            output(query(inputs)),
            gemma_query(inputs),
        ]

    with torch.no_grad():
        expected = outputs()
        assert sum(use_vllm_cpu_gemm(layer, outputs) for layer in layers) == 4
        actual = outputs()
    for got, want in zip(actual, expected, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(
            got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype]
        )
    for layer in layers:
        assert layer._kernel.value.numel() == 0


def test_other_layers_keep_keras_matmul():
    keras.utils.set_random_seed(0)
    lora = keras.layers.Dense(16)
    mixed = keras.layers.Dense(16, dtype="mixed_bfloat16")
    batched = keras.layers.EinsumDense("bij,ijk->bik", output_shape=(3, 16))
    for layer in (lora, mixed):
        layer.build((None, 8))
    batched.build((None, 3, 8))
    lora.enable_lora(2)
    for layer in (lora, mixed, batched, keras.layers.Dense(16)):
        assert use_vllm_cpu_gemm(layer, lambda: None) == 0
        assert not layer.built or layer._kernel.value.numel() > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_backbone_matches_keras(dtype):
    backbone = tiny_gemma(dtype)
    with torch.no_grad():
        expected = serving_step(backbone, 7)
        use_direct_calls(backbone)
        # Per layer: q, k, v, output, gate, up, down.
        step = lambda: serving_step(backbone, 3)  # noqa: E731
        assert use_vllm_cpu_gemm(backbone, step) == 2 * 7
        actual = serving_step(backbone, 7)
    torch.testing.assert_close(
        actual, expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype]
    )


def test_compiles_without_graph_breaks():
    backbone = tiny_gemma("float32")
    use_direct_calls(backbone)
    use_vllm_cpu_gemm(backbone, lambda: serving_step(backbone, 3))
    explanation = torch._dynamo.explain(lambda: serving_step(backbone, 5))()
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_a_kernel_read_elsewhere_stays_with_keras():
    keras.utils.set_random_seed(0)
    read, unread = keras.layers.Dense(8), keras.layers.Dense(8)
    read.build((None, 4))
    unread.build((None, 8))
    model = keras.Sequential([keras.Input((4,)), read, unread])
    inputs = torch.randn(3, 4)
    with torch.no_grad():
        expected = ops.matmul(inputs, read.kernel)

        def step():
            # Like Gemma4's decoder block: code outside `read.call` multiplies by
            # its kernel.
            return ops.matmul(inputs, read.kernel), model(inputs)

        assert use_vllm_cpu_gemm(model, step) == 1
        torch.testing.assert_close(ops.matmul(inputs, read.kernel), expected)
    with pytest.raises(RuntimeError, match="moved to vLLM's CPU GEMM"):
        unread.kernel


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_untied_output_embedding_moves_and_tied_stays(dtype):
    keras.utils.set_random_seed(0)
    untied = keras.layers.ReversibleEmbedding(
        100, 16, tie_weights=False, logit_soft_cap=5.0, dtype=dtype
    )
    tied = keras.layers.ReversibleEmbedding(100, 16, dtype=dtype)
    token_ids = torch.tensor([[3, 7, 99]])
    hidden = torch.randn(4, 16).to(getattr(torch, dtype))
    for layer in (untied, tied):
        layer.build((None, None))
    with torch.no_grad():
        expected = untied(hidden, reverse=True), untied(token_ids)
        assert use_vllm_cpu_gemm(untied, lambda: untied(token_ids)) == 1
        assert use_vllm_cpu_gemm(tied, lambda: tied(token_ids)) == 0
        actual = untied(hidden, reverse=True), untied(token_ids)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(actual[0], expected[0], rtol=tolerance, atol=tolerance)
    assert torch.equal(actual[1], expected[1])
    assert untied.__dict__["reverse_embeddings"].value.numel() == 0
    with pytest.raises(RuntimeError, match="moved to vLLM's CPU GEMM"):
        untied.reverse_embeddings


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tied_output_embedding_projects_on_a_packed_copy_beside_its_table(dtype):
    """As vLLM's own CPU models hold a tied head: the lookup reads Keras's
    table, and the output projection a copy vLLM's GEMM dispatch packs of
    it, or, where the dispatch does not pack, the table itself."""
    keras.utils.set_random_seed(0)
    tied = keras.layers.ReversibleEmbedding(
        100, 16, logit_soft_cap=5.0, dtype=dtype
    )
    tied.build((None, None))
    token_ids = torch.tensor([[3, 7, 99]])
    hidden = torch.randn(2, 4, 16).to(getattr(torch, dtype))
    embeddings = tied.embeddings.value
    with torch.no_grad():
        expected = tied(hidden, reverse=True), tied(token_ids)
        assert use_vllm_cpu_gemm(tied, lambda: tied(token_ids)) == 0
        with torch.profiler.profile() as profile:
            actual = tied(hidden, reverse=True), tied(token_ids)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(actual[0], expected[0], rtol=tolerance, atol=tolerance)
    assert torch.equal(actual[1], expected[1])
    assert tied.embeddings.value is embeddings
    ops_run = {event.name for event in profile.events()}
    head = tied._packed_head
    # vLLM packs float32 for oneDNN on every CPU; bfloat16 only with
    # AVX-512 BF16 or AMX (where AMX's sgl-kernel may take it instead).
    assert hasattr(head, "handler") or dtype == "bfloat16"
    if hasattr(head, "handler"):
        # A whole second copy, and the projection runs on it, not on
        # aten's matmul over the table.
        assert head.handler.k * head.handler.n == embeddings.numel()
        assert "vllm_keras_hub::onednn_linear" in ops_run
        assert not ops_run & {"aten::mm", "aten::matmul"}
    elif not isinstance(head, functools.partial):
        # vLLM keeps its weight for `F.linear` (as on this AVX2 machine),
        # and that weight is Keras's table itself, not a copy.
        held = [
            cell.cell_contents
            for cell in head.__closure__
            if isinstance(cell.cell_contents, torch.Tensor)
        ]
        assert [t.data_ptr() for t in held] == [embeddings.data_ptr()]


def test_compiled_matmuls_are_plain_nodes_on_vllms_onednn_kernel():
    """On oneDNN (vLLM's float32 choice on x86), each packed matmul traces
    as one functional op, not vLLM's write into an allocated output, which
    AOTAutograd and Inductor must functionalize and take apart again."""
    from vllm.platforms import CpuArchEnum
    from vllm.platforms import current_platform

    if current_platform.get_cpu_architecture() != CpuArchEnum.X86:
        pytest.skip("vLLM's dispatch picks oneDNN for float32 on x86 CPUs only")
    backbone = tiny_gemma("float32")
    use_direct_calls(backbone)
    assert use_vllm_cpu_gemm(backbone, lambda: serving_step(backbone, 3)) == 2 * 7
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    with torch.no_grad():
        expected = serving_step(backbone, 5)
        torch._dynamo.reset()
        got = torch.compile(
            lambda: serving_step(backbone, 5), backend=backend, fullgraph=True
        )()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    targets = [str(node.target) for node in graphs[0].graph.nodes]
    assert targets.count("vllm_keras_hub.onednn_linear") == 2 * 7, targets
    assert not any("onednn_mm" in target for target in targets), targets


_LOAD_MEMORY_SCRIPT = """
import resource
from vllm_keras_hub import backend
backend.default_to_torch()
import keras, psutil, torch
from vllm_keras_hub.layers.linear.linear import use_vllm_cpu_gemm
from vllm_keras_hub.loading.heap import release_free_memory

def maxrss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

torch.set_num_threads(1)
# Gemma3-1B's MLP kernel: 31.9 MB, just under glibc's largest mmap threshold.
inputs = keras.Input((1152,))
x = inputs
for _ in range(8):
    x = keras.layers.Dense(6912)(x)
    x = keras.layers.Dense(1152)(x)
model = keras.Model(inputs, x)
weights = sum(v.value.numel() * 4 for v in model.weights if len(v.shape) == 2)
model(torch.ones(2, 1152))
# vLLM's first gemm dispatch imports modules lazily (PyAV's FFmpeg libraries
# among them): a one-time cost, not the packing's, so it is paid before.
warm = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8)])
use_vllm_cpu_gemm(warm, lambda: warm(torch.ones(2, 8)))
before, peak_before = psutil.Process().memory_info().rss, maxrss()
use_vllm_cpu_gemm(model, lambda: model(torch.ones(2, 1152)))
peak = maxrss() - max(before, peak_before)
release_free_memory()
after = psutil.Process().memory_info().rss
print(weights, peak, after - before)
"""


def test_loading_holds_one_extra_weight_and_returns_what_it_frees():
    """16 kernels of 31.9 MB: packing them adds at most a few weights' worth
    to the process's high-water mark (not a second copy of all 510 MB), and
    once freed memory is released the process holds one copy, not two.
    Read from the process (ru_maxrss, RSS), in a fresh interpreter."""
    import subprocess
    import sys

    from vllm_keras_hub.testing.user_env import user_env

    out = subprocess.run(
        [sys.executable, "-c", _LOAD_MEMORY_SCRIPT],
        capture_output=True, text=True, env=user_env(), timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    weights, peak, held = map(int, out.stdout.split()[-3:])
    one = 1152 * 6912 * 4
    assert weights == 16 * one
    # Packed copies replace Keras's: the packed weights (oneDNN may pad
    # them) against Keras's, give or take a few weights.
    assert peak <= 4 * one, (peak / one)
    # Releasing may also return what building the model left (negative).
    assert held <= 4 * one, (held / one)


@pytest.mark.parametrize("family", ["gemma4", "gemma4_moe"])
def test_gemma4_blocks_multiply_by_their_packed_mlp_kernels(family):
    """Gemma4's decoder block multiplies by its MLP kernels itself
    (`ops.matmul(x, self.gating_ffw.kernel)`): those kernels move too, and
    the block's own code multiplies by them on vLLM's GEMM (compiled with
    no graph break: `model_test.py`'s parity runs compile with
    `fullgraph`)."""
    from vllm_keras_hub.layers.attention import attention_test
    from vllm_keras_hub.layers.attention import attention
    from vllm_keras_hub.layers.attention.attention_test import family_of
    from vllm_keras_hub.layers.attention.attention_test import tiny_backbone
    from vllm_keras_hub.layers.linear.kernel_readers import BLOCKS

    backbone = tiny_backbone(family)
    attention.install(backbone, family_of(family))

    def step():
        def paged_attention(cache, query, key, value, *args, **kwargs):
            return cache, query * value.mean() + key.mean()

        token_ids = torch.arange(1, 8).reshape(-1, 1)
        with attention_test.serving_step(backbone, paged_attention, 7):
            return backbone(
                {
                    "token_ids": token_ids,
                    "padding_mask": torch.ones_like(token_ids),
                    "position_ids": torch.arange(7).reshape(-1, 1),
                },
                training=False,
            )

    blocks = backbone.transformer_layers
    columns, row = BLOCKS["Gemma4TextDecoderBlock"]
    mlps = [getattr(block, name) for block in blocks for name in (*columns, row)]
    with torch.no_grad():
        expected = step()
        use_direct_calls(backbone)
        use_vllm_cpu_gemm(backbone, step)
        assert all(layer._packed_kernel.freed for layer in mlps)
        actual = step()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="multiplied only by"):
        ops.matmul(torch.ones(1, mlps[0].kernel.in_size), mlps[0].kernel)
