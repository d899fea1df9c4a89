"""Tensor and pipeline parallelism: each rank holds its part, and the tokens
stay the same.

Two ranks on vLLM's multiprocessing executor and CPU communicator (gloo plus
shared memory), one spawned worker per rank, each bound to one core with
`VLLM_CPU_OMP_THREADS_BIND="0|1"` as the README tells CPU users on one NUMA
node. Every case serves a mixed batch with chunked prefill and checks it
against the preset's own `CausalLM.generate()`, then asks each rank what it
holds. The server case runs `vllm-keras-hub serve` with 2 ranks on 2 vLLM
nodes on loopback.

All-reduce sums the ranks' partial outputs in another order than one matmul
does, so logits differ in the last bits; the tiny presets' widened logits
keep greedy tokens exact (checked, not assumed: no tolerance is applied).
"""

import contextlib
import subprocess

import pytest

from tests.model_test import CHUNK
from tests.model_test import FULL_FORWARD_ORACLE
from tests.model_test import GREEDY
from tests.model_test import MAX_NEW_TOKENS
from tests.model_test import PROMPTS
from vllm_keras_hub.testing import audio
from vllm_keras_hub.testing import support_matrix
from vllm_keras_hub.testing import videos
from vllm_keras_hub.testing.image_oracle import keras_hub_greedy_with_images
from vllm_keras_hub.testing.images import assert_tokens
from vllm_keras_hub.testing.images import batch_prompts
from vllm_keras_hub.testing.images import image_positions
from vllm_keras_hub.testing.parallel import image_rows_report
from vllm_keras_hub.testing.parallel import parallel_llm
from vllm_keras_hub.testing.parallel import rank_report
from vllm_keras_hub.testing.parallel import stage_report
from vllm_keras_hub.testing.parallel import state_heads
from vllm_keras_hub.testing.presets import TINY_FAMILIES
from vllm_keras_hub.testing.server import assert_served_greedy
from vllm_keras_hub.testing.server import end_process_group
from vllm_keras_hub.testing.server import free_port
from vllm_keras_hub.testing.server import greedy_ids
from vllm_keras_hub.testing.server import requests_per_engine
from vllm_keras_hub.testing.server import running_server
from vllm_keras_hub.testing.server import serve_command
from vllm_keras_hub.testing.user_env import user_env

# One core per rank: vLLM's automatic binding wants a NUMA node per rank.
BIND = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}

# family -> what it proves beyond plain GQA.
CASES = {
    "llama3": "GQA, compiled",
    "gemma2": "soft caps and a sliding window",
    "gemma": "one KV head, replicated on both ranks",
    "bloom": "ALiBi slopes cut per rank, a row-parallel bias added once",
    "gpt_oss": "attention sinks cut per rank, experts on vLLM's FusedMoE",
    "qwen3_moe": "q/k norms, experts on vLLM's FusedMoE",
    "mistral": "a sliding window",
    "qwen3": "per-head q/k norms",
    "phi3": "Phi-3's attention and MLP",
    "falcon": "ALiBi slopes cut per rank, in Falcon's attention",
    "mixtral": "Mixtral's experts on vLLM's FusedMoE",
    "qwen_moe": "a shared expert kept whole on every rank",
    "gemma3": "per-head q/k norms, sliding and global layers",
    "gpt2": "learned positions, q/k/v and row biases",
    "opt": "learned positions, q/k/v and row biases",
    "gpt_neox": "one fused per-head q/k/v projection, partial RoPE",
    "smollm3": "flat q/k/v projections, a NoPE layer",
    "qwen": "q/k/v biases cut per rank",
    "gemma4": "KV-sharing layers, per-layer inputs, K = V global layers",
    "gemma4_moe": "a dense MLP sliced beside experts on vLLM's FusedMoE",
    "gemma3n": "activation sparsity over the whole width, AltUp, KV sharing",
    "qwen3_5": "Gated DeltaNet heads and state per rank, a gated query",
    "qwen3_5_moe": "Gated DeltaNet heads per rank, experts and a gated shared expert",
    "llama": "Llama's attention and MLP",
    "phi3_su": "SU-scaled rotary tables",
}


# Key and value projections whole on both ranks: Gemma's one KV head in
# each of its 2 layers; Gemma4's one global KV head, whose layer has a key
# projection only (K = V), and whose KV-sharing layers have none.
REPLICATED_KV_PROJECTIONS = {"gemma": 4, "gemma4": 1, "gemma4_moe": 1}


@pytest.fixture(autouse=True)
def _bind_threads(monkeypatch):
    for name, value in BIND.items():
        monkeypatch.setenv(name, value)


def _single_rank(preset):
    """The attention specs, expert widths and GDN layers of the whole model.

    Each GDN layer as `(key heads, value heads, key head size, value head
    size, A_log)`.
    """
    import keras
    import keras_hub

    from vllm_keras_hub.export.preset_folder import read_preset
    from vllm_keras_hub.layers.attention import attention
    from vllm_keras_hub.layers.moe import moe_routes
    from vllm_keras_hub.layers.state import state_routes
    from vllm_keras_hub.models import pipeline
    from vllm_keras_hub.models import probe

    backbone = keras_hub.models.Backbone.from_preset(preset)
    attention.install(backbone, read_preset(preset)[0])
    blocks = moe_routes.install(backbone)
    widths = [
        moe_routes.route_of(block).spec(block).intermediate_size for block in blocks
    ]
    gdn = [
        (
            layer.num_k_heads,
            layer.num_v_heads,
            layer.head_k_dim,
            layer.head_v_dim,
            keras.ops.convert_to_numpy(layer.A_log).tolist(),
        )
        for layer in map(state_routes.state_layer, attention.transformer_layers(backbone))
        if layer is not None
    ]
    return probe.run(pipeline.stage(backbone), blocks).specs, widths, gdn


@pytest.mark.parametrize("family", sorted(CASES))
def test_tensor_parallel_greedy_parity(family, shared):
    preset = shared.preset(family)
    expected = shared.oracle(
        preset, PROMPTS, MAX_NEW_TOKENS, full_forward=family in FULL_FORWARD_ORACLE
    )
    assert max(len(ids) for ids, _ in expected) > CHUNK
    with parallel_llm(
        f"keras_hub:{preset}",
        tensor_parallel_size=2,
        max_num_batched_tokens=CHUNK,
        enable_chunked_prefill=True,
        enforce_eager=family != "llama3",
    ) as llm:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        reports = sorted(llm.collective_rpc(rank_report), key=lambda r: r["rank"])
    support_matrix.record(family, TINY_FAMILIES[family][1], tp2="FAIL")
    _assert_greedy_parity(outputs, expected)
    support_matrix.record(family, TINY_FAMILIES[family][1], tp2="pass")

    specs, expert_widths, gdn_layers = _single_rank(preset)
    assert [report["rank"] for report in reports] == [0, 1]
    for report in reports:
        # Every sharded matmul holds 1/2 of its weight on its rank (a
        # replicated KV head: all of it), read from what the rank holds,
        # and Keras's copies are gone.
        assert report["linears"]
        for held, full, shards in report["linears"]:
            assert held * shards == full
        replicated = [shards for _, _, shards in report["linears"]].count(1)
        assert replicated == REPLICATED_KV_PROJECTIONS.get(family, 0)
        # Gemma4's blocks multiply by their MLP kernels themselves: each rank
        # keeps half of every one, then packed for vLLM's CPU GEMM.
        sliced = report["sliced_kernels"]
        assert len(sliced) == (3 * len(specs) if family.startswith("gemma4") else 0)
        assert all(2 * held == whole for held, whole in sliced)
        assert report["keras_kernels"] == 0
        assert report["heads"] == [
            (spec.num_heads // 2, max(spec.num_kv_heads // 2, 1)) for spec in specs
        ]
        assert report["experts"] == [width // 2 for width in expert_widths]
        # The output head is vocabulary-parallel: about half the rows each
        # (vLLM pads each shard to a multiple of 64).
        rows, vocabulary = report["head"]
        assert vocabulary / 2 <= rows < vocabulary
        # So is the input lookup: the head's own table where the preset ties
        # them, and Keras's table is gone.
        rows, vocabulary = report["input_rows"]
        assert vocabulary / 2 <= rows < vocabulary
        assert report["lookup_is_head"] == report["tied"]
        # As vLLM's own CPU models hold the head: the table beside its packed
        # copy where it also looks up, else the packed copy alone.
        copies = "weight and packed" if report["tied"] else "packed only"
        assert report["head_copies"] == copies
        assert report["keras_table"] == 0
    # Per-head tensors: each rank has its own heads' values, in head order.
    for name in ("alibi_slopes", "sinks"):
        for layer, spec in enumerate(specs):
            whole = getattr(spec, name)
            cut = [report[name][layer] for report in reports]
            if whole is None:
                assert cut == [None, None]
                continue
            assert cut[0] != cut[1]
            assert cut[0] + cut[1] == pytest.approx(whole)
    assert any(spec.alibi_slopes for spec in specs) == (family in ("bloom", "falcon"))
    assert any(spec.sinks for spec in specs) == (family == "gpt_oss")
    # Gated DeltaNet layers (Qwen3.5): each rank holds half of every layer's
    # key and value heads, in its convolution, its decay and its slots in
    # vLLM's state cache; the ranks' decays together are the whole, in order.
    assert bool(gdn_layers) == family.startswith("qwen3_5")
    assert [len(report["states"]) for report in reports] == [len(gdn_layers)] * 2
    for layer, (k, v, k_size, v_size, a_log) in enumerate(gdn_layers):
        cut = [report["states"][layer] for report in reports]
        for held in cut:
            assert held["heads"] == (k // 2, v // 2)
            assert held["conv_channels"] == (2 * k * k_size + v * v_size) // 2
            assert held["recurrent"] == (v // 2, k_size, v_size)
        assert cut[0]["a_log"] != cut[1]["a_log"]
        assert cut[0]["a_log"] + cut[1]["a_log"] == pytest.approx(a_log)


# family -> the media encoder its multimodal test preset carries.
MULTIMODAL_TEXT_CASES = {"gemma3n": "audio", "qwen3_5": "vision"}


@pytest.mark.parametrize("family", sorted(MULTIMODAL_TEXT_CASES))
def test_a_multimodal_preset_serves_text_at_two_ranks(family, shared):
    """A preset with a media encoder whose media this row does not serve
    (Gemma3n's audio encoder alone; Qwen3.5's vision encoder, which all
    published Qwen3.5 presets carry) at 2 ranks: each rank holds half of
    every sharded weight, heads and Gated DeltaNet state, and the tokens
    are its oracle's (Qwen3.5: its full forward), batched and chunked."""
    preset = shared.preset(family, multimodal=True)
    expected = shared.oracle(
        preset, PROMPTS, MAX_NEW_TOKENS, full_forward=family in FULL_FORWARD_ORACLE
    )
    with parallel_llm(
        f"keras_hub:{preset}",
        tensor_parallel_size=2,
        max_num_batched_tokens=CHUNK,
        enable_chunked_prefill=True,
        enforce_eager=True,
    ) as llm:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        reports = sorted(llm.collective_rpc(rank_report), key=lambda r: r["rank"])
    row = f"{family} + {MULTIMODAL_TEXT_CASES[family]} encoder"
    support_matrix.record(row, TINY_FAMILIES[family][1], tp2="FAIL")
    _assert_greedy_parity(outputs, expected)
    support_matrix.record(row, TINY_FAMILIES[family][1], tp2="pass")
    specs, _, gdn_layers = _single_rank(preset)
    assert len(gdn_layers) == (3 if family == "qwen3_5" else 0)
    for report in reports:
        assert report["linears"]
        for held, full, shards in report["linears"]:
            assert held * shards == full
        assert report["keras_kernels"] == 0
        assert report["heads"] == [
            (spec.num_heads // 2, max(spec.num_kv_heads // 2, 1)) for spec in specs
        ]
        assert [held["heads"] for held in report["states"]] == [
            (k // 2, v // 2) for k, v, *_ in gdn_layers
        ]


# (family, vision) -> what it proves under pipeline parallelism.
PIPELINE_CASES = {
    ("llama3", False): "an untied head on the last stage, compiled",
    ("qwen", False): "q/k/v biases",
    ("gemma2", False): "soft caps, a window, a tied head on the last stage",
    ("bloom", False): "ALiBi",
    ("gpt_oss", False): "attention sinks, experts on vLLM's FusedMoE",
    ("qwen3_moe", False): "experts on vLLM's FusedMoE",
    # A vision preset as published (its image converter included), so served
    # by the vision model class, here with images off (its images at 2
    # stages: `test_pipeline_parallel_images_match_generate`). Its text path
    # loops over its layers.
    ("gemma3", True): "a vision preset, whose text path loops over its layers",
    ("gemma3", False): "sliding and global layers, scaled embeddings",
    ("gpt2", False): "learned positions added on the first stage",
    ("gpt_neox", False): "a fused per-head q/k/v projection",
    ("smollm3", False): "a NoPE layer",
    ("falcon", False): "ALiBi in Falcon's attention",
    ("gemma", False): "one KV head, a tied head on the last stage",
    ("llama", False): "Llama's attention and MLP",
    ("mistral", False): "a sliding window",
    ("mixtral", False): "Mixtral's experts on vLLM's FusedMoE",
    ("opt", False): "learned positions (OPT's offset) on the first stage",
    ("phi3", False): "Phi-3's fused q/k/v and gate/up projections",
    ("phi3_su", False): "SU-scaled rotary tables",
    ("qwen3", False): "per-head q/k norms",
    ("qwen_moe", False): "a shared expert beside the routed ones",
}
# The families whose every layer has experts on vLLM's FusedMoE.
MOE_FAMILIES = ("gpt_oss", "mixtral", "qwen3_moe", "qwen_moe")


def _assert_greedy_parity(outputs, expected):
    for prompt, output, (prompt_ids, generated_ids) in zip(
        PROMPTS, outputs, expected, strict=True
    ):
        assert output.prompt_token_ids == prompt_ids, prompt
        assert list(output.outputs[0].token_ids) == generated_ids, prompt


@pytest.mark.parametrize("family, vision", sorted(PIPELINE_CASES))
def test_pipeline_parallel_greedy_parity(family, vision, shared):
    preset = shared.vision_preset(family) if vision else shared.preset(family)
    expected = shared.oracle(
        preset, PROMPTS, MAX_NEW_TOKENS, full_forward=family in FULL_FORWARD_ORACLE
    )
    with parallel_llm(
        f"keras_hub:{preset}",
        pipeline_parallel_size=2,
        max_num_batched_tokens=CHUNK,
        enable_chunked_prefill=True,
        enforce_eager=family != "llama3",
        **({"limit_mm_per_prompt": {"image": 0}} if vision else {}),
    ) as llm:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        reports = sorted(llm.collective_rpc(stage_report), key=lambda r: r["ranks"])
    if vision:
        classes = {report["model_class"] for report in reports}
        assert classes == {"KerasHubGemma3VisionForCausalLM"}, classes
    row = f"{family} + vision encoder" if vision else family
    support_matrix.record(row, TINY_FAMILIES[family][1], pp2="FAIL")
    _assert_greedy_parity(outputs, expected)
    support_matrix.record(row, TINY_FAMILIES[family][1], pp2="pass")

    # Each stage serves half of the layers, with their own KV cache and
    # experts, and holds nothing of the other's layers; the embedding is on
    # the first stage, the output head on the last.
    first, last = reports
    half = last["stage"][1] // 2
    assert (first["stage"], last["stage"]) == ((0, half), (half, 2 * half))
    assert first["attention"] == [f"attention.{i}" for i in range(half)]
    assert last["attention"] == [f"attention.{i}" for i in range(half, 2 * half)]
    moe = family in MOE_FAMILIES
    assert first["experts"] == last["experts"] == int(moe)
    assert first["others"] == last["others"] == 0
    assert first["embedding"] and last["head"]
    # A tied table is both: the last stage keeps it for its head. An untied
    # output projection is the last stage's alone.
    assert last["embedding"] == first["head"] == first["tied"]


@pytest.mark.parametrize("family", ["gemma4", "gemma4_moe"])
def test_gemma4_pipeline_keeps_kv_sharing_layers_with_their_sources(
    family, shared, tmp_path
):
    """Gemma4 at 2 stages, on a tiny preset of 6 layers whose last 2 attend
    over layers 2's and 3's KV caches: the cut vLLM would make (at layer 3)
    moves down to layer 2, so those caches are on the stage that reads
    them, and the per-layer inputs made on the first stage cross with the
    hidden states. The greedy tokens are `generate()`'s. Gemma4-MoE's
    layers also carry experts, each stage its own."""
    from vllm_keras_hub.testing.presets import build_tiny_preset

    preset = build_tiny_preset(
        family, str(tmp_path / family), backbone_overrides={"num_layers": 6}
    )
    expected = shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS)
    with parallel_llm(
        f"keras_hub:{preset}",
        pipeline_parallel_size=2,
        max_num_batched_tokens=CHUNK,
        enable_chunked_prefill=True,
        enforce_eager=True,
    ) as llm:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        reports = sorted(llm.collective_rpc(stage_report), key=lambda r: r["ranks"])
    support_matrix.record(family, TINY_FAMILIES[family][1], pp2="FAIL")
    _assert_greedy_parity(outputs, expected)
    support_matrix.record(family, TINY_FAMILIES[family][1], pp2="pass (6 layers)")
    first, last = reports
    assert (first["stage"], last["stage"]) == ((0, 2), (2, 6))
    assert first["experts"] == 2 * (family == "gemma4_moe")
    assert last["experts"] == 4 * (family == "gemma4_moe")
    assert first["kv_sharing"] == {}
    assert {
        name.rsplit(".", 1)[-1]: target.rsplit(".", 1)[-1]
        for name, target in last["kv_sharing"].items()
    } == {"4": "2", "5": "3"}
    assert first["others"] == last["others"] == 0
    assert first["embedding"] and last["head"]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_hybrid_pipeline_keeps_each_stages_state_on_its_rank(family, shared, tmp_path):
    """Qwen3.5 at 2 stages, on a tiny preset of 8 layers (Gated DeltaNet,
    attention every 4th): each stage holds its own layers' recurrent state
    in vLLM's state cache, and an attention layer, which vLLM 0.32 needs on
    every stage. The tokens are its full forward's (`generate()` is not
    exact for Qwen3.5, `model_test.py`). Qwen3.5-MoE's layers also carry
    experts, each stage its own. A preset with a vision encoder, as all
    published Qwen3.5 presets have, is `test_qwen3_5_images_in_each_layout`'s."""
    from vllm_keras_hub.testing.presets import build_tiny_preset

    preset = build_tiny_preset(
        family, str(tmp_path / family), backbone_overrides={"num_layers": 8}
    )
    expected = shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS, full_forward=True)
    with parallel_llm(
        f"keras_hub:{preset}",
        pipeline_parallel_size=2,
        max_num_batched_tokens=CHUNK,
        enable_chunked_prefill=True,
        enforce_eager=True,
    ) as llm:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        reports = sorted(llm.collective_rpc(stage_report), key=lambda r: r["ranks"])
    support_matrix.record(family, TINY_FAMILIES[family][1], pp2="FAIL")
    _assert_greedy_parity(outputs, expected)
    support_matrix.record(family, TINY_FAMILIES[family][1], pp2="pass (8 layers)")
    first, last = reports
    assert (first["stage"], last["stage"]) == ((0, 4), (4, 8))
    assert first["experts"] == last["experts"] == 4 * (family == "qwen3_5_moe")
    assert first["attention"] == ["attention.3"] and last["attention"] == ["attention.7"]
    assert first["states"] == last["states"] == 3
    assert first["others"] == last["others"] == 0
    assert first["vision_encoder"] is last["vision_encoder"] is None


# family -> (image placeholder, engine settings): Gemma4's images are split
# over 128-token prefill steps (its attention over them is causal).
IMAGE_CASES = {
    "gemma3": ("<start_of_image>", dict(block_size=16)),
    "gemma3n": ("<start_of_image>", dict(block_size=16)),
    "gemma4": (
        "<|image|>",
        dict(
            block_size=32,
            max_model_len=1024,
            enable_chunked_prefill=True,
            max_num_batched_tokens=128,
        ),
    ),
}


# The vision presets that carry audio encoders, as published.
AUDIO_PLACEHOLDERS = {"gemma3n": "<start_of_audio>", "gemma4": "<|audio|>"}


@pytest.mark.parametrize("family", sorted(IMAGE_CASES))
def test_tensor_parallel_images_match_generate(family, shared):
    """A vision preset, as published, at 2 ranks: a batch with 0, 1 and 2
    images per prompt.

    The text layers are sharded; the vision encoder is whole on each rank,
    which embeds the images itself, so no image embedding crosses ranks
    (vLLM's own Gemma3 shards its SigLIP tower instead). Gemma3n: its
    MobileNet-v5 encoder, its audio encoder, and its text layers' AltUp and
    per-layer inputs. Gemma4: its audio encoder too, and a video's frames
    through its vision encoder.
    """
    placeholder, engine = IMAGE_CASES[family]
    preset = shared.vision_preset(family)
    prompts = batch_prompts(placeholder)
    limits = {"image": 2}
    if family in AUDIO_PLACEHOLDERS:
        # Its audio encoder too, whole on each rank as the vision encoder.
        clip = audio.noise_clip(0)
        prompts.append((f"Listen: {AUDIO_PLACEHOLDERS[family]} what?", [], [clip]))
        limits["audio"] = 1
    if family == "gemma4":
        prompts.append(("Watch: <|video|> what?", videos.random_video(1)))
        limits["video"] = 1
    expected = keras_hub_greedy_with_images(preset, prompts, MAX_NEW_TOKENS)
    # The image decides the answer: the same text, another image.
    assert expected[0][1] != expected[3][1]
    with parallel_llm(
        f"keras_hub:{preset}",
        tensor_parallel_size=2,
        limit_mm_per_prompt=limits,
        enforce_eager=True,
        **engine,
    ) as llm:
        requests = [
            videos.request(text, video=media[0])
            if isinstance(media[0], videos.Video)
            else audio.request(text, *media)
            for text, *media in prompts
        ]
        outputs = llm.generate(requests, GREEDY, use_tqdm=False)
        reports = llm.collective_rpc(rank_report)
    row = f"{family} + vision encoder"
    backbone = TINY_FAMILIES[family][1]
    support_matrix.record(row, backbone, tp2="FAIL")
    assert_tokens(outputs, expected)
    support_matrix.record(row, backbone, tp2="pass")
    for report in reports:
        assert report["keras_kernels"] == 0
        assert all(held * shards == full for held, full, shards in report["linears"])


# family -> the vision preset served at 2 stages, and its engine settings.
PIPELINE_IMAGE_CASES = {
    # `vision_test.py`'s preset: images attended both ways.
    "gemma3": (dict(), dict(block_size=16)),
    # 6 layers, the last 2 KV-sharing; causal images, per-layer inputs.
    "gemma4": (
        dict(family="gemma4", backbone_overrides={"num_layers": 6}),
        IMAGE_CASES["gemma4"][1],
    ),
}


@pytest.mark.parametrize("family", sorted(PIPELINE_IMAGE_CASES))
def test_pipeline_parallel_images_match_generate(family, tmp_path):
    """A vision preset at 2 stages, a batch with 0, 1 and 2 images per
    prompt: the first stage alone holds the vision encoder and embeds the
    images. Gemma3's sends the step's image rows beside its hidden states,
    so the last stage's layers attend within each image both ways too;
    Gemma4's sends its per-layer inputs, made with image tokens as 0."""
    from tests.vision_test import PROMPTS as GEMMA3_PROMPTS
    from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

    options, engine = PIPELINE_IMAGE_CASES[family]
    preset = build_tiny_vision_preset(str(tmp_path / family), **options)
    prompts = batch_prompts(IMAGE_CASES[family][0])
    if family == "gemma3":
        prompts = GEMMA3_PROMPTS
    expected = keras_hub_greedy_with_images(preset, prompts, MAX_NEW_TOKENS)
    # The image decides the answer: the same text, another image.
    assert expected[0][1] != expected[3][1]
    with parallel_llm(
        f"keras_hub:{preset}",
        pipeline_parallel_size=2,
        limit_mm_per_prompt={"image": 2},
        enforce_eager=True,
        **engine,
    ) as llm:
        requests = [audio.request(text, images) for text, images in prompts]
        outputs = llm.generate(requests, GREEDY, use_tqdm=False)
        reports = sorted(llm.collective_rpc(stage_report), key=lambda r: r["ranks"])
        attended = dict(llm.collective_rpc(image_rows_report))
    row = f"{family} + vision encoder"
    support_matrix.record(row, TINY_FAMILIES[family][1], pp2="FAIL")
    assert_tokens(outputs, expected)
    support_matrix.record(row, TINY_FAMILIES[family][1], pp2="pass, with images")
    first, last = reports
    assert first["vision_encoder"] > 0 and last["vision_encoder"] == 0
    assert first["others"] == last["others"] == 0
    if family == "gemma4":
        assert (first["stage"], last["stage"]) == ((0, 2), (2, 6))
        return
    # Every layer of both stages re-attended the batch's image rows both
    # ways, each once (this preset's tokens alone would not show the last
    # stage's doing so).
    image_rows = sum(len(image_positions(preset, ids)) for ids, _ in expected)
    counts = {name: rows for stage in (0, 1) for name, rows in attended[stage].items()}
    assert sorted(counts) == sorted(first["attention"] + last["attention"])
    assert set(counts.values()) == {image_rows}


@pytest.mark.parametrize("layout", ["tensor", "pipeline"])
def test_bidirectional_gemma4_images_in_each_layout(layout, tmp_path):
    """A Gemma4 vision preset whose images attend both ways within
    themselves (as the published 26B and 31B presets do) at 2 ranks, and
    at 2 stages (6 layers), gives its full forward's tokens on a batch with
    0, 1 and 2 images per prompt: each rank re-attends the image rows over
    its own heads; the last stage gets the step's image rows beside the
    hidden states. (`generate()` attends causally: KerasHub's bug,
    `vision_gemma4_bidirectional_test.py`.)"""
    from vllm_keras_hub.testing.image_oracle import gemma4_full_forward_with_images
    from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

    layers = {"num_layers": 6} if layout == "pipeline" else None
    preset = build_tiny_vision_preset(
        str(tmp_path / "gemma4"), "gemma4", bidirectional=True, backbone_overrides=layers
    )
    prompts = batch_prompts(IMAGE_CASES["gemma4"][0])
    expected = gemma4_full_forward_with_images(preset, prompts, MAX_NEW_TOKENS)
    assert expected[0][1] != expected[3][1]
    # The images' attention decides the answer: attended causally, the
    # first prompt's tokens differ.
    causal = keras_hub_greedy_with_images(preset, prompts[:1], MAX_NEW_TOKENS)
    assert causal[0][1] != expected[0][1]
    with parallel_llm(
        f"keras_hub:{preset}",
        **{f"{layout}_parallel_size": 2},
        limit_mm_per_prompt={"image": 2},
        enforce_eager=True,
        block_size=32,
        max_model_len=1024,
        enable_chunked_prefill=True,
        max_num_batched_tokens=320,
    ) as llm:
        requests = [audio.request(text, images) for text, images in prompts]
        outputs = llm.generate(requests, GREEDY, use_tqdm=False)
        attended = llm.collective_rpc(image_rows_report)
    row = "gemma4 + vision encoder, bidirectional"
    column = "tp2" if layout == "tensor" else "pp2"
    support_matrix.record(row, "Gemma4Backbone", **{column: "FAIL"})
    assert_tokens(outputs, expected)
    cell = "pass (full forward)" if layout == "tensor" else "pass, with images (full forward)"
    support_matrix.record(row, "Gemma4Backbone", **{column: cell})
    # Every worker's layers re-attended the batch's image rows both ways.
    image_rows = sum(len(image_positions(preset, ids)) for ids, _ in expected)
    for _, counts in attended:
        assert counts and set(counts.values()) == {image_rows}


@pytest.mark.parametrize("layout", ["tensor", "pipeline"])
def test_qwen3_5_images_in_each_layout(layout, tmp_path):
    """A Qwen3.5 vision preset at 2 ranks, and at 2 stages (8 layers, an
    attention layer in each), gives its full forward's tokens on
    `vision_qwen3_5_test.py`'s batch: M-RoPE positions reach every rank's
    and every stage's attention layers, each rank holds its Gated DeltaNet
    heads, and the first stage alone the vision encoder."""
    from tests.vision_qwen3_5_test import PROMPTS as QWEN3_5_PROMPTS
    from vllm_keras_hub.testing.mrope_oracle import qwen3_5_full_forward_with_images
    from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

    layers = {"num_layers": 8} if layout == "pipeline" else None
    preset = build_tiny_vision_preset(
        str(tmp_path / "qwen3_5"), "qwen3_5", seed=5, backbone_overrides=layers
    )
    expected = qwen3_5_full_forward_with_images(preset, QWEN3_5_PROMPTS, MAX_NEW_TOKENS)
    assert expected[0][1] != expected[3][1]
    with parallel_llm(
        f"keras_hub:{preset}",
        **{f"{layout}_parallel_size": 2},
        limit_mm_per_prompt={"image": 2},
        enforce_eager=True,
        max_model_len=512,
        enable_chunked_prefill=True,
        max_num_batched_tokens=16,
    ) as llm:
        requests = [audio.request(text, images) for text, images in QWEN3_5_PROMPTS]
        outputs = llm.generate(requests, GREEDY, use_tqdm=False)
        reports = llm.collective_rpc(stage_report if layout == "pipeline" else rank_report)
    row = "qwen3_5 + vision encoder"
    column = "tp2" if layout == "tensor" else "pp2"
    support_matrix.record(row, "Qwen3_5Backbone", **{column: "FAIL"})
    assert_tokens(outputs, expected)
    cell = "pass, with images" + (" (8 layers)" if layout == "pipeline" else "")
    support_matrix.record(row, "Qwen3_5Backbone", **{column: cell})
    if layout == "pipeline":
        # Each stage its Gated DeltaNet states and an attention layer, and
        # the first stage alone the vision encoder.
        first, last = sorted(reports, key=lambda r: r["ranks"])
        assert (first["stage"], last["stage"]) == ((0, 4), (4, 8))
        assert first["attention"] == ["attention.3"] and last["attention"] == ["attention.7"]
        assert first["states"] == last["states"] == 3
        assert first["others"] == last["others"] == 0
        assert first["vision_encoder"] > 0 and last["vision_encoder"] == 0
    else:
        for report in reports:
            assert all(held * shards == full for held, full, shards in report["linears"])


# family -> (layers of a preset built for the case, or None for the shared
# tiny preset's 2; what 2 stages of 2 ranks prove for it).
TP_AND_PP_CASES = {
    "gemma2": (None, "a tied head, vocabulary-parallel on the last stage only"),
    "qwen3_5": (8, "Gated DeltaNet heads per rank, states per stage"),
}


@pytest.mark.parametrize("family", sorted(TP_AND_PP_CASES))
def test_tensor_and_pipeline_parallel_together(family, shared, monkeypatch, tmp_path):
    """2 stages of 2 ranks each: the output head is vocabulary-parallel on
    the last stage's ranks only, and only the first stage keeps the input
    table (Gemma2's is tied to the head). Qwen3.5, on a preset of 8 layers
    (an attention layer on each stage), keeps each stage's Gated DeltaNet
    states on its own ranks, half of every layer's heads on each."""
    from vllm_keras_hub.testing.presets import build_tiny_preset

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1|0|1")
    layers, _ = TP_AND_PP_CASES[family]
    if layers is None:
        preset, layers = shared.preset(family), 2
    else:
        preset = build_tiny_preset(
            family, str(tmp_path / family), backbone_overrides={"num_layers": layers}
        )
    expected = shared.oracle(
        preset, PROMPTS, MAX_NEW_TOKENS, full_forward=family in FULL_FORWARD_ORACLE
    )
    with parallel_llm(
        f"keras_hub:{preset}",
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        max_num_batched_tokens=CHUNK,
        enable_chunked_prefill=True,
    ) as llm:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        reports = sorted(llm.collective_rpc(stage_report), key=lambda r: r["ranks"])
        heads = llm.collective_rpc(state_heads)
    _assert_greedy_parity(outputs, expected)
    half = layers // 2
    assert [r["ranks"] for r in reports] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["stage"] for r in reports] == [(0, half)] * 2 + [(half, layers)] * 2
    assert [r["embedding"] for r in reports] == [True, True, False, False]
    assert [r["vocab_parallel_head"] for r in reports] == [False, False, True, True]
    assert all(r["others"] == 0 for r in reports)
    if family == "qwen3_5":
        # 3 of each stage's 4 layers are Gated DeltaNet; each rank of a
        # stage holds 1 of the 2 key heads and 2 of the 4 value heads.
        assert [r["states"] for r in reports] == [3] * 4
        assert heads == [[(1, 2)] * 3] * 4


@contextlib.contextmanager
def _headless_node(command, tmp_path):
    """Node 1 of a two-node launch: `command --headless` (engine only), bound
    to core 1, for the `with` block. Yields its log file's path."""
    path = tmp_path / "node1.log"
    with open(path, "w") as log:
        node1 = subprocess.Popen(
            [*command, "--headless"],
            env=user_env(VLLM_CPU_OMP_THREADS_BIND="1"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield path
    finally:
        end_process_group(node1)


@pytest.mark.parametrize("layout", ["tensor", "pipeline"])
def test_two_nodes_on_loopback_give_generates_tokens(layout, shared, tmp_path):
    """`serve --tensor-parallel-size 2`, or `--pipeline-parallel-size 2`,
    through the official `openai` client, its 2 ranks in 2 vLLM nodes
    (`--nnodes 2`) on 127.0.0.1.

    Node 1 runs headless (engine only); node 0 serves the API. The ranks
    are in different nodes, so vLLM's shared-memory communicator stands
    down and they all-reduce, or hand a stage's hidden states on, over gloo
    and TCP, as on two machines. Gemma3: per-head q/k norms, sliding and
    global layers.
    """
    preset = shared.preset("gemma3")
    expected = shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS)
    model = f"keras_hub:{preset}"
    port, master_port = free_port(), free_port()
    common = (
        f"--{layout}-parallel-size", "2", "--nnodes", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(master_port),
        "--max-model-len", "256", "--dtype", "float32", "--enforce-eager",
    )  # fmt: skip
    cell = {"tensor": "tp2", "pipeline": "pp2"}[layout]
    command = serve_command(model, *common, "--node-rank", "0", "--port", str(port))
    with _headless_node(serve_command(model, *common, "--node-rank", "1"), tmp_path) as log:
        env = user_env(VLLM_CPU_OMP_THREADS_BIND="0")
        support_matrix.record("gemma3", TINY_FAMILIES["gemma3"][1], **{cell: "FAIL"})
        with running_server(command, port, env=env, model_name=model) as (base_url, _):
            assert_served_greedy(base_url, model, PROMPTS, expected, MAX_NEW_TOKENS)
    text = log.read_text()
    assert f"SHM communicator disabled for group {cell[:2]}" in text, text[-3000:]
    support_matrix.record(
        "gemma3", TINY_FAMILIES["gemma3"][1], **{cell: "pass (also server, 2 nodes)"}
    )


def test_data_parallel_across_two_nodes_gives_generates_tokens(shared, tmp_path):
    """`serve --data-parallel-size 2` with one engine in each of 2 nodes on
    127.0.0.1 (vLLM's multi-node data parallelism: node 1 headless, from
    `--data-parallel-start-rank 1`), through the official `openai` client.

    Concurrent requests, so vLLM's load balancer gives both engines some;
    every completion is `generate()`'s, and node 1's engine (`DP1`, in its
    own process) served some of them, by the server's own metrics."""
    preset = shared.preset("llama3")
    prompts = 2 * PROMPTS
    expected = 2 * shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS)
    model = f"keras_hub:{preset}"
    port = free_port()
    common = (
        "--data-parallel-size", "2", "--data-parallel-size-local", "1",
        "--data-parallel-address", "127.0.0.1",
        "--data-parallel-rpc-port", str(free_port()),
        "--max-model-len", "256", "--dtype", "float32", "--enforce-eager",
    )  # fmt: skip
    node1 = serve_command(model, *common, "--data-parallel-start-rank", "1")
    command = serve_command(model, *common, "--port", str(port), "--api-server-count", "1")
    with _headless_node(node1, tmp_path) as log:
        env = user_env(VLLM_CPU_OMP_THREADS_BIND="0")
        with running_server(command, port, env=env, model_name=model) as (base_url, _):
            served = greedy_ids(base_url, model, prompts, MAX_NEW_TOKENS, concurrent=True)
            per_engine = requests_per_engine(base_url)
    assert served == [tuple(pair) for pair in expected]
    assert per_engine.get(1, 0) > 0 and per_engine.get(0, 0) > 0, per_engine
    assert sum(per_engine.values()) == len(prompts)
    assert "EngineCore_DP1" in log.read_text()


def test_an_eagle3_head_and_a_draft_model_at_two_ranks(shared, tmp_path):
    """Speculation under tensor parallelism, the target at 2 ranks:
    - the known-draft EAGLE-3 head (`testing/eagle3.py`), whole on each
      rank, fed the target's aux hidden states: the oracle's tokens, and
      the acceptance counted from them, as at one rank
      (`speculative_native_test.py`);
    - the target drafting for itself, both sharded alike: every draft
      accepted."""
    from tests.speculative_native_test import AUX_LAYERS
    from tests.speculative_native_test import DRAFT_TOKENS
    from tests.speculative_native_test import eagle3
    from tests.speculative_native_test import echo_acceptance
    from tests.speculative_test import acceptance
    from tests.speculative_test import assert_oracle_tokens
    from vllm_keras_hub.testing.eagle3 import save_echo_head

    preset = shared.preset("llama3")
    expected = shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS)
    continued = shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS + DRAFT_TOKENS)
    head = save_echo_head(preset, str(tmp_path / "eagle3"), AUX_LAYERS)
    itself = {"model": f"keras_hub:{preset}", "num_speculative_tokens": DRAFT_TOKENS}
    for spec in (eagle3(head), itself):
        with parallel_llm(
            f"keras_hub:{preset}",
            tensor_parallel_size=2,
            enforce_eager=True,
            speculative_config=spec,
            disable_log_stats=False,
        ) as llm:
            outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
            drafted, accepted = acceptance(llm)
        assert_oracle_tokens(outputs, expected)
        if spec is itself:
            assert accepted == drafted > 0
        else:
            assert (drafted, accepted) == echo_acceptance([t for _, t in continued])


# The second adapter's layers in a Gemma decoder: the replicated key, the
# row-parallel attention output, a column- and the row-parallel MLP matmul.
GEMMA_ADAPTER_TARGETS = ["key", "attention_output", "ffw_gating", "ffw_linear"]


# Gemma's adapter ids, as its LoRA requests name them.
GEMMA_ADAPTER_IDS = {"default": 1, "mixed": 2}


def _gemma_adapters(shared, tmp_path):
    """Gemma's tiny preset, two KerasHub adapters and each one's oracle.

    The adapters are KerasHub's default (query and value, rank 2) and one
    on the key, the attention output and two MLP matmuls (rank 4), each
    changing most prompts' tokens.

    Returns:
        `(preset, files, expected, rows)`: adapter name to file; adapter
        name (`None`, the base) to `generate()`'s `(prompt ids, generated
        ids)` per prompt; the batch's `(adapter name, prompt index)` rows,
        base and both adapters for every prompt.
    """
    from vllm_keras_hub.testing.lora import fine_tune_lora
    from vllm_keras_hub.testing.oracle import keras_hub_greedy

    preset = shared.preset("gemma")
    files = {
        "default": fine_tune_lora(preset, str(tmp_path / "default"))[0],
        "mixed": fine_tune_lora(
            preset,
            str(tmp_path / "mixed"),
            rank=4,
            seed=1,
            target_layer_names=GEMMA_ADAPTER_TARGETS,
        )[0],
    }
    expected = {
        None: shared.oracle(preset, PROMPTS, MAX_NEW_TOKENS),
        "default": keras_hub_greedy(
            preset, PROMPTS, MAX_NEW_TOKENS, lora_weights=files["default"]
        ),
        "mixed": keras_hub_greedy(
            preset,
            PROMPTS,
            MAX_NEW_TOKENS,
            lora_weights=files["mixed"],
            lora_targets=GEMMA_ADAPTER_TARGETS,
        ),
    }
    for name in files:
        changed = sum(a != b for a, b in zip(expected[name], expected[None]))
        assert changed > len(PROMPTS) // 2, name
    rows = [(name, i) for i in range(len(PROMPTS)) for name in (None, *files)]
    return preset, files, expected, rows


def _serve_adapters(files, expected, rows, preset, **parallelism):
    """Serves the rows in one batch, each its own model's tokens; returns
    each worker's `lora_report`, by stage and rank."""
    from vllm.lora.request import LoRARequest

    from vllm_keras_hub.testing.parallel import lora_report

    ids = GEMMA_ADAPTER_IDS
    with parallel_llm(
        f"keras_hub:{preset}",
        enable_lora=True,
        max_loras=2,
        # The mixed adapter's key: rank 4 times Gemma's heads.
        max_lora_rank=32,
        max_num_batched_tokens=CHUNK,
        enable_chunked_prefill=True,
        **parallelism,
    ) as llm:
        outputs = llm.generate(
            [PROMPTS[i] for _, i in rows],
            GREEDY,
            lora_request=[
                None if name is None else LoRARequest(name, ids[name], files[name])
                for name, _ in rows
            ],
            use_tqdm=False,
        )
        reports = llm.collective_rpc(lora_report)
    for output, (name, i) in zip(outputs, rows, strict=True):
        prompt_ids, generated_ids = expected[name][i]
        assert output.prompt_token_ids == prompt_ids, (name, i)
        assert list(output.outputs[0].token_ids) == generated_ids, (name, i)
    return sorted(reports, key=lambda r: (r["stage"], r["rank"]))


def test_adapters_per_request_at_two_ranks(shared, tmp_path):
    """Base rows and two KerasHub adapters in one batch at 2 ranks, each row
    its own model's `generate()` tokens, on Gemma: its one KV head is
    replicated on both ranks, so vLLM's LoRA layer on a key or value
    projection is a one-shard layer there and keeps the adapter whole.
    vLLM's column- and row-parallel LoRA layers cut each adapter to the
    rank's shard."""
    preset, files, expected, rows = _gemma_adapters(shared, tmp_path)
    reports = _serve_adapters(files, expected, rows, preset, tensor_parallel_size=2)
    ids = GEMMA_ADAPTER_IDS
    # Every attention and MLP matmul is one of vLLM's parallel LoRA layers;
    # a replicated KV projection is whole on each rank (one shard).
    first, second = (report["layers"] for report in reports)
    kinds = {(kind, shards) for kind, shards, _ in first.values()}
    assert kinds == {
        ("ColumnParallelLinearWithLoRA", 2),
        ("ColumnParallelLinearWithLoRA", 1),
        ("RowParallelLinearWithLoRA", 2),
    }
    # Each adapter's layers: a column layer's B and a row layer's A are the
    # rank's own slices, which differ; the rest is the same on both ranks.
    loaded = {}
    for key, (kind, shards, held) in first.items():
        assert sorted(held) == sorted(ids.values())
        for adapter, (a, b) in held.items():
            if not any(map(any, a)):
                continue
            loaded.setdefault(adapter, set()).add(key)
            other_a, other_b = second[key][2][adapter]
            if shards == 1:
                assert (a, b) == (other_a, other_b), key
            elif kind.startswith("Column"):
                assert a == other_a and b != other_b, key
            else:
                assert a != other_a and b == other_b, key
    # The query and value, and the second adapter's 4 layers, of both blocks.
    assert len(loaded[ids["default"]]) == 2 * 2
    assert len(loaded[ids["mixed"]]) == 2 * len(GEMMA_ADAPTER_TARGETS)


def test_adapters_per_request_at_two_stages(shared, tmp_path):
    """The same batch at 2 pipeline stages, Gemma's 2 layers one a stage:
    each row its own model's `generate()` tokens. Each stage's LoRA layers
    are its own layer's matmuls, and each adapter loads there exactly its
    layers of that stage (vLLM's LoRA manager takes the modules a stage
    has, and the adapter's others are not this stage's)."""
    preset, files, expected, rows = _gemma_adapters(shared, tmp_path)
    reports = _serve_adapters(files, expected, rows, preset, pipeline_parallel_size=2)
    ids = GEMMA_ADAPTER_IDS
    assert [report["stage"] for report in reports] == [0, 1]
    held = []
    for report in reports:
        loaded = {}
        for key, (kind, shards, adapters) in report["layers"].items():
            assert (kind, shards) == ("ReplicatedLinearWithLoRA", 1), key
            for adapter, (a, b) in adapters.items():
                if any(map(any, a)):
                    loaded.setdefault(adapter, set()).add(key)
        # Per stage: one layer's query and value, and the second adapter's 4.
        assert len(loaded[ids["default"]]) == 2
        assert len(loaded[ids["mixed"]]) == len(GEMMA_ADAPTER_TARGETS)
        held.append(set(report["layers"]))
    # No matmul is on both stages.
    assert not held[0] & held[1]


def test_pali_gemma_at_two_ranks_matches_generate(tmp_path):
    """PaliGemma, a prefix LM, at 2 ranks: its Gemma decoder sharded as
    Gemma's, its ViT whole on each rank, and each prompt's prefix (image
    and text) re-attended both ways over the rank's heads. A batch of
    images and prompts gives `generate()`'s tokens, each prompt alone."""
    from tests.vision_pali_gemma_test import ENGINE
    from tests.vision_pali_gemma_test import GREEDY as PALI_GREEDY
    from tests.vision_pali_gemma_test import MAX_NEW_TOKENS as PALI_TOKENS
    from tests.vision_pali_gemma_test import PROMPTS as PALI_PROMPTS
    from tests.vision_pali_gemma_test import request
    from tests.vision_pali_gemma_test import served_prompt
    from vllm_keras_hub.testing.image_oracle import pali_gemma_greedy
    from vllm_keras_hub.testing.vision_presets import build_tiny_pali_gemma_preset

    preset = build_tiny_pali_gemma_preset(str(tmp_path / "pali_gemma"))
    expected = pali_gemma_greedy(preset, PALI_PROMPTS, PALI_TOKENS)
    with parallel_llm(f"keras_hub:{preset}", tensor_parallel_size=2, **ENGINE) as llm:
        outputs = llm.generate(
            [request(*p) for p in PALI_PROMPTS], PALI_GREEDY, use_tqdm=False
        )
        reports = sorted(llm.collective_rpc(rank_report), key=lambda r: r["rank"])
    support_matrix.record("pali_gemma", "PaliGemmaBackbone", tp2="FAIL")
    image_id = outputs[0].prompt_token_ids[0]
    assert_tokens(
        outputs, [(served_prompt(ids, image_id), tokens) for ids, tokens in expected]
    )
    support_matrix.record("pali_gemma", "PaliGemmaBackbone", tp2="pass, with images")
    # Every decoder matmul holds half its weight on its rank (Gemma's one KV
    # head: whole, on both), and Keras's copies are gone.
    for report in reports:
        assert [shards for _, _, shards in report["linears"]].count(2) > 0
        for held, full, shards in report["linears"]:
            assert held * shards == full
        assert report["keras_kernels"] == 0
