"""Speech-to-text: vllm-keras-hub against the preset's own decoding.

    .venv/bin/python bench/speech_to_text.py            # moonshine_tiny_en's shape
    .venv/bin/python bench/speech_to_text.py --quick    # the tests' tiny preset

Weights: `moonshine_tiny_en`'s shape (6 encoder and 6 decoder layers,
hidden 288, 8 heads of 36), random, float32, saved as a
`MoonshineAudioToText` preset with the tests' tiny vocabulary
(`vllm_keras_hub/testing/audio_to_text.py`). The end token's embedding row
is zeroed, so that neither system stops early: every clip decodes its 48
tokens. vLLM has no Moonshine of its own to compare with.

32 clips of 4 to 8 seconds, greedy, 8 at a time:
- `keras_hub`: `vllm-keras-hub serve` of the preset (compiled), 8 client
  threads sending `/v1/audio/transcriptions` (WAV files);
- `generate`: the preset's own `MoonshineAudioToText` decoding 8 clips a
  batch (padded, as its preprocessor pads a batch),
  `generate_preprocess` then `generate_step`, in its own process.

Each with the same threads. Prints tokens per second and the ratio, writes
`bench/results/speech_to_text.json` and `speech_to_text.png`.
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
from bench.seq2seq import CACHE  # noqa: E402
from bench.seq2seq import RESULTS  # noqa: E402

SHAPES = {
    "full": dict(filter_dim=288, encoder_num_layers=6, decoder_num_layers=6, hidden_dim=288,
                 intermediate_dim=288, encoder_num_heads=8, decoder_num_heads=8),
    "quick": {},
}
CONCURRENT = 8
REQUESTS = 32
NEW_TOKENS = 48
LABELS = {"keras_hub": "vllm-keras-hub serve", "generate": "KerasHub generate_step"}


def make_preset(size):
    import keras_hub

    from vllm_keras_hub.testing.audio_to_text import build_tiny_moonshine

    folder = os.path.join(CACHE, f"moonshine-{size}")
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    build_tiny_moonshine(folder, **SHAPES[size])
    task = keras_hub.models.MoonshineAudioToText.from_preset(folder, dtype="float32")
    embeddings = task.backbone.token_embedding.embeddings
    rows = embeddings.numpy()
    rows[task.preprocessor.tokenizer.end_token_id] = 0
    embeddings.assign(rows)
    task.save_to_preset(folder)
    return folder


def make_clips(count):
    from vllm_keras_hub.testing.audio_to_text import clip

    return [clip(4 + (index % 5), index) for index in range(count)]


def run_generate(folder, clips, threads):
    """The preset's own greedy decoding, 8 clips a batch, in this process."""
    import keras_hub
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    task = keras_hub.models.MoonshineAudioToText.from_preset(folder, dtype="float32")
    task.compile(sampler="greedy")

    def batch(clips):
        audio = np.zeros((len(clips), max(len(c) for c in clips)), "float32")
        for row, samples in zip(audio, clips):
            row[: len(samples)] = samples
        # No autograd graph: on torch, a step's would be kept alive.
        with torch.no_grad():
            inputs = task.preprocessor.generate_preprocess(
                {"audio": audio}, decoder_sequence_length=2 + NEW_TOKENS
            )
            return np.asarray(task.generate_step(inputs)["decoder_token_ids"])

    batch(clips[:CONCURRENT])  # warm-up
    start = time.perf_counter()
    for index in range(0, len(clips), CONCURRENT):
        batch(clips[index : index + CONCURRENT])
    wall = time.perf_counter() - start
    return {"wall_s": wall, "tokens_per_s": len(clips) * NEW_TOKENS / wall}


def run_server(folder, clips, threads):
    """`vllm-keras-hub serve`, compiled, driven by 8 client threads."""
    import openai

    from vllm_keras_hub.testing.audio_to_text import wav_bytes
    from vllm_keras_hub.testing.server import free_port
    from vllm_keras_hub.testing.server import running_server
    from vllm_keras_hub.testing.server import serve_command

    files = [wav_bytes(samples)[0] for samples in clips]
    port = free_port()
    command = serve_command(
        folder, "--port", str(port), "--dtype", "float32", "--served-model-name", "bench",
        "--max-num-seqs", str(CONCURRENT), "--kv-cache-memory-bytes", str(1 << 30),
        "--max-model-len", str(4 + NEW_TOKENS),
    )  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("KERAS_BACKEND", None)
    start = time.perf_counter()
    with running_server(command, port, env=env, model_name="bench") as (base_url, _):
        startup = time.perf_counter() - start
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)

        def transcribe(data):
            client.audio.transcriptions.create(
                model="bench", file=("clip.wav", data, "audio/wav"), temperature=0,
                extra_body={"max_completion_tokens": NEW_TOKENS},
            )  # fmt: skip
            return NEW_TOKENS

        transcribe(files[0])  # warm-up
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(CONCURRENT) as pool:
            generated = sum(pool.map(transcribe, files))
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
    ax.set_title(f"Moonshine tiny shape, float32, {CONCURRENT} concurrent, {NEW_TOKENS} tokens each")
    fig.tight_layout()
    fig.savefig(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(RESULTS, "speech_to_text.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("KERAS_BACKEND", "torch")
    size = "quick" if args.quick else "full"
    folder = make_preset(size)
    clips = make_clips(REQUESTS)
    if args.worker:
        with open(args.json, "w") as f:
            json.dump(run_generate(folder, clips, args.threads), f)
        return
    results = {"shape": SHAPES[size], "threads": args.threads, "requests": REQUESTS,
               "concurrent": CONCURRENT, "new_tokens": NEW_TOKENS}  # fmt: skip
    print("== keras_hub", file=sys.stderr, flush=True)
    results["keras_hub"] = run_server(folder, clips, args.threads)
    print("== generate", file=sys.stderr, flush=True)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--worker", "--json", out.name,
                   "--threads", str(args.threads)] + (["--quick"] if args.quick else [])  # fmt: skip
        subprocess.run(command, check=True)
        with open(out.name) as f:
            results["generate"] = json.load(f)
    ratio = results["keras_hub"]["tokens_per_s"] / results["generate"]["tokens_per_s"]
    results["ratio_vs_generate"] = ratio
    for system, label in LABELS.items():
        print(f"{label:28s} {results[system]['tokens_per_s']:8.1f} tokens/s")
    print(f"vllm-keras-hub / generate: {ratio:.2f}x")
    os.makedirs(RESULTS, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    plot(results, os.path.splitext(args.out)[0] + ".png")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
