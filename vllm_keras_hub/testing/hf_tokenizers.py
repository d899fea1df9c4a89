"""Tiny Hugging Face checkpoint folders, tokenizer files and config only.

Each folder holds what a published checkpoint of its family ships for its
tokenizer: a `tokenizer.json`, built offline by transformers' own tokenizer
class for the family (or by `tokenizers` with the published pipeline, where
transformers has no class for it), its `tokenizer_config.json`, and the
files keras-hub's converter reads instead (`vocab.txt`, `tokenizer.model`,
`sentencepiece.bpe.model`, `vocab.json` and `merges.txt`); and a tiny
`config.json` of the family. No weights: enough for `write_model_folder`,
which reads no weights.
"""

import functools
import io
import json
import os

from vllm_keras_hub.testing import tokenizers as tiny
from vllm_keras_hub.testing.hf_models import _KERAS_HUB_KEYS

# Non-ASCII text that keras-hub's converted tokenizers and the checkpoints'
# own can split apart: accents, CJK, emoji, math symbols, whitespace runs.
NON_ASCII_TEXTS = (
    "café crème brûlée",
    "Ångström NAÏVE façade",
    "x² + y² ≤ z² and ∑ aᵢ ≥ ½",
    "日本語のテキストと中文文本",
    "😀🎉👍🏽 🇺🇸 ok",
    "multiple   spaces\t\ttabs\n\n  newlines  ",
    "Привет, мир! مرحبا",
    "\u00a0non-breaking\u3000ideographic ﬁ Ⅳ",
)

# Llama 3's and GPT-OSS's split patterns, as their `tokenizer.json` has them.
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_O200K_PATTERN = "|".join(
    (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    )
)


_TINY = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
_ENCODER = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4)
_MOE = dict(moe_intermediate_size=64, num_experts_per_tok=2)
_GEMMA3N_TEXT = dict(
    _TINY,
    head_dim=32,
    num_kv_shared_layers=0,
    hidden_size_per_layer_input=16,
    laurel_rank=8,
    altup_num_inputs=2,
    layer_types=["sliding_attention", "full_attention"],
    activation_sparsity_pattern=[0.0, 0.0],
    # keras-hub 0.32's converter reads these; transformers 5 writes
    # `rope_parameters`.
    rope_theta=10000.0,
    rope_local_base_freq=10000.0,
)

# family -> (transformers config class, config values, tokenizer kind).
# The config is saved as transformers writes it, with the keys keras-hub
# 0.32's converter reads where transformers 5 writes others. Gemma4's and
# Qwen3.5's values are written over the saved config; their shapes are
# `hf_gemma4.TARGET` and `hf_models.TINY_CONFIGS`'.
CHECKPOINTS = {
    "bert": ("BertConfig", _ENCODER, "wordpiece"),
    "xlm_roberta": ("XLMRobertaConfig", _ENCODER, "xlm_roberta"),
    "gpt2": ("GPT2Config", dict(n_embd=128, n_layer=2, n_head=4), "gpt2"),
    "llama3": ("LlamaConfig", _TINY, "llama3"),
    # Llama 2's layout: keras-hub converts every `llama` checkpoint as Llama 3.
    "llama": ("LlamaConfig", _TINY, "llama"),
    "smollm3": ("SmolLM3Config", _TINY, "smollm3"),
    "qwen": ("Qwen2Config", _TINY, "qwen"),
    "qwen3": ("Qwen3Config", dict(_TINY, head_dim=32), "qwen"),
    "qwen_moe": (
        "Qwen2MoeConfig",
        dict(_TINY, **_MOE, num_experts=4, shared_expert_intermediate_size=128),
        "qwen",
    ),
    "qwen3_moe": ("Qwen3MoeConfig", dict(_TINY, **_MOE, num_experts=4, head_dim=32), "qwen"),
    # Written as the multimodal checkpoints are (see `hf_models.py`).
    "qwen3_5": ("Qwen3_5TextConfig", dict(model_type="qwen3_5"), "qwen3_5"),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", dict(model_type="qwen3_5_moe"), "qwen3_5"),
    "gpt_oss": (
        "GptOssConfig",
        dict(_TINY, head_dim=32, num_local_experts=4, num_experts_per_tok=2),
        "gpt_oss",
    ),
    "gemma": ("GemmaConfig", dict(_TINY, head_dim=32), "gemma"),
    "gemma2": ("Gemma2Config", dict(_TINY, head_dim=32), "gemma"),
    "gemma3": ("Gemma3TextConfig", dict(_TINY, head_dim=32), "gemma3"),
    "gemma3n": ("Gemma3nConfig", dict(text_config=_GEMMA3N_TEXT), "gemma3n"),
    # keras-hub 0.32 reads a global head size that transformers 5 writes
    # per layer (see `hf_gemma4.py`).
    "gemma4": ("Gemma4TextConfig", dict(global_head_dim=128), "gemma4"),
    "mistral": ("MistralConfig", _TINY, "llama"),
    "mixtral": (
        "MixtralConfig",
        dict(_TINY, num_local_experts=4, num_experts_per_tok=2),
        "llama",
    ),
}


def _write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)


@functools.lru_cache(maxsize=None)
def unigram_proto(vocab_size=400):
    """A tiny unigram SentencePiece model normalized as XLM-RoBERTa's is.

    `nmt_nfkc` (a precompiled character map), extra whitespace removed, the
    XLM-RoBERTa piece layout (`<unk>`, `<s>`, `</s>` first).
    """
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(tiny._TRAINING_TEXT + NON_ASCII_TEXTS),
        model_writer=model,
        model_type="unigram",
        vocab_size=vocab_size,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def _from_sentencepiece(folder, file_name, proto, tokenizer_class, **config):
    """transformers' own conversion of a SentencePiece model, saved."""
    import transformers

    with open(os.path.join(folder, file_name), "wb") as f:
        f.write(proto)
    _write_json(
        os.path.join(folder, "tokenizer_config.json"),
        {"tokenizer_class": tokenizer_class, **config},
    )
    transformers.AutoTokenizer.from_pretrained(folder).save_pretrained(folder)


def _byte_level(folder, special_tokens, pattern, start_token=None, end_token=None):
    """A byte-level BPE `tokenizer.json` built as the published ones are."""
    from tokenizers import AddedToken
    from tokenizers import Regex
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import processors

    vocabulary, merges = tiny.tiny_bpe_vocabulary_and_merges(special_tokens)
    backend = Tokenizer(
        models.BPE(vocabulary, [tuple(m.split(" ")) for m in merges], ignore_merges=True)
    )
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True) for t in special_tokens])
    steps = [processors.ByteLevel(trim_offsets=False)]
    if start_token:
        steps.append(
            processors.TemplateProcessing(
                single=f"{start_token} $A",
                pair=f"{start_token} $A {start_token} $B",
                special_tokens=[(start_token, vocabulary[start_token])],
            )
        )
    backend.post_processor = processors.Sequence(steps)
    backend.save(os.path.join(folder, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": start_token,
        "eos_token": end_token,
    }
    _write_json(os.path.join(folder, "tokenizer_config.json"), config)


_GEMMA_SYMBOLS = {
    "gemma": tiny._GEMMA3_SYMBOLS[:2],
    "gemma3": tiny._GEMMA3_SYMBOLS,
    "gemma3n": tiny._GEMMA3N_SYMBOLS,
    "gemma4": tiny._GEMMA4_SYMBOLS,
}


def _save_tokenizer(kind, folder):
    import transformers

    if kind == "wordpiece":
        from vllm_keras_hub.testing.embedders import _WORDPIECE_VOCABULARY
        from vllm_keras_hub.testing.embedders import BERT_EXTRA_PIECES

        tokens = list(_WORDPIECE_VOCABULARY) + list(BERT_EXTRA_PIECES)
        # As sentence-transformers' all-MiniLM checkpoints: lowercased, and
        # so (strip_accents unset) accents stripped.
        transformers.BertTokenizer(
            vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=True
        ).save_pretrained(folder)
        with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(tokens) + "\n")
    elif kind == "xlm_roberta":
        _from_sentencepiece(
            folder, "sentencepiece.bpe.model", unigram_proto(), "XLMRobertaTokenizer"
        )
    elif kind == "gpt2":
        vocabulary, merges = tiny.tiny_bpe_vocabulary_and_merges(("<|endoftext|>",))
        pairs = [tuple(m.split(" ")) for m in merges]
        transformers.GPT2Tokenizer(vocab=vocabulary, merges=pairs).save_pretrained(folder)
        _write_json(os.path.join(folder, "vocab.json"), vocabulary)
        with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    elif kind in ("llama3", "smollm3"):
        special = tiny._BPE_SPECIAL_TOKENS[kind]
        start = "<|begin_of_text|>" if kind == "llama3" else None
        end = "<|end_of_text|>" if kind == "llama3" else "<|im_end|>"
        _byte_level(folder, special, _LLAMA3_PATTERN, start, end)
    elif kind == "gpt_oss":
        special = ("<|endoftext|>", "<|return|>")
        _byte_level(folder, special, _O200K_PATTERN, end_token="<|return|>")
    elif kind in ("qwen", "qwen3_5"):
        special = tiny._BPE_SPECIAL_TOKENS["qwen3"]
        if kind == "qwen3_5":  # Its checkpoints are multimodal.
            special += tiny.QWEN3_5_VISION_TOKENS
        vocabulary, merges = tiny.tiny_bpe_vocabulary_and_merges(special)
        transformers.Qwen2Tokenizer(
            vocab=vocabulary,
            merges=[tuple(m.split(" ")) for m in merges],
            eos_token="<|im_end|>",
        ).save_pretrained(folder)
    elif kind in _GEMMA_SYMBOLS:
        symbols = _GEMMA_SYMBOLS[kind]
        proto = tiny.tiny_sentencepiece_proto(layout="gemma", user_defined_symbols=symbols)
        _from_sentencepiece(
            folder, "tokenizer.model", proto, "GemmaTokenizer", add_bos_token=True
        )
    elif kind == "llama":
        proto = tiny.tiny_sentencepiece_proto(layout="llama")
        _from_sentencepiece(
            folder, "tokenizer.model", proto, "LlamaTokenizer", add_bos_token=True
        )
    else:
        raise ValueError(f"Unknown tokenizer kind {kind!r}.")


def save_checkpoint(family, folder):
    """Saves the tiny tokenizer files and config of `family` into `folder`.

    Args:
        family: A key of `CHECKPOINTS`.
        folder: Where to save; created if missing.

    Returns:
        `folder`.
    """
    import tokenizers
    import transformers

    from vllm_keras_hub.testing.hf_gemma4 import TARGET
    from vllm_keras_hub.testing.hf_models import TINY_CONFIGS

    config_class, written, kind = CHECKPOINTS[family]
    os.makedirs(folder, exist_ok=True)
    _save_tokenizer(kind, folder)
    backend = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    size = backend.get_vocab_size(with_added_tokens=True)
    values = {"vocab_size": size}
    if family == "gemma4":
        values.update(TARGET, vocab_size_per_layer_input=size)
    elif family.startswith("qwen3_5"):
        values.update(TINY_CONFIGS["qwen3_5"][2])
        if family == "qwen3_5_moe":
            values.update(_MOE, num_experts=4, shared_expert_intermediate_size=128)
    elif family == "gemma3n":
        text = dict(written["text_config"], vocab_size=size, vocab_size_per_layer_input=size)
        values = {"text_config": text}
    else:
        values.update(written)
    config = getattr(transformers, config_class)(**values)
    config.save_pretrained(folder)
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        saved = json.load(f)
    if family == "gemma3n":
        saved["text_config"].update(written["text_config"])
    elif family in ("gemma4", "qwen3_5", "qwen3_5_moe"):
        saved.update(written)
    saved.update(_KERAS_HUB_KEYS.get(family, lambda config: {})(saved))
    _write_json(path, saved)
    if family in ("bert", "xlm_roberta"):
        from vllm_keras_hub.testing.hf_embedders import _sentence_transformers_files

        _sentence_transformers_files(folder, saved["hidden_size"], "pooling_mode_mean_tokens")
    return folder
