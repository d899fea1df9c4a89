"""Encoder-decoder LMs: vllm-keras-hub against the preset's own generate().

    .venv/bin/python bench/seq2seq.py            # BART-base's shape
    .venv/bin/python bench/seq2seq.py --quick    # tiny weights, smoke run

Weights: BART-base's shape (6 encoder and 6 decoder layers, hidden 768, 12
heads, MLP 3072), random, float32, as a transformers
`BartForConditionalGeneration` folder that keras-hub's converter loads for
both systems (`vllm_keras_hub/testing/seq2seq.py`). The vocabulary is the
tiny test one: BART's 50,265 rows would add the same output matmul to both.
vLLM has no BART of its own to compare with (docs/seq2seq.md).

64 encoder texts of about 100 tokens, 64 new tokens each (the end token
ignored), greedy, 16 at a time:
- `keras_hub`: `vllm-keras-hub serve` of the folder (compiled), 16 client
  threads sending `/v1/completions`;
- `generate`: the preset's own `BartSeq2SeqLM` decoding 16 texts a batch,
  `generate_preprocess` then `generate_step` (`generate()` itself needs
  TensorFlow to strip its output), in its own process.

Each with the same threads. Prints tokens per second and the ratio, writes
`bench/results/seq2seq.json` and `seq2seq.png`.
"""

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RESULTS = os.path.join(ROOT, "bench", "results")
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "vllm-keras-hub", "bench")
SHAPES = {
    "full": dict(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                 decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072),
    "quick": {},
}
CONCURRENT = 16
REQUESTS = 64
NEW_TOKENS = 64
WORDS = 80  # about 100 tokens of the tiny vocabulary
LABELS = {"keras_hub": "vllm-keras-hub serve", "generate": "KerasHub generate_step"}


def make_weights(size):
    from vllm_keras_hub.testing.seq2seq import save_hf_bart

    folder = os.path.join(CACHE, f"bart-{size}")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        save_hf_bart(folder, **SHAPES[size])
    return folder


def make_texts(count):
    import random

    words = "the quick brown fox jumps over lazy dog mars is red hello world data model".split()
    rng = random.Random(0)
    return [" ".join(rng.choice(words) for _ in range(WORDS)) for _ in range(count)]


def run_generate(folder, texts, threads):
    """The preset's own greedy decoding, 16 texts a batch, in this process."""
    import keras_hub
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    seq2seq = keras_hub.models.Seq2SeqLM.from_preset(folder)
    seq2seq.compile(sampler="greedy")
    preprocessor = seq2seq.preprocessor

    def batch(texts):
        inputs = preprocessor.generate_preprocess(
            {"encoder_text": texts, "decoder_text": [""] * len(texts)},
            decoder_sequence_length=2 + NEW_TOKENS,
        )
        # No stop token: every text decodes its 64 tokens, as the server's
        # do. No autograd graph: on torch, a step's would be kept alive.
        with torch.no_grad():
            return np.asarray(seq2seq.generate_step(inputs)["decoder_token_ids"])

    batch(texts[:CONCURRENT])  # warm-up
    start = time.perf_counter()
    for index in range(0, len(texts), CONCURRENT):
        batch(texts[index : index + CONCURRENT])
    wall = time.perf_counter() - start
    return {"wall_s": wall, "tokens_per_s": len(texts) * NEW_TOKENS / wall}


def run_server(folder, texts, threads):
    """`vllm-keras-hub serve`, compiled, driven by 16 client threads."""
    import openai

    from vllm_keras_hub.testing.server import free_port
    from vllm_keras_hub.testing.server import running_server
    from vllm_keras_hub.testing.server import serve_command

    port = free_port()
    command = serve_command(
        folder, "--port", str(port), "--dtype", "float32", "--served-model-name", "bench",
        "--max-num-seqs", str(CONCURRENT), "--kv-cache-memory-bytes", str(1 << 30),
    )  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("KERAS_BACKEND", None)
    start = time.perf_counter()
    with running_server(command, port, env=env, model_name="bench") as (base_url, _):
        startup = time.perf_counter() - start
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)

        def complete(text):
            return client.completions.create(
                model="bench", prompt=text, max_tokens=NEW_TOKENS, temperature=0,
                extra_body={"ignore_eos": True},
            ).usage.completion_tokens  # fmt: skip

        complete(texts[0])  # warm-up
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(CONCURRENT) as pool:
            generated = sum(pool.map(complete, texts))
        wall = time.perf_counter() - start
    return {"startup_s": startup, "wall_s": wall, "tokens_per_s": generated / wall}


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    systems = [s for s in LABELS if "tokens_per_s" in results.get(s, {})]
    ax.bar([LABELS[s] for s in systems], [results[s]["tokens_per_s"] for s in systems])
    ax.set_ylabel("generated tokens / s")
    ax.set_title(f"BART-base shape, float32, {CONCURRENT} concurrent, {NEW_TOKENS} tokens each")
    fig.tight_layout()
    fig.savefig(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(RESULTS, "seq2seq.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("KERAS_BACKEND", "torch")
    size = "quick" if args.quick else "full"
    folder = make_weights(size)
    texts = make_texts(REQUESTS)
    if args.worker:
        with open(args.json, "w") as f:
            json.dump(run_generate(folder, texts, args.threads), f)
        return
    results = {"shape": SHAPES[size], "threads": args.threads, "requests": REQUESTS,
               "concurrent": CONCURRENT, "new_tokens": NEW_TOKENS}  # fmt: skip
    print("== keras_hub", file=sys.stderr, flush=True)
    results["keras_hub"] = run_server(folder, texts, args.threads)
    print("== generate", file=sys.stderr, flush=True)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--worker", "--json", out.name,
                   "--threads", str(args.threads)] + (["--quick"] if args.quick else [])  # fmt: skip
        subprocess.run(command, check=True)
        with open(out.name) as f:
            results["generate"] = json.load(f)
    ratio = results["keras_hub"]["tokens_per_s"] / results["generate"]["tokens_per_s"]
    results["ratio_vs_generate"] = ratio
    results["target"] = ">= 3x generate"
    for system, label in LABELS.items():
        print(f"{label:28s} {results[system]['tokens_per_s']:8.1f} tokens/s")
    print(f"vllm-keras-hub / generate: {ratio:.2f}x (target >= 3x)")
    os.makedirs(RESULTS, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    plot(results, os.path.splitext(args.out)[0] + ".png")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
