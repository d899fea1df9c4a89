"""One image's time to first token: vllm-keras-hub against KerasHub's generate().

    .venv/bin/python bench/images.py            # about 5 min
    .venv/bin/python bench/images.py --quick    # smoke run

A Gemma3 preset with a vision encoder of SigLIP-base's size (12 layers,
hidden 768, 448-pixel images in 14-pixel patches, pooled to Gemma3's 256
soft tokens) and a small Gemma3 text model (8 layers, hidden 640), random
weights, float32, made once under `~/.cache/vllm-keras-hub/bench`. Each
system runs in its own subprocess, one after another, on one prompt with
one image, a new image each run (so no encoder or prefix cache helps), and
generates one token:
- `keras_hub`: vllm-keras-hub's engine (eager), timed around
  `LLM.generate`; its encoder time is `embed_multimodal`'s, inside;
- `keras_generate`: the preset's own `generate()` function after the
  preset's image converter and tokenizer (`image_oracle.image_prompt_inputs`), as
  the test oracle runs it; its encoder time is the vision encoder's on the
  same pixels, timed again on its own.
Prints the ratio and each encoder's share of the time to first token, and
writes `bench/results/images.json` and `images.png`.
"""

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RESULTS = os.path.join(ROOT, "bench", "results")
PROMPT = "<start_of_image> Describe this image in one word."
SYSTEMS = ("keras_hub", "keras_generate")


def make_preset():
    """The bench preset's folder, built once."""
    import keras
    import keras_hub
    from keras_hub.src.models.gemma3.gemma3_image_converter import Gemma3ImageConverter
    from keras_hub.src.models.gemma3.gemma3_vision_encoder import Gemma3VisionEncoder

    from vllm_keras_hub.testing.presets import make_tokenizer

    folder = os.path.expanduser("~/.cache/vllm-keras-hub/bench/gemma3-vision-siglip-base")
    if os.path.exists(os.path.join(folder, "image_converter.json")):
        return folder
    keras.utils.set_random_seed(0)
    tokenizer = make_tokenizer("gemma3")
    encoder = Gemma3VisionEncoder(
        image_size=448, patch_size=14, num_heads=12, hidden_dim=768, num_layers=12,
        intermediate_dim=3072, output_dim=640, pool_size=2,
    )  # fmt: skip
    backbone = keras_hub.models.Gemma3Backbone(
        vocabulary_size=tokenizer.vocabulary_size(), image_size=448, num_layers=8,
        num_query_heads=4, num_key_value_heads=1, hidden_dim=640, intermediate_dim=2048,
        head_dim=256, query_head_dim_normalize=True, use_post_ffw_norm=True,
        use_post_attention_norm=True, use_sliding_window_attention=True,
        sliding_window_size=512, vision_encoder=encoder,
    )  # fmt: skip
    causal_lm = keras_hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=None)
    causal_lm.save_to_preset(folder)
    tokenizer.save_to_preset(folder)
    Gemma3ImageConverter(image_size=(448, 448), scale=1 / 127.5, offset=-1.0).save_to_preset(
        folder
    )
    return folder


def _images(count):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    return [Image.fromarray(rng.integers(0, 255, (480, 640, 3), np.uint8)) for _ in range(count)]


def run_keras_hub(preset, runs):
    from vllm import SamplingParams

    from vllm_keras_hub.testing.engines import in_process_llm
    from vllm_keras_hub.testing.engines import served_model

    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    rows = []
    with in_process_llm(f"keras_hub:{preset}", max_model_len=512, enable_prefix_caching=False) as llm:
        model = served_model(llm)
        embed = model.embed_multimodal
        encoder_s = []

        def timed(**kwargs):
            start = time.perf_counter()
            out = embed(**kwargs)
            encoder_s.append(time.perf_counter() - start)
            return out

        model.embed_multimodal = timed
        for image in _images(runs + 1):
            encoder_s.clear()
            start = time.perf_counter()
            llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": image}}], params, use_tqdm=False)
            rows.append(dict(ttft_s=time.perf_counter() - start, encoder_s=sum(encoder_s)))
    return rows[1:]  # the first warms up


def run_keras_generate(preset, runs):
    import keras_hub
    import torch
    from keras_hub.src.layers.preprocessing.image_converter import ImageConverter

    from vllm_keras_hub.testing.image_oracle import image_prompt_inputs

    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(preset)
    converter = ImageConverter.from_preset(preset)
    causal_lm = keras_hub.models.Gemma3CausalLM.from_preset(preset, preprocessor=None)
    causal_lm.compile(sampler="greedy")
    generate_function = causal_lm.make_generate_function()
    encoder = causal_lm.backbone.vision_encoder
    rows = []
    for image in _images(runs + 1):
        start = time.perf_counter()
        _, inputs = image_prompt_inputs(causal_lm, tokenizer, converter, PROMPT, [image], 1)
        generate_function(inputs, stop_token_ids=None)
        ttft = time.perf_counter() - start
        with torch.inference_mode():
            start = time.perf_counter()
            encoder(inputs["images"])
            encoder_s = time.perf_counter() - start
        rows.append(dict(ttft_s=ttft, encoder_s=encoder_s))
    return rows[1:]  # the first traces generate()'s function


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", choices=SYSTEMS)
    parser.add_argument("--preset")
    args = parser.parse_args()
    runs = 2 if args.quick else 5
    if args.worker:
        work = run_keras_hub if args.worker == "keras_hub" else run_keras_generate
        print("RESULT " + json.dumps(work(args.preset, runs)))
        return
    preset = make_preset()
    results = {}
    for system in SYSTEMS:
        output = subprocess.run(
            [sys.executable, __file__, "--worker", system, "--preset", preset]
            + (["--quick"] if args.quick else []),
            capture_output=True, text=True, check=True,
            env={**os.environ, "KERAS_BACKEND": "torch", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        )  # fmt: skip
        line = [x for x in output.stdout.splitlines() if x.startswith("RESULT ")][-1]
        results[system] = json.loads(line[len("RESULT ") :])
    summary = {}
    for system, rows in results.items():
        ttft = sorted(r["ttft_s"] for r in rows)[len(rows) // 2]
        encoder = sorted(r["encoder_s"] for r in rows)[len(rows) // 2]
        summary[system] = dict(ttft_s=ttft, encoder_s=encoder, encoder_share=encoder / ttft)
        print(f"{system:15s} TTFT {ttft:6.2f} s   encoder {encoder:6.2f} s ({encoder / ttft:.0%})")
    ratio = summary["keras_hub"]["ttft_s"] / summary["keras_generate"]["ttft_s"]
    print(f"served TTFT / generate() TTFT: {ratio:.2f}x")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "images.json"), "w") as f:
        json.dump(dict(prompt=PROMPT, runs=runs, rows=results, summary=summary,
                       ttft_ratio=ratio, load=os.getloadavg()), f, indent=2)  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    names = list(summary)
    encoder = [summary[n]["encoder_s"] for n in names]
    rest = [summary[n]["ttft_s"] - summary[n]["encoder_s"] for n in names]
    ax.barh(names, encoder, label="vision encoder")
    ax.barh(names, rest, left=encoder, label="the rest (prefill, preprocessing, first token)")
    ax.set_xlabel("time to first token, one image (s, median)")
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "images.png"), dpi=120)


if __name__ == "__main__":
    main()
