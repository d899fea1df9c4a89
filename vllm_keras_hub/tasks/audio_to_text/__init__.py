"""KerasHub `AudioToText` presets (Moonshine) on vLLM's encoder-decoder runner.

Served as vLLM serves Whisper: `/v1/audio/transcriptions`, and
`LLM.generate` with a clip as the prompt's `audio`. `spec.py` writes the
model folder, `processor.py` turns each clip into the preset's encoder
input, and `model.py` serves the preset's own encoder and decoder layers,
the decoder's attention on vLLM's kernels, as `tasks/seq_2_seq_lm/` does.
"""

ARCHITECTURE = "KerasHubTorchForSpeechSeq2Seq"
MODEL_CLASS = "vllm_keras_hub.tasks.audio_to_text.model:KerasHubForSpeechSeq2Seq"
# The `config.json` key holding what the model class and processor read.
FIELD = "keras_hub_audio_to_text"
MODALITY = "audio"
