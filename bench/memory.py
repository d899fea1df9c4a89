"""Peak memory on a Gemma3-1B shape: vllm-keras-hub against vLLM native.

    .venv/bin/python bench/memory.py                 # both systems, eager
    .venv/bin/python bench/memory.py --compiled      # vLLM's default mode
    .venv/bin/python bench/memory.py --tensor-parallel-size 2  # 1 and 2 ranks
    .venv/bin/python bench/memory.py --pipeline-parallel-size 2  # 1 and 2 stages

A random-weight Gemma3 of `gemma3_instruct_1b`'s shape (26 layers, hidden
1152, 4 query heads and 1 KV head of 256, MLP 6912, sliding window 512, the
full 262,144-token vocabulary, tied embeddings), float32, saved once as a
KerasHub preset and exported by keras-hub's own Hugging Face exporter for
vLLM's native Gemma3. Each system runs in its own subprocess with the same
engine settings (2 GiB KV cache per worker, `--kv-cache-gib`, `max_model_len` 512), as users start it
(engine core and worker in their own processes), and serves 32 prompts of
token ids, 64 new tokens each. The summed RSS of the process tree and each
worker's RSS are sampled every 50 ms (`bench/systems.py: PeakRss`): the
peak while the engine starts (weights loaded, KV cache allocated), the
worker's RSS once it can serve, and the peak over the whole run. Writes
`bench/results/memory.json`.

With `--tensor-parallel-size N`, each system runs at 1 rank and at N
(each rank's worker bound to its own core), and the ratio printed is each
rank's worker peak while starting against the one worker's. The KV
cache is per worker, so with a small one (`--kv-cache-gib 0.25`) the
peak is mostly the weights. Writes
`bench/results/memory-tpN.json` and a plot beside it.
`--pipeline-parallel-size N` does the same with N stages of 13 layers
(for N = 2), writing `memory-ppN.json`.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import worker_result  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
SHAPE = dict(
    vocabulary_size=262144,
    image_size=None,
    num_layers=26,
    num_query_heads=4,
    num_key_value_heads=1,
    hidden_dim=1152,
    intermediate_dim=6912,
    head_dim=256,
    query_head_dim_normalize=True,
    use_query_key_norm=True,
    use_post_ffw_norm=True,
    use_post_attention_norm=True,
    use_sliding_window_attention=True,
    sliding_window_size=512,
    local_rope_scaling_factor=1.0,
    global_rope_scaling_factor=1.0,
    layer_norm_epsilon=1e-6,
)
REQUESTS, NEW_TOKENS = 32, 64


def make_weights(root):
    """The KerasHub preset and its Hugging Face export, made once."""
    import keras
    import keras_hub
    from keras_hub.src.utils.transformers.export.hf_exporter import (
        export_to_safetensors,
    )

    from vllm_keras_hub.export.preset_folder import write_model_folder
    from vllm_keras_hub.testing.tokenizers import make_tokenizer

    preset, hf = os.path.join(root, "keras_hub"), os.path.join(root, "hf")
    if os.path.isdir(hf):
        return preset, hf
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.Gemma3Backbone(**SHAPE, dtype="float32")
    causal_lm = keras_hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=None)
    causal_lm.save_to_preset(preset)
    make_tokenizer("gemma3").save_to_preset(preset)
    export_to_safetensors(causal_lm, hf + ".tmp")
    ours = os.path.join(root, "folder")
    write_model_folder(preset, ours)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(ours, name), hf + ".tmp")
    os.replace(hf + ".tmp", hf)
    return preset, hf


def worker(system, preset, hf, compiled, ranks=1, kv_cache_gib=2.0, layout="tensor"):
    import vllm
    from vllm.inputs import TokensPrompt

    from bench.systems import PeakRss

    kwargs = dict(
        dtype="float32", max_model_len=512, seed=0,
        kv_cache_memory_bytes=int(kv_cache_gib * 2**30),
        enforce_eager=not compiled, **{f"{layout}_parallel_size": ranks},
    )  # fmt: skip
    rng = random.Random(0)
    prompts = [
        TokensPrompt(prompt_token_ids=[rng.randrange(3, 500) for _ in range(8 + i)])
        for i in range(REQUESTS)
    ]
    params = vllm.SamplingParams(
        temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, detokenize=False
    )
    with PeakRss() as rss:
        if system == "keras_hub":
            from vllm_keras_hub import KerasHubLLM

            llm = KerasHubLLM(f"keras_hub:{preset}", **kwargs)
        else:
            llm = vllm.LLM(hf, hf_overrides={"architectures": ["Gemma3ForCausalLM"]}, **kwargs)
        start_peak = rss.peak
        start_workers = {title: peak for title, peak in rss.workers.values()}
        serving_worker = _worker_rss(rss)
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
    return dict(
        start_peak_mb=start_peak / 2**20,
        start_worker_peak_mb={k: v / 2**20 for k, v in start_workers.items()},
        serving_worker_rss_mb=serving_worker / 2**20,
        run_peak_mb=rss.peak / 2**20,
        run_worker_peak_mb={t: p / 2**20 for t, p in rss.workers.values()},
        tok_s=REQUESTS * NEW_TOKENS / elapsed,
        tokens=[list(o.outputs[0].token_ids) for o in outputs],
    )


def _worker_rss(rss):
    import psutil

    total = 0
    for proc in rss.root.children(recursive=True):
        try:
            if (proc.cmdline() or [""])[0].startswith("VLLM::Worker"):
                total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--systems", default="keras_hub,native")
    parser.add_argument("--worker")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--pipeline-parallel-size", type=int, default=1)
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    args = parser.parse_args()
    from vllm_keras_hub import backend

    backend.default_to_torch()
    from vllm_keras_hub.cache import default_cache_dir

    root = os.path.join(default_cache_dir(), "bench", "memory-gemma3-1b")
    if args.worker:
        preset, hf = os.path.join(root, "keras_hub"), os.path.join(root, "hf")
        layout, ranks = _layout(args)
        worker_result.emit(
            worker(args.worker, preset, hf, args.compiled, ranks, args.kv_cache_gib, layout)
        )
        return
    from bench.run import worker_env

    env = worker_env(1)
    os.makedirs(root, exist_ok=True)
    subprocess.run(
        [sys.executable, "-c", f"from bench.memory import make_weights; make_weights({root!r})"],
        check=True, env={**env, "PYTHONPATH": ROOT}, cwd=ROOT,
    )  # fmt: skip
    if _layout(args)[1] > 1:
        _compare_ranks(args, env)
        return
    results = {}
    for system in args.systems.split(","):
        r = results[system] = _run(system, args, env, 1)
        print(f"{system:10s} start peak {r['start_peak_mb']:7.0f} MB  serving worker "
              f"{r['serving_worker_rss_mb']:7.0f} MB  run peak {r['run_peak_mb']:7.0f} MB  "
              f"{r['tok_s']:.1f} tok/s", flush=True)  # fmt: skip
    if len(results) == 2:
        ours, native = results["keras_hub"], results["native"]
        for key in ("start_peak_mb", "serving_worker_rss_mb", "run_peak_mb"):
            print(f"{key}: {ours[key] / native[key]:.3f}x native")
        print("same tokens:", ours["tokens"] == native["tokens"])
    name = "memory-compiled.json" if args.compiled else "memory.json"
    _write(name, dict(results=results), args)


def _layout(args):
    # `(layout, ranks)`: "tensor" or "pipeline", and how many.
    if args.pipeline_parallel_size > 1:
        return "pipeline", args.pipeline_parallel_size
    return "tensor", args.tensor_parallel_size


def _run(system, args, env, ranks):
    layout = _layout(args)[0]
    argv = [sys.executable, __file__, "--worker", system,
            f"--{layout}-parallel-size", str(ranks),
            "--kv-cache-gib", str(args.kv_cache_gib)]  # fmt: skip
    if args.compiled:
        argv.append("--compiled")
    if ranks > 1:
        env = {**env, "VLLM_CPU_OMP_THREADS_BIND": "|".join(map(str, range(ranks)))}
    return worker_result.run(argv, env, 1800, f"{system} at {ranks} ranks")


def _compare_ranks(args, env):
    """Each system at 1 rank and at N: each rank's worker peak while starting."""
    layout, ranks = _layout(args)
    tag = {"tensor": "tp", "pipeline": "pp"}[layout]
    results, ratios = {}, {}
    for system in args.systems.split(","):
        one = results[f"{system}_{tag}1"] = _run(system, args, env, 1)
        many = results[f"{system}_{tag}{ranks}"] = _run(system, args, env, ranks)
        (single,) = one["start_worker_peak_mb"].values()
        per_rank = sorted(many["start_worker_peak_mb"].items())
        ratios[system] = {title: peak / single for title, peak in per_rank}
        print(f"{system:10s} 1 rank: worker peak {single:7.0f} MB, {one['tok_s']:.1f} tok/s; "
              f"{ranks} ranks: " + ", ".join(
                  f"{t} {p:7.0f} MB ({p / single:.2f}x)" for t, p in per_rank)
              + f", {many['tok_s']:.1f} tok/s", flush=True)  # fmt: skip
        print(f"{system:10s} same tokens at 1 and {ranks} ranks:",
              one["tokens"] == many["tokens"])  # fmt: skip
    if {"keras_hub", "native"} <= set(ratios):
        ours = results[f"keras_hub_{tag}{ranks}"]
        native = results[f"native_{tag}{ranks}"]
        print(f"throughput at {ranks} ranks: {ours['tok_s'] / native['tok_s']:.3f}x native")
        print("same tokens as native:", ours["tokens"] == native["tokens"])
    name = f"memory-{tag}{ranks}"
    _write(f"{name}.json", dict(results=results, worker_peak_vs_one_rank=ratios), args)
    _plot(results, f"{ranks} {layout}-parallel workers", os.path.join(RESULTS, f"{name}.png"))


def _write(name, fields, args):
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, name), "w") as f:
        json.dump(dict(shape=SHAPE, requests=REQUESTS, new_tokens=NEW_TOKENS,
                       compiled=args.compiled, kv_cache_gib=args.kv_cache_gib,
                       **fields,
                       date=time.strftime("%Y-%m-%d %H:%M")), f)  # fmt: skip


def _plot(results, layout, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, peaks = [], []
    for name, result in results.items():
        for title, peak in sorted(result["start_worker_peak_mb"].items()):
            labels.append(f"{name}\n{title.removeprefix('VLLM::')}")
            peaks.append(peak / 1024)
    fig, ax = plt.subplots(figsize=(2 + 1.2 * len(labels), 4))
    ax.bar(range(len(labels)), peaks)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("worker peak RSS while starting (GiB)")
    ax.set_title(f"Gemma3-1B shape, float32: 1 worker against {layout}")
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
