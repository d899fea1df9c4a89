"""Text classifiers: vllm-keras-hub against vLLM native BERT and the preset's own predict().

    .venv/bin/python bench/classify.py            # BERT-base's shape
    .venv/bin/python bench/classify.py --quick    # tiny weights, smoke run

Weights: BERT-base's shape (12 layers, hidden 768, 12 heads, MLP 3072, 512
positions), three classes, random, float32. A random transformers
`BertForSequenceClassification` is saved, and keras-hub's converter loads
its encoder into the `BertTextClassifier` preset, its classifier layer as
the preset's `logits` (`vllm_keras_hub/testing/classifiers.py`), so both
servers hold the same weights. The vocabulary is the tiny test one (BERT's
30,522-row embedding costs a lookup, not a matmul). Texts: 512 texts of 100
to 200 tokens.

Systems, one after another, each in its own process with the same threads:
- `keras_hub`: `vllm-keras-hub serve` of the preset (compiled);
- `native`: vLLM's OpenAI server on the transformers folder (compiled);
- `predict`: the preset's own `TextClassifier` on batches as `predict()`
  runs them (its preprocessor pads to 256 tokens).

At 1, 8 and 64 concurrent requests: texts per second, and p50/p99 latency.
The servers get one text per `/classify` request from that many client
threads; `predict` gets batches of that many texts. Writes
`bench/results/classify.json` and `classify.png`, and prints the ratios
against native and `predict`.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from embeddings import make_texts  # noqa: E402
from embeddings import throughput_table  # noqa: E402
from embeddings import time_batches  # noqa: E402
from embeddings import time_requests  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "vllm-keras-hub", "bench")
SHAPES = {
    "full": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                 num_attention_heads=12, max_position_embeddings=512),
    "quick": {},
}
SEQUENCE_LENGTH = {"full": 256, "quick": 48}
# At 1, 8 and 64 concurrent, as `embeddings.py` times them.
CONCURRENCY = (1, 8, 64)
TEXTS = 512
SYSTEMS = ("keras_hub", "native", "predict")
LABELS = {
    "keras_hub": "vllm-keras-hub serve",
    "native": "vLLM native api_server",
    "predict": "KerasHub predict()",
}


def make_weights(size):
    from vllm_keras_hub.testing.classifiers import save_bert_pair

    root = os.path.join(CACHE, f"bert-classifier-{size}")
    if not os.path.isdir(os.path.join(root, "preset")):
        staging = root + ".staging"
        subprocess.run(["rm", "-rf", staging], check=True)
        save_bert_pair(staging, sequence_length=SEQUENCE_LENGTH[size], **SHAPES[size])
        os.replace(staging, root)
    return os.path.join(root, "hf"), os.path.join(root, "preset")


def run_predict(preset, texts, quick, threads):
    """The preset's own classifier, in this process."""
    import keras
    import keras_hub
    import torch

    torch.set_num_threads(threads)
    classifier = keras_hub.models.TextClassifier.from_preset(preset)

    def predict(batch):
        # `predict()`'s input pipeline needs grain or TensorFlow: its
        # preprocessor and model are called as it would call them.
        return keras.ops.convert_to_numpy(classifier(classifier.preprocessor(batch)))

    return {"first": predict(texts[:1])[0].tolist(), **time_batches(predict, texts, quick)}


def _post(port, text):
    body = json.dumps({"model": "bench", "input": text}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/classify", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)["data"][0]["probs"]


def run_server(system, hf_folder, preset, texts, quick, threads, max_model_len):
    """A compiled server of `system`, driven over HTTP."""
    from serve import server_command

    from vllm_keras_hub.testing.server import free_port
    from vllm_keras_hub.testing.server import running_server

    port = free_port()
    flags = ["--port", str(port), "--dtype", "float32", "--served-model-name", "bench",
             "--max-num-seqs", "64", "--max-model-len", str(max_model_len),
             "--kv-cache-memory-bytes", str(1 << 30)]
    command = server_command(system, preset, hf_folder, flags)
    # No KERAS_BACKEND: `serve` picks torch itself, as in a user's shell.
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("KERAS_BACKEND", None)
    start = time.perf_counter()
    with running_server(command, port, env=env, model_name="bench"):
        result = {"startup_s": time.perf_counter() - start, "first": _post(port, texts[0])}
        result.update(time_requests(lambda text: _post(port, text), texts, quick))
    return result


def report(results):
    import numpy as np

    lines = []
    first = np.array(results["keras_hub"]["first"])
    differences = {}
    for system in ("native",):
        other = results.get(system, {}).get("first")
        if other is not None:
            differences[system] = float(np.abs(np.array(other) - first).max())
    results["max_probs_difference_vs_keras_hub"] = differences
    results["ratios"] = throughput_table(results, SYSTEMS, LABELS, ("native", "predict"), lines)
    results["targets"] = {"vs native, every concurrency": ">= 0.95x"}
    lines.append(f"max |probs difference| vs vllm-keras-hub: {differences}")
    return "\n".join(lines)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.27
    for i, system in enumerate(SYSTEMS):
        row = results.get(system, {})
        values = [row.get(str(c), {}).get("texts_per_s", 0) for c in CONCURRENCY]
        ax.bar([x + i * width for x in range(len(CONCURRENCY))], values, width,
               label=LABELS[system])
    ax.set_xticks([x + width for x in range(len(CONCURRENCY))])
    ax.set_xticklabels([f"{c} concurrent" for c in CONCURRENCY])
    ax.set_ylabel("texts / s")
    ax.set_title("BERT-base shape classifier, float32, random weights")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(RESULTS, "classify.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("KERAS_BACKEND", "torch")
    size = "quick" if args.quick else "full"
    hf_folder, preset = make_weights(size)
    texts = make_texts(preset, TEXTS, args.quick)
    if args.worker:  # `predict`, in its own process.
        with open(args.json, "w") as f:
            json.dump(run_predict(preset, texts, args.quick, args.threads), f)
        return
    results = {"shape": SHAPES[size], "threads": args.threads, "texts": len(texts)}
    for system in args.systems.split(","):
        print(f"== {system}", file=sys.stderr, flush=True)
        try:
            if system == "predict":
                with tempfile.NamedTemporaryFile(suffix=".json") as out:
                    command = [sys.executable, __file__, "--worker", "--json", out.name,
                               "--threads", str(args.threads)]
                    subprocess.run(command + (["--quick"] if args.quick else []), check=True)
                    with open(out.name) as f:
                        results[system] = json.load(f)
            else:
                results[system] = run_server(system, hf_folder, preset, texts, args.quick,
                                             args.threads, SEQUENCE_LENGTH[size])
        except Exception as e:  # noqa: BLE001 - reported, and the others still run
            results[system] = {"error": f"{type(e).__name__}: {e}"[:500]}
    print(report(results))
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    plot(results, os.path.splitext(args.out)[0] + ".png")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
