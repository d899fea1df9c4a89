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


def build_tiny_t5gemma(directory, seed=0):
    """Saves a 2 + 2 layer T5Gemma (64 wide, two query heads of 32 on one
    key/value head) into `directory`: each stack a sliding layer (a window
    of 4) then a full one, with attention and final soft caps, as Gemma 2's.
    Its weights are drawn wider, and its output embedding untied: a tied,
    random one predicts the token just read, which a rotary-only decoder
    then repeats."""
    import keras
    import keras_hub

    from vllm_keras_hub.testing.tokenizers import tiny_sentencepiece_proto

    tokenizer = keras_hub.models.T5GemmaTokenizer(proto=tiny_sentencepiece_proto())
    keras.utils.set_random_seed(seed)
    kinds = ["sliding_attention", "full_attention"]
    stack = dict(hidden_dim=64, intermediate_dim=128, num_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, layer_types=kinds)  # fmt: skip
    backbone = keras_hub.models.T5GemmaBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        **{f"{side}_{key}": value for side in ("encoder", "decoder") for key, value in stack.items()},
        query_pre_attn_scalar=32,
        sliding_window=4,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        tie_word_embeddings=False,
        dtype="float32",
    )
    rng = np.random.default_rng(seed)
    for variable in backbone.weights:
        if "norm" in variable.path:
            continue
        scale = 0.05 if "embedding" in variable.path else 0.3
        variable.assign(rng.normal(0, scale, variable.shape).astype("float32"))
    preprocessor = keras_hub.models.T5GemmaSeq2SeqLMPreprocessor(
        tokenizer=tokenizer, encoder_sequence_length=128, decoder_sequence_length=128
    )
    seq2seq = keras_hub.models.T5GemmaSeq2SeqLM(backbone=backbone, preprocessor=preprocessor)
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


def save_hf_bart(folder, seed=0, **shape):
    """A tiny random-weight transformers `BartForConditionalGeneration`
    folder, on the tiny BPE vocabulary, drawn as wide as `build_tiny_bart`.

    Args:
        folder: Where to save it.
        seed: Weight initialisation seed.
        **shape: `BartConfig` fields over the tiny ones (`d_model`, ...).

    Returns:
        The transformers model, in eval mode.
    """
    import json

    import torch
    import transformers

    # `<mask>` too, as BART's vocabulary has it: transformers' tokenizer adds it.
    vocabulary, merges = tiny_bpe_vocabulary_and_merges(
        special_tokens=("<s>", "<pad>", "</s>", "<unk>", "<mask>")
    )
    start, pad, end = (vocabulary[token] for token in ("<s>", "<pad>", "</s>"))
    tiny = dict(
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
    )
    config = transformers.BartConfig(
        vocab_size=len(vocabulary),
        max_position_embeddings=MAX_SEQUENCE_LENGTH,
        activation_function="gelu",
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        init_std=0.15,
        bos_token_id=start,
        pad_token_id=pad,
        eos_token_id=end,
        decoder_start_token_id=end,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        **{**tiny, **shape},
    )
    torch.manual_seed(seed)
    model = transformers.BartForConditionalGeneration(config).eval()
    with torch.no_grad():
        for positions in (model.model.encoder.embed_positions, model.model.decoder.embed_positions):
            positions.weight.normal_(0, 1.0)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    # Published BART checkpoints' config.json names `num_hidden_layers`,
    # which keras-hub's converter reads; transformers 5 no longer writes it.
    config_file = os.path.join(folder, "config.json")
    with open(config_file) as f:
        fields = json.load(f)
    with open(config_file, "w") as f:
        json.dump({**fields, "num_hidden_layers": config.encoder_layers}, f, indent=2)
    vocab_file, merges_file = os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt")
    with open(vocab_file, "w") as f:
        json.dump(vocabulary, f)
    with open(merges_file, "w") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    transformers.BartTokenizer(vocab_file, merges_file).save_pretrained(folder)
    return model


def transformers_greedy(model, encoder_ids, decoder_prompt, max_new_tokens):
    """transformers' own greedy tokens after `decoder_prompt`, for each
    packed encoder text, stopping at the end token."""
    import torch

    outputs = []
    for ids in encoder_ids:
        with torch.no_grad():
            tokens = model.generate(
                input_ids=torch.tensor([ids]),
                decoder_input_ids=torch.tensor([decoder_prompt]),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                num_beams=1,
            )[0].tolist()
        outputs.append(tokens[len(decoder_prompt) :])
    return outputs
