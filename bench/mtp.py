"""Gemma4 MTP at batch 1: vllm-keras-hub against vLLM native, same weights.

    .venv/bin/python bench/mtp.py            # about 8 min
    .venv/bin/python bench/mtp.py --quick    # smoke run

A random Gemma4 target of a mid-size shape and a random assistant for it
(`testing/hf_gemma4.py`): vLLM native serves the transformers folders (its
`Gemma4ForCausalLM` and `Gemma4MTP`, with its CPU attention named),
vllm-keras-hub the presets keras-hub's converters make of them. Each system
runs with no speculation and with the assistant drafting 3 tokens a step,
compiled (vLLM's default mode; `--eager` for eager), float32, one thread,
in its own subprocess; each request alone
(batch 1): 3 token prompts, 64 new tokens each. Reported: the median ms per
output token and the acceptance rate from vLLM's spec-decode counters; with
no draft, also output tokens per second for 8 requests at once. The
assistant is random, so it drafts almost nothing the target accepts: the
rows measure what drafting costs each system, not a speed-up. Writes
`bench/results/mtp.json` and `mtp.png`.
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
from bench.speculative import _counters  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
DRAFT_TOKENS = 3
MODES = ("none", "mtp")
# Gemma4-like proportions at a size this CPU runs quickly: 5 sliding layers
# to a full one, twice; the last 4 share KV. The assistant has 4 blocks.
VOCABULARY = 32768
TARGET = dict(
    hidden_size=1024,
    intermediate_size=4096,
    num_hidden_layers=12,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 2,
    per_layer_config={"05": {"head_dim": 256}, "11": {"head_dim": 256}},
    sliding_window=512,
    num_kv_shared_layers=4,
)
ASSISTANT = dict(
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    layer_types=["sliding_attention"] * 3 + ["full_attention"],
    per_layer_config={"03": {"head_dim": 256}},
    sliding_window=512,
    num_kv_shared_layers=4,
)
PROMPTS = [[2] + [(97 * i + 13 * p) % 590 + 5 for i in range(48)] for p in range(3)]
# With no draft, also 8 requests at once (batched decode, where the MLPs'
# matmuls are 8 rows); new prompts, so none comes from the prefix cache.
BATCH_PROMPTS = [[2] + [(89 * i + 29 * p) % 590 + 5 for i in range(48)] for p in range(8)]


def prepare(root):
    """The transformers pair and its KerasHub presets, made once."""
    from vllm_keras_hub.export.preset_folder import write_model_folder
    from vllm_keras_hub.testing import hf_gemma4
    from vllm_keras_hub.testing.presets import build_tiny_preset
    from vllm_keras_hub.testing.tokenizers import make_tokenizer

    done = os.path.join(root, "folders.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    tokenizer = make_tokenizer("gemma4")
    tiny = build_tiny_preset("gemma4", os.path.join(root, "tiny"))
    exported = os.path.join(root, "exported")
    write_model_folder(tiny, exported)
    hf = hf_gemma4.save_hf_pair(
        os.path.join(root, "hf"), exported, VOCABULARY, target=TARGET, assistant=ASSISTANT
    )
    ours = hf_gemma4.keras_hub_pair(*hf, os.path.join(root, "keras_hub"), tokenizer)
    folders = {"native": list(hf), "keras_hub": list(ours)}
    with open(done, "w") as f:
        json.dump(folders, f)
    return folders


def worker(system, mode, folders, max_tokens, eager):
    """One system in one mode: ms per output token and acceptance."""
    import vllm
    from vllm.inputs import TokensPrompt

    target, assistant = folders[system]
    kwargs = dict(
        dtype="float32", max_model_len=1024, kv_cache_memory_bytes=1 << 30, seed=0,
        enforce_eager=eager, disable_log_stats=False,
    )  # fmt: skip
    if system == "keras_hub":
        target, assistant = f"keras_hub:{target}", f"keras_hub:{assistant}"
    else:
        kwargs["attention_config"] = {"backend": "CPU_ATTN"}
    if mode == "mtp":
        kwargs["speculative_config"] = dict(
            method="mtp", model=assistant, num_speculative_tokens=DRAFT_TOKENS
        )
    if system == "keras_hub":
        from vllm_keras_hub import KerasHubLLM

        llm = KerasHubLLM(target, **kwargs)
    else:
        llm = vllm.LLM(target, **kwargs)
    params = vllm.SamplingParams(
        temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False
    )
    llm.generate([TokensPrompt(prompt_token_ids=[2, 5, 6])], params, use_tqdm=False)
    before = _counters(llm)
    per_token, tokens = [], []
    for prompt in PROMPTS:
        start = time.perf_counter()
        (output,) = llm.generate(
            [TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False
        )
        per_token.append((time.perf_counter() - start) / max_tokens * 1000)
        tokens.append(list(output.outputs[0].token_ids))
    after = _counters(llm)
    drafted = after["draft"] - before["draft"]
    accepted = after["accepted"] - before["accepted"]
    batch = None
    if mode == "none":
        start = time.perf_counter()
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in BATCH_PROMPTS], params, use_tqdm=False
        )
        elapsed = time.perf_counter() - start
        batch = dict(
            tokens_per_s=len(BATCH_PROMPTS) * max_tokens / elapsed,
            tokens=[list(o.outputs[0].token_ids) for o in outputs],
        )
    return dict(
        ms_per_token=statistics.median(per_token),
        ms_per_token_runs=per_token,
        acceptance=accepted / drafted if drafted else None,
        drafted=drafted,
        tokens=tokens,
        batch=batch,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--worker", nargs=2)
    args = parser.parse_args()
    from vllm_keras_hub import backend

    backend.default_to_torch()
    max_tokens = 8 if args.quick else 64
    from vllm_keras_hub.cache import default_cache_dir

    root = os.path.join(default_cache_dir(), "bench", "mtp")
    os.makedirs(root, exist_ok=True)
    setup_path = os.path.join(root, "setup.json")
    if args.worker:
        with open(setup_path) as f:
            setup = json.load(f)
        worker_result.emit(worker(*args.worker, **setup))
        return
    from bench.run import worker_env

    env = worker_env(1)
    with open(setup_path, "w") as f:
        json.dump(dict(folders=prepare(root), max_tokens=max_tokens, eager=args.eager), f)
    results = {}
    for mode in MODES:
        for system in ("keras_hub", "native"):
            r = results[(system, mode)] = worker_result.run(
                [sys.executable, __file__, "--worker", system, mode],
                env, 1200, f"{system} / {mode}",
            )  # fmt: skip
            accepted = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
            print(f"{mode:5s} {system:10s} {r['ms_per_token']:6.1f} ms/token  "
                  f"acceptance {accepted}", flush=True)  # fmt: skip
    rows = []
    for mode in MODES:
        ours, native = results[("keras_hub", mode)], results[("native", mode)]
        rows.append(dict(
            mode=mode,
            keras_hub_ms_per_token=ours["ms_per_token"],
            native_ms_per_token=native["ms_per_token"],
            ratio=native["ms_per_token"] / ours["ms_per_token"],
            keras_hub_acceptance=ours["acceptance"],
            native_acceptance=native["acceptance"],
            same_tokens_as_no_draft=ours["tokens"] == results[("keras_hub", "none")]["tokens"],
            same_tokens_as_native=ours["tokens"] == native["tokens"],
            runs=dict(keras_hub=ours["ms_per_token_runs"], native=native["ms_per_token_runs"]),
        ))  # fmt: skip
    ours, native = results[("keras_hub", "none")]["batch"], results[("native", "none")]["batch"]
    batch = dict(
        requests=len(BATCH_PROMPTS),
        keras_hub_tokens_per_s=ours["tokens_per_s"],
        native_tokens_per_s=native["tokens_per_s"],
        ratio=ours["tokens_per_s"] / native["tokens_per_s"],
        same_tokens_as_native=ours["tokens"] == native["tokens"],
    )
    print(f"\n{len(BATCH_PROMPTS)} requests at once, no draft: "
          f"{batch['keras_hub_tokens_per_s']:.1f} tokens/s against native's "
          f"{batch['native_tokens_per_s']:.1f} ({batch['ratio']:.2f}x), same tokens: "
          f"{batch['same_tokens_as_native']}")  # fmt: skip
    print(f"\n{'mode':5s} {'ours ms/tok':>11s} {'native':>7s} {'speed vs native':>15s} "
          f"{'acceptance ours/native':>23s} {'same tokens':>11s}")  # fmt: skip
    for r in rows:
        acc = "-" if r["keras_hub_acceptance"] is None else (
            f"{r['keras_hub_acceptance']:.2f} / {r['native_acceptance']:.2f}")  # fmt: skip
        same = r["same_tokens_as_native"] and r["same_tokens_as_no_draft"]
        print(f"{r['mode']:5s} {r['keras_hub_ms_per_token']:11.1f} "
              f"{r['native_ms_per_token']:7.1f} {r['ratio']:14.2f}x {acc:>23s} "
              f"{str(same):>11s}")  # fmt: skip
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "mtp.json"), "w") as f:
        json.dump(dict(max_tokens=max_tokens, draft_tokens=DRAFT_TOKENS, eager=args.eager,
                       target=TARGET,
                       assistant=ASSISTANT, vocabulary=VOCABULARY, rows=rows, batch=batch,
                       date=time.strftime("%Y-%m-%d %H:%M")), f, indent=1)  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    x = range(len(rows))
    ours = [r["keras_hub_ms_per_token"] for r in rows]
    ax.bar([i - 0.2 for i in x], ours, 0.4, label="vllm-keras-hub")
    ax.bar([i + 0.2 for i in x], [r["native_ms_per_token"] for r in rows], 0.4, label="vLLM native")
    ax.set_xticks(list(x), ["no draft", f"Gemma4 MTP, {DRAFT_TOKENS} tokens"], fontsize=8)
    ax.set_ylabel("ms per output token, batch 1 (lower is better)")
    mode = "eager" if args.eager else "compiled"
    ax.set_title(f"Random Gemma4 (12 layers, 1024 wide) and assistant, float32, {mode}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "mtp.png"))


if __name__ == "__main__":
    main()
