"""Embeddings: vllm-keras-hub against vLLM native, KerasHub and sentence-transformers.

    .venv/bin/python bench/embeddings.py            # EmbeddingGemma-300M's shape
    .venv/bin/python bench/embeddings.py --quick    # tiny weights, smoke run

Weights: EmbeddingGemma-300M's shape (24 layers, hidden 768, 3 query heads
and 1 KV head of 256, MLP 1152, vocabulary 262,144, sliding window 512,
projections 768 -> 3072 -> 768), random, float32. A random transformers
`Gemma3TextModel` is saved with its sentence-transformers files, and
keras-hub's own converter loads it into the preset
(`vllm_keras_hub/testing/hf_embedders.py`), so every system holds the same
weights. Texts: 512 different texts of 100 to 200 tokens (the tiny test
tokenizer's words), within the 256 tokens served exactly.

Systems, one after another, each in its own process with the same threads:
- `keras_hub`: `vllm-keras-hub serve` of the preset (compiled);
- `native`: vLLM's OpenAI server on the transformers folder (compiled);
- `encode_text`: the preset's own `TextEmbedder` on batches as
  `encode_text()` runs them (its preprocessor pads to 256 tokens);
- `sentence_transformers`: `SentenceTransformer(folder).encode(batch)`.

At 1, 8 and 64 concurrent requests: texts per second, and p50/p99 latency.
The servers get one text per `/v1/embeddings` request from that many client
threads; the two libraries get batches of that many texts (each text's
latency is its batch's). Writes `bench/results/embeddings.json` and
`embeddings.png`, and prints the ratios against native and `encode_text`.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RESULTS = os.path.join(ROOT, "bench", "results")
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "vllm-keras-hub", "bench")
# sentence-transformers is not in the lock: it runs from its own folder.
ST_FOLDER = os.path.join(CACHE, "sentence-transformers")
ST_PACKAGES = ("sentence-transformers", "scipy", "scikit-learn", "joblib",
               "threadpoolctl", "narwhals")
SHAPES = {
    "full": dict(hidden_size=768, intermediate_size=1152, num_hidden_layers=24,
                 num_attention_heads=3, num_key_value_heads=1, head_dim=256,
                 vocab_size=262144, sliding_window=512),
    "quick": {},
}
CONCURRENCY = (1, 8, 64)
TEXTS = 512
SYSTEMS = ("keras_hub", "native", "encode_text", "sentence_transformers")
LABELS = {
    "keras_hub": "vllm-keras-hub serve",
    "native": "vLLM native api_server",
    "encode_text": "KerasHub encode_text",
    "sentence_transformers": "sentence-transformers",
}


REQUESTS = {1: 32, 8: 64, 64: 256}


def requests_at(concurrency, quick):
    return REQUESTS[concurrency] // (4 if quick else 1)


def make_weights(size):
    from vllm_keras_hub.testing.hf_embedders import save_pair

    root = os.path.join(CACHE, f"embedding_gemma-{size}")
    if not os.path.isdir(os.path.join(root, "preset")):
        staging = root + ".staging"
        subprocess.run(["rm", "-rf", staging], check=True)
        save_pair("embedding_gemma", staging, **SHAPES[size])
        os.replace(staging, root)
    return os.path.join(root, "hf"), os.path.join(root, "preset")


def make_texts(preset, count, quick):
    import keras_hub
    import numpy as np

    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    words = [w for w in tokenizer.get_vocabulary() if w.isalpha() and len(w) > 2]
    rng = np.random.default_rng(0)
    low, high = (10, 20) if quick else (100, 200)
    texts = []
    while len(texts) < count:
        target = int(rng.integers(low, high + 1))
        chosen = []
        # Words until the text, with its start and end tokens, is long enough.
        while len(tokenizer.tokenize(" ".join(chosen))) + 2 < target:
            chosen += list(rng.choice(words, size=4))
        texts.append(" ".join(chosen))
    return texts


def latency_summary(latencies, wall):
    import numpy as np

    ms = np.array(latencies) * 1000
    return {"texts_per_s": len(latencies) / wall, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "texts": len(latencies)}


def run_library(system, hf_folder, preset, texts, quick, threads):
    """`encode_text` or sentence-transformers, in this process."""
    import torch

    torch.set_num_threads(threads)
    if system == "encode_text":
        import keras
        import keras_hub

        embedder = keras_hub.models.TextEmbedder.from_preset(preset)

        def encode(batch):
            # `encode_text` is `predict()`, whose input pipeline needs grain or
            # TensorFlow: its preprocessor and model are called as it would.
            return keras.ops.convert_to_numpy(embedder(embedder.preprocessor(batch)))
    else:
        sys.path.insert(0, ST_FOLDER)
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(hf_folder, device="cpu")

        def encode(batch):
            return model.encode(batch, batch_size=len(batch))
    return {"first": encode(texts[:1])[0].tolist(), **time_batches(encode, texts, quick)}


def time_batches(encode, texts, quick):
    """At each concurrency, `encode` on batches of that many texts, timed.

    Each text's latency is its batch's.
    """
    import torch

    result = {}
    with torch.inference_mode():
        for concurrency in CONCURRENCY:
            count = requests_at(concurrency, quick)
            encode(texts[:concurrency])  # warm-up
            latencies, start = [], time.perf_counter()
            for i in range(0, count, concurrency):
                batch_start = time.perf_counter()
                encode(texts[i: i + concurrency])
                latencies += [time.perf_counter() - batch_start] * concurrency
            result[str(concurrency)] = latency_summary(latencies, time.perf_counter() - start)
    return result


def time_requests(post, texts, quick):
    """At each concurrency, `post(text)` from that many client threads, timed."""
    result = {}
    for concurrency in CONCURRENCY:
        batch = texts[:requests_at(concurrency, quick)]
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(post, batch[:concurrency]))  # warm-up

            def timed(text):
                start = time.perf_counter()
                post(text)
                return time.perf_counter() - start

            start = time.perf_counter()
            latencies = list(pool.map(timed, batch))
            wall = time.perf_counter() - start
        result[str(concurrency)] = latency_summary(latencies, wall)
    return result


def _post(port, text):
    body = json.dumps({"model": "bench", "input": text}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)["data"][0]["embedding"]


def run_server(system, hf_folder, preset, texts, quick, threads):
    """A compiled server of `system`, driven over HTTP."""
    from serve import server_command

    from vllm_keras_hub.testing.server import free_port
    from vllm_keras_hub.testing.server import running_server

    port = free_port()
    flags = ["--port", str(port), "--dtype", "float32", "--served-model-name", "bench",
             "--max-num-seqs", "64", "--kv-cache-memory-bytes", str(1 << 30)]
    command = server_command(system, preset, hf_folder, flags)
    # No KERAS_BACKEND: `serve` picks torch itself, as in a user's shell.
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("KERAS_BACKEND", None)
    start = time.perf_counter()
    with running_server(command, port, env=env, model_name="bench"):
        result = {"startup_s": time.perf_counter() - start, "first": _post(port, texts[0])}
        result.update(time_requests(lambda text: _post(port, text), texts, quick))
    return result


def ensure_sentence_transformers():
    if os.path.isdir(os.path.join(ST_FOLDER, "sentence_transformers")):
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    ST_FOLDER, *ST_PACKAGES], check=True)


def throughput_table(results, systems, labels, baselines, lines):
    """Appends each system's texts/s and latencies at `CONCURRENCY` to
    `lines`, then vllm-keras-hub's ratio to each baseline run; drops the
    first outputs (compared before). Returns the ratios."""
    lines.append(f"{'system':26}" + "".join(
        f"{f'texts/s @{c}':>14}{'p50 ms':>10}{'p99 ms':>10}" for c in CONCURRENCY))
    for system in systems:
        row = results.get(system)
        if row is None:  # Not run (--systems).
            continue
        if "error" in row:
            lines.append(f"{labels[system]:26} error: {row['error']}")
            continue
        lines.append(f"{labels[system]:26}" + "".join(
            f"{row[str(c)]['texts_per_s']:14.1f}{row[str(c)]['p50_ms']:10.0f}"
            f"{row[str(c)]['p99_ms']:10.0f}" for c in CONCURRENCY))
    ratios = {}
    for baseline in baselines:
        if "error" in results.get(baseline, {"error": 1}):
            continue
        ratios[baseline] = {
            str(c): results["keras_hub"][str(c)]["texts_per_s"]
            / results[baseline][str(c)]["texts_per_s"] for c in CONCURRENCY}
        lines.append(f"keras_hub / {baseline} texts/s: " + ", ".join(
            f"{r:.2f}x @{c}" for c, r in ratios[baseline].items()))
    for row in results.values():  # Compared already; hundreds of floats each.
        if isinstance(row, dict):
            row.pop("first", None)
    return ratios


def report(results):
    import numpy as np

    lines = []
    first = np.array(results["keras_hub"]["first"])
    for system in SYSTEMS[1:]:
        other = results.get(system, {}).get("first")
        if other is not None:
            results.setdefault("max_difference_vs_keras_hub", {})[system] = float(
                np.abs(np.array(other) - first).max())
    ratios = throughput_table(results, SYSTEMS, LABELS, ("native", "encode_text"), lines)
    results["ratios"] = ratios
    results["targets"] = {"vs native, every concurrency": ">= 0.95x",
                          "vs encode_text at 64": ">= 3x"}
    lines.append(f"max |embedding difference| vs vllm-keras-hub: "
                 f"{results.get('max_difference_vs_keras_hub')}")
    return "\n".join(lines)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.2
    for i, system in enumerate(SYSTEMS):
        row = results.get(system, {})
        values = [row.get(str(c), {}).get("texts_per_s", 0) for c in CONCURRENCY]
        ax.bar([x + i * width for x in range(len(CONCURRENCY))], values, width,
               label=LABELS[system])
    ax.set_xticks([x + 1.5 * width for x in range(len(CONCURRENCY))])
    ax.set_xticklabels([f"{c} concurrent" for c in CONCURRENCY])
    ax.set_ylabel("texts / s")
    ax.set_title("EmbeddingGemma-300M shape, float32, random weights")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--concurrency", default=None,
                        help="e.g. 1 or 1,8: only these levels")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests (texts) per level, over the defaults")
    parser.add_argument("--out", default=os.path.join(RESULTS, "embeddings.json"))
    parser.add_argument("--system", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global CONCURRENCY
    if args.concurrency:
        CONCURRENCY = tuple(int(c) for c in args.concurrency.split(","))
    if args.requests:
        REQUESTS.update({c: args.requests for c in CONCURRENCY})
    os.environ.setdefault("KERAS_BACKEND", "torch")
    size = "quick" if args.quick else "full"
    hf_folder, preset = make_weights(size)
    texts = make_texts(preset, TEXTS, args.quick)
    if args.system:  # A worker: one library system, in its own process.
        result = run_library(args.system, hf_folder, preset, texts, args.quick, args.threads)
        with open(args.json, "w") as f:
            json.dump(result, f)
        return
    results = {"shape": SHAPES[size], "threads": args.threads, "texts": len(texts)}
    for system in args.systems.split(","):
        print(f"== {system}", file=sys.stderr, flush=True)
        try:
            if system in ("keras_hub", "native"):
                results[system] = run_server(system, hf_folder, preset, texts, args.quick,
                                             args.threads)
            else:
                if system == "sentence_transformers":
                    ensure_sentence_transformers()
                with tempfile.NamedTemporaryFile(suffix=".json") as out:
                    subprocess.run([sys.executable, __file__, "--system", system, "--json",
                                    out.name, "--threads", str(args.threads),
                                    *(["--quick"] if args.quick else []),
                                    *(["--concurrency", args.concurrency]
                                      if args.concurrency else []),
                                    *(["--requests", str(args.requests)]
                                      if args.requests else [])], check=True)
                    results[system] = json.load(open(out.name))
        except Exception as e:  # noqa: BLE001 - recorded, the others still run
            results[system] = {"error": f"{type(e).__name__}: {e}"}
    text = report(results)
    print(text)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    plot(results, os.path.splitext(args.out)[0] + ".png")


if __name__ == "__main__":
    main()
