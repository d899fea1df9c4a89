"""Tiny presets and their oracles, made once per test run for every module.

A parity test needs a preset and its oracle's tokens; many modules need the
same ones (`model_test.py`, `parallel_test.py`, `native_families_test.py`,
...). Each is made once per run, in a folder the run's pytest-xdist workers
share, under a file lock, and read by every module and worker after that.
Nothing is kept between runs: a changed builder or oracle always counts.
"""

import hashlib
import json
import os
import shutil
import tempfile

import filelock


class Shared:
    """The run's tiny presets and oracle results, made on first use.

    Args:
        root: A folder every worker of the run sees, empty at its start.
    """

    def __init__(self, root):
        self.root = str(root)
        os.makedirs(self.root, exist_ok=True)

    def _made_once(self, name, make):
        """`make(path)` into `<root>/<name>`, once per run for all workers."""
        path = os.path.join(self.root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with filelock.FileLock(path + ".lock"):
            if not os.path.exists(path):
                staging = tempfile.mkdtemp(dir=self.root, prefix=".tmp-")
                try:
                    make(os.path.join(staging, "made"))
                    os.replace(os.path.join(staging, "made"), path)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
        return path

    def preset(self, family, multimodal=False, images=None, chat=False):
        """The tiny random-weight preset `build_tiny_preset` makes.

        Args:
            family: A key of `TINY_FAMILIES`.
            multimodal: With a tiny media encoder (`MULTIMODAL`).
            images: With a served image encoder's options (`IMAGES`).
            chat: With the tokenizer's tool-calling and thinking tokens.
        """
        from vllm_keras_hub.testing.presets import build_tiny_preset

        name = family
        if multimodal:
            name += "-multimodal"
        if images is not None:
            name += "-images-" + "-".join(f"{k}={v}" for k, v in sorted(images.items()))
        if chat:
            name += "-chat"
        return self._made_once(
            f"presets/{name}",
            lambda path: build_tiny_preset(
                family, path, multimodal=multimodal, images=images, chat=chat
            ),
        )

    def gemma4_assistant(self):
        """A tiny Gemma4 assistant of the tiny Gemma4 preset (`mtp.py`)."""
        from vllm_keras_hub.testing.mtp import build_tiny_assistant

        target = self.preset("gemma4")
        return self._made_once(
            "presets/gemma4-assistant", lambda path: build_tiny_assistant(target, path)
        )

    def embedder(self, name):
        """The tiny text embedder preset `name` (`testing/embedders.py`)."""
        from vllm_keras_hub.testing.embedders import build_tiny_embedder

        return self._made_once(
            f"presets/embedder-{name}", lambda path: build_tiny_embedder(name, path)
        )

    def vision_preset(self, family="gemma3", bidirectional=False):
        """The tiny preset with a served vision encoder and image converter
        (Gemma3n's, and causal Gemma4's, with an audio encoder and converter
        too, and Gemma4's with a video converter, as published)."""
        from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

        audio = family == "gemma3n" or (family == "gemma4" and not bidirectional)
        # Gemma4 with audio: seed 2's random weights tell the tests' images
        # apart.
        seed = 2 if family == "gemma4" and audio else 0
        name = f"presets/{family}-vision" + ("-bidirectional" if bidirectional else "")
        name += "-audio" if audio else ""
        video = family == "gemma4"
        name += "-video" if video else ""
        return self._made_once(
            name,
            lambda path: build_tiny_vision_preset(
                path,
                family=family,
                seed=seed,
                bidirectional=bidirectional,
                audio=audio,
                video=video,
            ),
        )

    def oracle(self, preset, prompts, max_new_tokens, full_forward=False):
        """The oracle's `(prompt_ids, generated_ids)` for each of `prompts`.

        Args:
            preset: A preset folder.
            prompts: Prompt strings.
            max_new_tokens: Tokens per prompt.
            full_forward: The full-sequence forward's greedy tokens instead
                of `generate()`'s (families whose `generate()` is buggy).
        """
        from vllm_keras_hub.testing import oracle

        key = json.dumps([preset, prompts, max_new_tokens, full_forward])
        name = hashlib.sha256(key.encode()).hexdigest()[:32]
        compute = (
            oracle.keras_hub_greedy_full_forward if full_forward else oracle.keras_hub_greedy
        )

        def make(path):
            result = compute(preset, prompts, max_new_tokens)
            with open(path, "w") as f:
                json.dump(result, f)

        with open(self._made_once(f"oracles/{name}.json", make)) as f:
            return [tuple(pair) for pair in json.load(f)]
