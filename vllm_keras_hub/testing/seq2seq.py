"""A tiny random-weight `BartSeq2SeqLM` preset, and its own greedy tokens.

Saved with `save_to_preset` (backbone, preprocessor, tokenizer), as
KerasHub's published BART presets are laid out. BART's small initializer
makes a random decoder repeat one token whatever the text; its weights are
drawn wider (positions wider still), so that each text's tokens differ and
change along the output.
"""

import os

import numpy as np

from vllm_keras_hub.testing.tokenizers import tiny_bpe_vocabulary_and_merges

# The encoder's and decoder's learned positions, as published BART presets
# have them: the preprocessor packs to this length (its config does not
# record one).
MAX_SEQUENCE_LENGTH = 1024
# The decoder length the oracle packs: its prompts and generated tokens.
_DECODER_LENGTH = 64


def build_tiny_bart(directory, seed=0):
    """Saves a 2-layer BART (64 wide, heads of 32) into `directory`."""
    import keras
    import keras_hub

    vocabulary, merges = tiny_bpe_vocabulary_and_merges(
        special_tokens=("<s>", "<pad>", "</s>", "<unk>")
    )
    tokenizer = keras_hub.models.BartTokenizer(vocabulary=vocabulary, merges=merges)
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.BartBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=2,
        num_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
        max_sequence_length=MAX_SEQUENCE_LENGTH,
    )
    rng = np.random.default_rng(seed)
    for variable in backbone.weights:
        if variable.path.endswith(("gamma", "beta")):
            continue
        scale = 1.0 if "position" in variable.path else 0.15
        variable.assign(rng.normal(0, scale, variable.shape).astype("float32"))
    preprocessor = keras_hub.models.BartSeq2SeqLMPreprocessor(tokenizer=tokenizer)
    seq2seq = keras_hub.models.BartSeq2SeqLM(backbone=backbone, preprocessor=preprocessor)
    os.makedirs(directory, exist_ok=True)
    seq2seq.save_to_preset(directory)
    return directory


def keras_hub_greedy(preset, texts, max_new_tokens, decoder_texts=None):
    """The preset's own greedy tokens for each encoder text, after its decoder prompt.

    `generate()`'s own postprocessing needs TensorFlow (keras-hub's
    `strip_to_ragged`), so this runs the steps before it: the
    preprocessor's `generate_preprocess` and the task's `generate_step`,
    greedy, stopping at the end token.

    Returns:
        `(prompts, outputs)`: each packed decoder prompt, and the tokens
        generated after it, the end token included where reached.
    """
    import keras_hub

    seq2seq = keras_hub.models.Seq2SeqLM.from_preset(preset)
    seq2seq.compile(sampler="greedy")
    preprocessor = seq2seq.preprocessor
    end = preprocessor.tokenizer.end_token_id
    decoder_texts = decoder_texts or [""] * len(texts)
    prompts, outputs = [], []
    for text, decoder_text in zip(texts, decoder_texts, strict=True):
        inputs = preprocessor.generate_preprocess(
            {"encoder_text": [text], "decoder_text": [decoder_text]},
            decoder_sequence_length=_DECODER_LENGTH,
        )
        prompt_length = int(np.asarray(inputs["decoder_padding_mask"]).sum())
        tokens = np.asarray(seq2seq.generate_step(inputs, stop_token_ids=[end])["decoder_token_ids"])[0]
        prompt = tokens[:prompt_length].tolist()
        generated = tokens[prompt_length : prompt_length + max_new_tokens].tolist()
        if end in generated:
            generated = generated[: generated.index(end) + 1]
        prompts.append(prompt)
        outputs.append(generated)
    return prompts, outputs
