"""One image's time to first token: vllm-keras-hub against KerasHub's generate().

    .venv/bin/python bench/images.py                     # Gemma3, about 5 min
    .venv/bin/python bench/images.py --family gemma3n    # about 5 min
    .venv/bin/python bench/images.py --family gemma4     # about 10 min
    .venv/bin/python bench/images.py --family gemma3n_audio  # one 10 s clip
    .venv/bin/python bench/images.py --family gemma4_audio   # one 10 s clip
    .venv/bin/python bench/images.py --family gemma4_video   # one 32-frame video
    .venv/bin/python bench/images.py --quick             # smoke run

A random-weight preset of each family, float32, made once under
`~/.cache/vllm-keras-hub/bench`, with a small text model (8 layers, hidden
640) and a vision encoder of a published size:
- `gemma3`: SigLIP-base's size (12 layers, hidden 768, 448-pixel images in
  14-pixel patches, pooled to Gemma3's 256 soft tokens);
- `gemma3n`: the published MobileNet-v5-300M (its architecture as
  KerasHub's converter builds it), 768-pixel images, 256 soft tokens;
- `gemma4`: a ViT of SigLIP-base's size (12 layers, hidden 768) in
  16-pixel patches, the converter's 2520 patches pooled by 3 to 280 soft
  tokens, attending bidirectionally within each image (as the 26B and 31B
  presets);
- `gemma4_video`: the same, causal (as E2B and E4B), with the published
  video converter's settings: 32 frames of 480x640 pixels, each at most 70
  soft tokens (here 63), about 2,300 tokens a video.
Each system runs in its own subprocess, one after another, on one prompt
with one image, a new image each run (so no encoder or prefix cache helps),
and generates one token:
- `keras_hub`: vllm-keras-hub's engine (eager), timed around
  `LLM.generate`; its encoder time is `embed_multimodal`'s, inside;
- `keras_generate`: the preset's own `generate()` function after the
  preset's image converter and tokenizer (`image_oracle.image_prompt_inputs`),
  as the test oracle runs it; its encoder time is the vision encoder's on
  the same pixels, timed again on its own. (Gemma4's `generate()` attends
  causally over the images, a KerasHub bug; the time is about the same.)
Prints the ratio and each encoder's share of the time to first token, and
writes `bench/results/images[-FAMILY].json` and `.png`.
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
PROMPTS = {
    "gemma3": "<start_of_image> Describe this image in one word.",
    "gemma3n": "<start_of_image> Describe this image in one word.",
    "gemma3n_audio": "<start_of_audio> Transcribe this clip.",
    "gemma4": "<|image|> Describe this image in one word.",
    "gemma4_audio": "<|audio|> Transcribe this clip.",
    "gemma4_video": "<|video|> Describe this video.",
}
SYSTEMS = ("keras_hub", "keras_generate")
_TEXT = dict(num_layers=8, hidden_dim=640, intermediate_dim=2048)


def _gemma3(tokenizer):
    import keras_hub
    from keras_hub.src.models.gemma3.gemma3_image_converter import Gemma3ImageConverter
    from keras_hub.src.models.gemma3.gemma3_vision_encoder import Gemma3VisionEncoder

    encoder = Gemma3VisionEncoder(
        image_size=448, patch_size=14, num_heads=12, hidden_dim=768, num_layers=12,
        intermediate_dim=3072, output_dim=640, pool_size=2,
    )  # fmt: skip
    backbone = keras_hub.models.Gemma3Backbone(
        vocabulary_size=tokenizer.vocabulary_size(), image_size=448, num_query_heads=4,
        num_key_value_heads=1, head_dim=256, query_head_dim_normalize=True,
        use_post_ffw_norm=True, use_post_attention_norm=True,
        use_sliding_window_attention=True, sliding_window_size=512,
        vision_encoder=encoder, **_TEXT,
    )  # fmt: skip
    converter = Gemma3ImageConverter(image_size=(448, 448), scale=1 / 127.5, offset=-1.0)
    return keras_hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=None), converter


def _gemma3n(tokenizer):
    import keras_hub
    from keras_hub.src.models.gemma3n.gemma3n_image_converter import Gemma3nImageConverter
    from keras_hub.src.utils.transformers.convert_gemma3n import MODEL_CONFIGS

    encoder = dict(MODEL_CONFIGS["mobilenetv5_300m_enc"], image_shape=(768, 768, 3))
    backbone = keras_hub.models.Gemma3nBackbone(
        text_vocab_size=tokenizer.vocabulary_size(), text_hidden_size=640,
        num_hidden_layers=8, pad_token_id=0, num_attention_heads=4, num_key_value_heads=1,
        head_dim=256, intermediate_size=[2048] * 8, hidden_activation="gelu_approximate",
        layer_types=["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3
        + ["full_attention"], sliding_window=512, rope_theta=1000000.0,
        max_position_embeddings=2048, vocab_size_per_layer_input=tokenizer.vocabulary_size(),
        hidden_size_per_layer_input=64, altup_num_inputs=4, laurel_rank=64,
        num_kv_shared_layers=2, vision_encoder_config=encoder, vision_hidden_size=2048,
        vision_vocab_offset=tokenizer.token_to_id("<end_of_image>"), vision_vocab_size=2,
        vision_soft_tokens_per_image=256, image_token_id=tokenizer.image_placeholder_id,
    )  # fmt: skip
    converter = Gemma3nImageConverter(image_size=(768, 768), scale=1 / 127.5, offset=-1.0)
    return keras_hub.models.Gemma3nCausalLM(backbone=backbone, preprocessor=None), converter


def _gemma3n_audio(tokenizer):
    """`_gemma3n`'s preset with an audio encoder of the published size (its
    Hugging Face config's defaults: 12 conformer layers, hidden 1536) and
    the published converter's settings; 188 soft tokens per clip."""
    from transformers import Gemma3nAudioConfig

    from vllm_keras_hub.testing.vision_presets import _audio_converter

    causal_lm, _ = _gemma3n(tokenizer)
    hf = Gemma3nAudioConfig()
    audio = dict(
        hidden_size=hf.hidden_size, input_feat_size=hf.input_feat_size,
        sscp_conv_channel_size=hf.sscp_conv_channel_size,
        sscp_conv_kernel_size=hf.sscp_conv_kernel_size,
        sscp_conv_stride_size=hf.sscp_conv_stride_size,
        sscp_conv_group_norm_eps=hf.sscp_conv_group_norm_eps,
        num_hidden_layers=hf.conf_num_hidden_layers, rms_norm_eps=hf.rms_norm_eps,
        gradient_clipping=hf.gradient_clipping, residual_weight=hf.conf_residual_weight,
        num_attention_heads=hf.conf_num_attention_heads,
        attention_chunk_size=hf.conf_attention_chunk_size,
        num_attention_context_right=hf.conf_attention_context_right,
        num_attention_context_left=hf.conf_attention_context_left,
        attention_logit_cap=hf.conf_attention_logit_cap,
        conv_kernel_size=hf.conf_conv_kernel_size, reduction_factor=hf.conf_reduction_factor,
    )  # fmt: skip
    offset = tokenizer.token_to_id("<end_of_audio>")
    config = dict(
        causal_lm.backbone.get_config(), audio_encoder_config=audio,
        audio_hidden_size=hf.hidden_size, audio_vocab_offset=offset,
        audio_vocab_size=tokenizer.vocabulary_size() - offset,
        audio_soft_tokens_per_image=188, audio_token_id=tokenizer.audio_placeholder_id,
    )  # fmt: skip
    backbone = type(causal_lm.backbone).from_config(config)
    converter = _audio_converter()
    converter = type(converter).from_config(
        dict(converter.get_config(), feature_size=hf.input_feat_size)
    )
    return type(causal_lm)(backbone=backbone, preprocessor=None), converter


def _gemma4(tokenizer, **options):
    import keras_hub
    from keras_hub.src.models.gemma4.gemma4_image_converter import Gemma4ImageConverter
    from keras_hub.src.models.gemma4.gemma4_vision_encoder import Gemma4VisionEncoder

    encoder = Gemma4VisionEncoder(
        image_size=768, patch_size=16, num_heads=12, hidden_dim=768, num_layers=12,
        intermediate_dim=3072, head_dim=64, output_dim=640, pool_size=3,
    )  # fmt: skip
    backbone = keras_hub.models.Gemma4Backbone(
        vocabulary_size=tokenizer.vocabulary_size(), image_size=768, num_query_heads=4,
        num_key_value_heads=1, head_dim=256, sliding_window_size=512,
        vision_encoder=encoder, **{"use_vision_bidirectional_attention": True, **options},
        **_TEXT,
    )  # fmt: skip
    converter = Gemma4ImageConverter(patch_size=16, scale=1 / 127.5, offset=-1.0)
    return keras_hub.models.Gemma4CausalLM(backbone=backbone, preprocessor=None), converter


def _gemma4_audio(tokenizer):
    """A causal Gemma4 preset (as E2B and E4B) with `_gemma4`'s text model
    and vision encoder, and an audio encoder of the published size
    (`Gemma4AudioEncoder`'s defaults: 12 conformer layers, hidden 1024) with
    the published converter's settings; 250 soft tokens for a 10 s clip."""
    from keras_hub.src.models.gemma4.gemma4_audio_converter import Gemma4AudioConverter
    from keras_hub.src.models.gemma4.gemma4_audio_encoder import Gemma4AudioEncoder

    encoder = Gemma4AudioEncoder(output_dim=_TEXT["hidden_dim"])
    causal_lm, _ = _gemma4(
        tokenizer, use_vision_bidirectional_attention=False, audio_encoder=encoder,
        num_audio_tokens_per_clip=750,
    )  # fmt: skip
    return causal_lm, Gemma4AudioConverter()


def _gemma4_video(tokenizer):
    """`_gemma4`, causal, with the published video converter's settings."""
    from keras_hub.src.models.gemma4.gemma4_video_converter import Gemma4VideoConverter

    causal_lm, _ = _gemma4(tokenizer, use_vision_bidirectional_attention=False)
    converter = Gemma4VideoConverter(
        patch_size=16, max_soft_tokens=70, num_frames=32, scale=1 / 127.5, offset=-1.0
    )
    return causal_lm, converter


def make_preset(family):
    """The bench preset's folder, built once."""
    import keras

    from vllm_keras_hub.testing.tokenizers import make_tokenizer

    names = {"gemma3": "gemma3-vision-siglip-base", "gemma3n": "gemma3n-mobilenetv5-300m",
             "gemma3n_audio": "gemma3n-mobilenetv5-300m-audio",
             "gemma4_audio": "gemma4-vit-base-conformer",
             "gemma4_video": "gemma4-vit-base-video",
             "gemma4": "gemma4-vision-vit-base-bidirectional"}  # fmt: skip
    folder = os.path.expanduser(f"~/.cache/vllm-keras-hub/bench/{names[family]}")
    if os.path.exists(os.path.join(folder, "task.json")):
        return folder
    keras.utils.set_random_seed(0)
    tokenizer = make_tokenizer(family.split("_")[0], images=True, audio=family.endswith("audio"))
    causal_lm, converter = globals()[f"_{family}"](tokenizer)
    causal_lm.save_to_preset(folder)
    tokenizer.save_to_preset(folder)
    converter.save_to_preset(folder)
    if family == "gemma3n_audio":  # Its image converter too, as published.
        from keras_hub.src.models.gemma3n.gemma3n_image_converter import (
            Gemma3nImageConverter,
        )

        Gemma3nImageConverter(image_size=(768, 768), scale=1 / 127.5, offset=-1.0).save_to_preset(
            folder
        )
    if family in ("gemma4_audio", "gemma4_video"):
        from keras_hub.src.models.gemma4.gemma4_image_converter import Gemma4ImageConverter

        Gemma4ImageConverter(patch_size=16, scale=1 / 127.5, offset=-1.0).save_to_preset(folder)
    return folder


def _clips(count):
    """10 s clips of noise at 16 kHz, a new one each run."""
    import numpy as np

    rng = np.random.default_rng(1)
    return [(rng.standard_normal(160000) * 0.1).astype("float32") for _ in range(count)]


def _videos(count):
    """32 frames of 480x640 noise, the 15th of a 30 fps source (as vLLM's
    loader samples a 16 s video), a new video each run."""
    import numpy as np

    from vllm_keras_hub.testing.videos import Video

    rng = np.random.default_rng(1)
    metadata = {"frames_indices": [15 * i for i in range(32)], "fps": 30.0}
    shape = (32, 480, 640, 3)
    return [Video(rng.integers(0, 255, shape, np.uint8), metadata) for _ in range(count)]


def _media(prompt, count):
    if "<start_of_audio>" in prompt or "<|audio|>" in prompt:
        return [("audio", (clip, 16000)) for clip in _clips(count)]
    if "<|video|>" in prompt:
        return [("video", video) for video in _videos(count)]
    return [("image", image) for image in _images(count)]


def _images(count):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    return [Image.fromarray(rng.integers(0, 255, (480, 640, 3), np.uint8)) for _ in range(count)]


def run_keras_hub(preset, runs, prompt):
    from vllm import SamplingParams

    from vllm_keras_hub.testing.engines import in_process_llm
    from vllm_keras_hub.testing.engines import served_model

    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    rows = []
    with in_process_llm(
        f"keras_hub:{preset}",
        max_model_len=4096 if "<|video|>" in prompt else 512,
        enable_prefix_caching=False,
        block_size=32,
    ) as llm:
        model = served_model(llm)
        embed = model.embed_multimodal
        encoder_s = []

        def timed(**kwargs):
            start = time.perf_counter()
            out = embed(**kwargs)
            encoder_s.append(time.perf_counter() - start)
            return out

        model.embed_multimodal = timed
        for modality, item in _media(prompt, runs + 1):
            encoder_s.clear()
            start = time.perf_counter()
            llm.generate([{"prompt": prompt, "multi_modal_data": {modality: item}}], params, use_tqdm=False)
            rows.append(dict(ttft_s=time.perf_counter() - start, encoder_s=sum(encoder_s)))
    return rows[1:]  # the first warms up


def run_keras_generate(preset, runs, prompt):
    import torch

    from vllm_keras_hub.testing.image_oracle import image_parts
    from vllm_keras_hub.testing.image_oracle import image_prompt_inputs

    causal_lm, tokenizer, converter = image_parts(preset)
    causal_lm.compile(sampler="greedy")
    generate_function = causal_lm.make_generate_function()
    backbone = causal_lm.backbone
    encoder = backbone.vision_encoder
    rows = []
    for modality, item in _media(prompt, runs + 1):
        start = time.perf_counter()
        images, clips = ([item], ()) if modality == "image" else ([], [item[0]])
        if modality == "video":
            images, clips = item, ()
        _, inputs = image_prompt_inputs(
            causal_lm, tokenizer, converter, prompt, images, 1, clips=clips, preset=preset
        )
        generate_function(inputs, stop_token_ids=None)
        ttft = time.perf_counter() - start
        with torch.inference_mode():
            start = time.perf_counter()
            if clips and "audio_mel" in inputs:  # Gemma4
                backbone.audio_encoder(inputs["audio_mel"], inputs["audio_mel_mask"].bool())
            elif clips:
                backbone.audio_encoder(
                    (inputs["input_features"][0], inputs["input_features_mask"][0])
                )
            elif "pixel_values" in inputs:  # Gemma4
                encoder({k: inputs[k] for k in ("pixel_values", "pixel_position_ids")})
            elif type(backbone).__name__ == "Gemma3nBackbone":
                encoder(inputs["images"][0])
            else:
                encoder(inputs["images"])
            encoder_s = time.perf_counter() - start
        rows.append(dict(ttft_s=ttft, encoder_s=encoder_s))
    return rows[1:]  # the first traces generate()'s function


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", choices=SYSTEMS)
    parser.add_argument("--preset")
    parser.add_argument("--family", choices=sorted(PROMPTS), default="gemma3")
    args = parser.parse_args()
    runs = 2 if args.quick else 5
    prompt = PROMPTS[args.family]
    if args.worker:
        work = run_keras_hub if args.worker == "keras_hub" else run_keras_generate
        print("RESULT " + json.dumps(work(args.preset, runs, prompt)))
        return
    preset = make_preset(args.family)
    results = {}
    for system in SYSTEMS:
        output = subprocess.run(
            [sys.executable, __file__, "--worker", system, "--preset", preset,
             "--family", args.family]
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
    name = "images" if args.family == "gemma3" else f"images-{args.family}"
    with open(os.path.join(RESULTS, f"{name}.json"), "w") as f:
        json.dump(dict(family=args.family, prompt=prompt, runs=runs, rows=results,
                       summary=summary, ttft_ratio=ratio, load=os.getloadavg()),
                  f, indent=2)  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    names = list(summary)
    encoder = [summary[n]["encoder_s"] for n in names]
    rest = [summary[n]["ttft_s"] - summary[n]["encoder_s"] for n in names]
    audio = "audio" in args.family
    ax.barh(names, encoder, label="audio encoder" if audio else "vision encoder")
    ax.barh(names, rest, left=encoder, label="the rest (prefill, preprocessing, first token)")
    item = "clip" if audio else "video" if "video" in args.family else "image"
    ax.set_xlabel(f"time to first token, one {item} (s, median)")
    ax.legend(loc="lower right", fontsize=7)
    ax.set_title(f"{args.family}: {os.path.basename(preset)}", fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, f"{name}.png"), dpi=120)


if __name__ == "__main__":
    main()
