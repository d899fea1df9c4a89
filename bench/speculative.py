"""Draft models at batch 1: vllm-keras-hub against vLLM native, same drafters.

    .venv/bin/python bench/speculative.py            # about 10 min
    .venv/bin/python bench/speculative.py --quick    # smoke run

Target: SmolLM2-135M-Instruct (30 layers); vllm-keras-hub serves the
KerasHub preset, vLLM native its Hugging Face export. Drafts
(`method: draft_model`, 3 tokens a step), each in both forms:
- none: no speculation;
- self: the target drafting for itself. Every draft should be accepted,
  but each costs a full forward, so this shows overhead, not a speed-up;
- first-6-layers: the target's first 6 layers, final norm and tied head,
  saved as its own preset (a layer-skip draft of real weights).
Every system runs eagerly (`enforce_eager`: no compile start-up for six
engines), float32, one thread, in its own subprocess. Each request is
alone in the engine (batch 1): 3 prompts, 64 new tokens each; the median
ms per output token is reported, with the acceptance rate from vLLM's
spec-decode counters. Writes `bench/results/speculative.json` and
`speculative.png`.
"""

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import worker_result  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
DRAFT_TOKENS = 3
SKIP_LAYERS = 6
DRAFTS = ("none", "self", f"first-{SKIP_LAYERS}-layers")
PROMPTS = [
    "Write a short story about a robot learning to paint.",
    "Explain how a hash map works, step by step.",
    "List the planets of the solar system and one fact about each.",
]


def make_layer_skip_draft(preset, directory, layers):
    """`preset` cut to its first `layers` layers, as a KerasHub preset.

    The preset's files are copied (tokenizer, preprocessor, task) and the
    backbone's config and weights replaced by the cut backbone's.
    """
    import shutil

    import keras_hub

    from vllm_keras_hub import gguf_preset

    backbone = keras_hub.models.Backbone.from_preset(preset, dtype="float32")
    # KerasHub's Llama3Backbone.get_config leaves out tie_word_embeddings.
    tied = backbone.token_embedding.tie_weights
    config = {**backbone.get_config(), "num_layers": layers, "tie_word_embeddings": tied}
    cut = type(backbone).from_config(config)
    cut.token_embedding.set_weights(backbone.token_embedding.get_weights())
    for ours, theirs in zip(cut.transformer_layers, backbone.transformer_layers[:layers]):
        ours.set_weights(theirs.get_weights())
    cut.layer_norm.set_weights(backbone.layer_norm.get_weights())
    shutil.copytree(preset, directory)
    cut.save_to_preset(directory)
    task_path = os.path.join(directory, "task.json")
    with open(task_path) as f:
        task = json.load(f)
    task["config"]["backbone"]["config"]["num_layers"] = layers
    with open(task_path, "w") as f:
        json.dump(task, f, indent=4)
    if tied:
        gguf_preset._restore_tied_embeddings(directory)
    return directory


def worker(system, draft, folders, prompts, max_tokens):
    """One system with one draft: ms per output token and acceptance."""
    import vllm

    kwargs = dict(
        dtype="float32", max_model_len=512, kv_cache_memory_bytes=1 << 30, seed=0,
        enforce_eager=True, disable_log_stats=False,
    )  # fmt: skip
    column = "keras_hub" if system == "keras_hub" else "hf"
    if draft != "none":
        model = folders[draft][column]
        if system == "keras_hub":
            model = f"keras_hub:{model}"
        kwargs["speculative_config"] = dict(model=model, num_speculative_tokens=DRAFT_TOKENS)
    if system == "keras_hub":
        from vllm_keras_hub import KerasHubLLM

        llm = KerasHubLLM(f"keras_hub:{folders['self']['keras_hub']}", **kwargs)
    else:
        llm = vllm.LLM(folders["self"]["hf"], **kwargs)
    params = vllm.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(["Warm up."], params, use_tqdm=False)
    before = _counters(llm)
    per_token, tokens = [], []
    for prompt in prompts:
        start = time.perf_counter()
        (output,) = llm.generate([prompt], params, use_tqdm=False)
        per_token.append((time.perf_counter() - start) / max_tokens * 1000)
        tokens.append(list(output.outputs[0].token_ids))
    after = _counters(llm)
    drafted = after["draft"] - before["draft"]
    accepted = after["accepted"] - before["accepted"]
    return dict(
        ms_per_token=statistics.median(per_token),
        ms_per_token_runs=per_token,
        acceptance=accepted / drafted if drafted else None,
        drafted=drafted,
        tokens=tokens,
    )


def _counters(llm):
    names = {
        "vllm:spec_decode_num_draft_tokens": "draft",
        "vllm:spec_decode_num_accepted_tokens": "accepted",
    }
    totals = {"draft": 0.0, "accepted": 0.0}
    for metric in llm.get_metrics():
        if metric.name in names:
            totals[names[metric.name]] += metric.value
    return totals


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", nargs=2)
    args = parser.parse_args()
    from vllm_keras_hub import backend

    backend.default_to_torch()
    max_tokens = 8 if args.quick else 64
    from vllm_keras_hub.cache import default_cache_dir

    root = os.path.join(default_cache_dir(), "bench", "speculative")
    setup_path = os.path.join(root, "setup.json")
    if args.worker:
        with open(setup_path) as f:
            setup = json.load(f)
        worker_result.emit(worker(*args.worker, **setup))
        return
    from bench.models import _prepare_smollm2
    from bench.run import worker_env
    from vllm_keras_hub import smollm2

    env = worker_env(1)
    preset, hf_folder, _ = _prepare_smollm2(env)
    skip = os.path.join(root, f"first-{SKIP_LAYERS}-layers")
    if not os.path.isdir(os.path.join(skip, "keras_hub")):
        make_layer_skip_draft(preset, os.path.join(skip, "keras_hub"), SKIP_LAYERS)
        smollm2.export_hf_llama(os.path.join(skip, "keras_hub"), os.path.join(skip, "hf"))
    folders = {
        "self": {"keras_hub": preset, "hf": hf_folder},
        DRAFTS[2]: {"keras_hub": os.path.join(skip, "keras_hub"), "hf": os.path.join(skip, "hf")},
    }
    with open(setup_path, "w") as f:
        json.dump(dict(folders=folders, prompts=PROMPTS, max_tokens=max_tokens), f)
    results = {}
    for draft in DRAFTS:
        for system in ("keras_hub", "native"):
            r = results[(system, draft)] = worker_result.run(
                [sys.executable, __file__, "--worker", system, draft],
                env, 1200, f"{system} / {draft}",
            )
            accepted = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
            print(f"{draft:18s} {system:10s} {r['ms_per_token']:6.1f} ms/token  "
                  f"acceptance {accepted}", flush=True)  # fmt: skip
    rows = []
    for draft in DRAFTS:
        ours, native = results[("keras_hub", draft)], results[("native", draft)]
        rows.append(dict(
            draft=draft,
            keras_hub_ms_per_token=ours["ms_per_token"],
            native_ms_per_token=native["ms_per_token"],
            ratio=native["ms_per_token"] / ours["ms_per_token"],
            keras_hub_speedup=results[("keras_hub", "none")]["ms_per_token"] / ours["ms_per_token"],
            native_speedup=results[("native", "none")]["ms_per_token"] / native["ms_per_token"],
            keras_hub_acceptance=ours["acceptance"],
            native_acceptance=native["acceptance"],
            same_tokens_as_no_draft=ours["tokens"] == results[("keras_hub", "none")]["tokens"],
            same_tokens_as_native=ours["tokens"] == native["tokens"],
            runs=dict(keras_hub=ours["ms_per_token_runs"], native=native["ms_per_token_runs"]),
        ))  # fmt: skip
    print(f"\n{'draft':18s} {'ours ms/tok':>11s} {'native':>7s} {'speed vs native':>15s} "
          f"{'ours speed-up':>13s} {'acceptance ours/native':>23s}")  # fmt: skip
    for r in rows:
        acc = "-" if r["keras_hub_acceptance"] is None else (
            f"{r['keras_hub_acceptance']:.2f} / {r['native_acceptance']:.2f}")  # fmt: skip
        print(f"{r['draft']:18s} {r['keras_hub_ms_per_token']:11.1f} {r['native_ms_per_token']:7.1f} "
              f"{r['ratio']:14.2f}x {r['keras_hub_speedup']:12.2f}x {acc:>23s}")  # fmt: skip
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "speculative.json"), "w") as f:
        json.dump(dict(max_tokens=max_tokens, draft_tokens=DRAFT_TOKENS, rows=rows,
                       date=time.strftime("%Y-%m-%d %H:%M")), f, indent=1)  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["keras_hub_ms_per_token"] for r in rows], 0.4, label="vllm-keras-hub")
    ax.bar([i + 0.2 for i in x], [r["native_ms_per_token"] for r in rows], 0.4, label="vLLM native")
    ax.set_xticks(list(x), [f"draft: {r['draft']}" for r in rows], fontsize=8)
    ax.set_ylabel("ms per output token, batch 1 (lower is better)")
    ax.set_title(f"SmolLM2-135M, float32, eager, {DRAFT_TOKENS} draft tokens a step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "speculative.png"))


if __name__ == "__main__":
    main()
