"""The suite's tiers: what every landing proves, and what it proves in turn.

Every landing's CI (`.ci/run`, which calls `scripts/test`) runs the default
tier and one slice of the extended tier: slice `commits % 4 + 1`, where
`commits` is `git rev-list --count HEAD` of the landing. A landing that
moves the count on by one slice (`scripts/test --slices` shows where it
stands) runs the next slice, so each claim the extended tier proves is
proven at least once every four landings. A cold landing must stay within
45 minutes on 2 cores: the default tier and its heaviest slice together
(`tests/tiers_test.py` checks them against a recorded run).

Patterns are node ids, `*` any text. A test in no slice is in the default
tier.
"""

import fnmatch
import re

SLICE_COUNT = 4

_P = "tests/parallel_test.py::"
_TP = _P + "test_tensor_parallel_greedy_parity"
_PP = _P + "test_pipeline_parallel_greedy_parity"
_PARITY = "tests/model_test.py::test_greedy_parity"

SLICES = {
    # Servers in other processes: plain vLLM, two disaggregated servers, the
    # servers of the media families beyond Gemma3n's; tensor parallelism for
    # eight families, greedy parity for ten and six of vLLM native's
    # cross-checks; GPT-OSS's tools; further draft, adapter, preemption and
    # disaggregation cases.
    1: (
        "vllm_keras_hub/entrypoints/cli_test.py::test_exported_vision_folder_serves_images_with_plain_vllm",
        "vllm_keras_hub/entrypoints/cli_test.py::test_unsupported_parallelism_exits_before_the_engine_starts[qwen3*",
        "tests/plugin_test.py::test_plain_vllm_serves_a_hugging_face_model[jax]",
        "tests/disaggregation_test.py::test_two_servers_and_the_route_between_them",
        "tests/disaggregation_test.py::test_a_consumer_decodes_from_the_producers_kv[gemma4]",
        "tests/vision_server_test.py::*[gemma3]",
        "tests/vision_server_test.py::*[gemma4]",
        "tests/vision_server_test.py::*[qwen3_5]",
        "tests/pali_gemma_server_test.py::*",
        "tests/speculative_test.py::test_serve_with_a_keras_hub_draft",
        "tests/speculative_test.py::test_a_draft_with_sliding_and_full_layers",
        "tests/chat_tools_server_test.py::*[llama3_1*",
        "vllm_keras_hub/lora/merged_test.py::test_serve_merges_the_adapter_and_answers_the_openai_client",
        "vllm_keras_hub/lora/merged_test.py::test_preset_saved_after_lora_fine_tuning_serves_compiled",
        *(f"{_TP}[{f}]" for f in ("mistral", "falcon", "mixtral", "qwen3",
                                  "qwen_moe", "gemma", "phi3", "gemma4")),
        *(f"{_PARITY}[{f}]" for f in ("mistral", "bloom", "gemma", "phi3", "llama", "gemma2",
                                      "qwen3", "gemma3n", "qwen_moe")),
        *(f"tests/native_families_test.py::test_same_greedy_tokens_as_vllm_native[{f}]"
          for f in ("qwen", "gpt2", "mistral", "gemma", "gemma3", "llama3")),
        "tests/speculative_native_test.py::test_an_eagle3_head_on_gemma3",
        "tests/speculative_native_test.py::test_a_head_reading_an_intermediate_layer_drafts_as_vllm_native[embeddings]",
        "tests/mtp_test.py::test_an_image_target_with_its_assistant_gives_generates_tokens",
        "tests/vision_qwen3_5_test.py::test_other_positions_would_be_wrong[*]",
        "tests/vision_pali_gemma_test.py::test_pali_gemma_2_prefixes_past_the_sliding_window",
        "tests/disaggregation_test.py::test_images_clips_and_videos_are_encoded_on_the_prefill_side_only",
        "tests/speculative_native_test.py::test_vllm_native_llama_with_the_same_head_accepts_the_same",
        "tests/preemption_test.py::*[mistral]",
        "tests/embeddings_native_test.py::test_max_seq_length_limits_texts_as_in_vllm_native",
        "vllm_keras_hub/lora/merged_test.py::test_adapter_merged_at_load_serves_keras_hubs_lora_tokens",
        "vllm_keras_hub/lora/adapters_test.py::test_serve_picks_the_adapter_by_the_openai_model_field",
        "tests/chat_tools_server_test.py::*[gpt_oss*",
        f"{_PARITY}[gemma4]",
    ),
    # Tensor parallelism for the other families, and with images, adapters,
    # PaliGemma and the assistant; vLLM native's MoE, Qwen3.5 and embedding
    # cross-checks; Gemma 4's tools; our names beside keras-hub's.
    2: (
        # The new tasks' second servers and native cross-checks (their parity
        # with the preset's own runs every landing).
        "vllm_keras_hub/models/prompt_embeds_test.py::test_other_embeddings_equal_vllm_natives_llama",
        "vllm_keras_hub/models/prompt_embeds_test.py::test_prompt_embeds_through_the_server",
        "vllm_keras_hub/tasks/text_classifier/cross_encoder_test.py::test_score_and_rerank_through_the_server",
        "vllm_keras_hub/tasks/text_classifier/text_classifier_test.py::test_served_classes_equal_vllm_natives[roberta]",
        "vllm_keras_hub/tasks/seq_2_seq_lm/seq_2_seq_lm_test.py::test_an_exported_folder_serves_with_plain_vllm",
        *(f"{_TP}[{f}]" for f in ("gpt2", "smollm3", "gemma3n", "gpt_oss", "phi3_su", "gemma3",
                                  "qwen", "opt", "gpt_neox", "qwen3_5", "qwen3_5_moe", "llama",
                                  "bloom", "gemma2", "gemma4_moe", "qwen3_moe", "llama3")),
        _P + "test_tensor_parallel_images_match_generate[gemma4]",
        _P + "test_tensor_parallel_images_match_generate[gemma3n]",
        _P + "test_adapters_per_request_at_two_ranks",
        _P + "test_pali_gemma_at_two_ranks_matches_generate",
        _P + "test_qwen3_5_images_in_each_layout[tensor]",
        "tests/mtp_test.py::test_the_assistant_at_two_ranks_drafts_as_its_preset",
        "tests/native_families_test.py::test_moe_families_*",
        "tests/native_families_test.py::test_qwen3_5_*",
        "tests/embeddings_native_test.py::*[bert]",
        "tests/embeddings_native_test.py::*[qwen3]",
        "tests/features_test.py::test_ngram_speculative_decoding",
        "tests/chat_tools_server_test.py::*[qwen2_5*",
        "tests/model_test.py::test_multimodal_presets_serve_text_as_generate[gemma3n]",
        "tests/model_test.py::test_multimodal_presets_serve_text_as_generate[gemma4]",
        "tests/model_test.py::test_multimodal_presets_serve_text_as_generate[qwen3_5]",
        *(f"{_PARITY}[{f}]" for f in ("opt", "gpt2", "mixtral", "qwen", "phi3_su", "falcon",
                                      "gpt_neox", "qwen3_5", "gpt_oss")),
        "tests/plugin_test.py::test_our_names_coexist_with_keras_hubs_own_plugin",
        "tests/mtp_test.py::*[eager]",
        "tests/chat_tools_server_test.py::*[gemma4*",
    ),
    # Pipeline parallelism for every family that can be cut, and with
    # images and adapters; further Gemma4, embedding, draft and adapter
    # cases; vLLM native Llama's logprobs; an exported folder under plain
    # vLLM.
    3: (
        *(f"{_PP}[{f}-False]" for f in ("gemma3", "gpt2", "gpt_neox", "smollm3", "qwen",
                                        "gemma2", "bloom", "gpt_oss", "qwen3_moe", "falcon",
                                        "gemma", "llama", "mistral", "mixtral", "opt", "phi3",
                                        "phi3_su", "qwen3", "qwen_moe")),
        f"{_PP}[gemma3-True]",
        _P + "test_pipeline_parallel_images_match_generate[gemma4]",
        _P + "test_adapters_per_request_at_two_stages",
        _P + "test_qwen3_5_images_in_each_layout[pipeline]",
        _P + "test_bidirectional_gemma4_images_in_each_layout[pipeline]",
        "tests/speculative_native_test.py::test_an_eagle3_head_compiled_and_chunked",
        "tests/mtp_test.py::*[compiled]",
        "tests/vision_gemma4_bidirectional_test.py::test_video_frames_attend_within_themselves_as_the_full_forward",
        "tests/vision_gemma4_bidirectional_test.py::test_the_same_image_again_is_served_from_the_prefix_cache",
        "tests/vision_gemma4_bidirectional_test.py::test_clips_stay_causal_beside_bidirectional_images",
        "vllm_keras_hub/lora/adapters_test.py::test_gemma4_serves_attention_adapters_and_refuses_its_mlps",
        "vllm_keras_hub/lora/adapters_test.py::test_a_changed_converter_converts_again",
        "vllm_keras_hub/smollm2_test.py::test_hf_export_matches_keras_hub",
        "tests/chat_tools_server_test.py::*[qwen3_5*",
        "tests/vision_gemma4_bidirectional_test.py::test_images_in_a_batch_match_the_full_forward",
        "tests/vision_gemma4_bidirectional_test.py::test_generate_attends_causally_over_images",
        "tests/vision_gemma4_bidirectional_test.py::test_prompt_logprobs_over_an_image_match_the_full_forward",
        "tests/embeddings_native_test.py::*[embedding_gemma]",
        "vllm_keras_hub/lora/adapters_test.py::test_an_moe_family_gives_each_row_its_adapter",
        "tests/speculative_test.py::test_the_target_drafting_for_itself_compiled_and_chunked",
        *(f"{_PARITY}[{f}]" for f in ("gemma4_moe", "qwen3_5_moe", "smollm3")),
        "tests/native_parity_test.py::*",
        "vllm_keras_hub/entrypoints/cli_test.py::test_exported_folder_serves_with_plain_vllm",
    ),
    # Servers under load, faults and shutdown, a saved compile restarted;
    # two nodes; data parallelism; tensor and pipeline parallelism together,
    # with KV sharing and state across stages; media presets and drafts at
    # two ranks; vLLM native's logprobs; Gemma4's preemption; an exported
    # Moonshine folder transcribing under plain vLLM; T5Gemma.
    4: (
        "tests/reliability_test.py::*",
        "vllm_keras_hub/vllm_fixes/saved_compile_test.py::*",
        _P + "test_two_nodes_on_loopback_give_generates_tokens[*]",
        _P + "test_data_parallel_across_two_nodes_gives_generates_tokens",
        "tests/features_test.py::test_data_parallel_matches_one_engine",
        _P + "test_tensor_and_pipeline_parallel_together[*]",
        _P + "test_gemma4_pipeline_keeps_kv_sharing_layers_with_their_sources[*]",
        _P + "test_hybrid_pipeline_keeps_each_stages_state_on_its_rank[*]",
        _P + "test_a_multimodal_preset_serves_text_at_two_ranks[*]",
        _P + "test_an_eagle3_head_and_a_draft_model_at_two_ranks",
        _P + "test_bidirectional_gemma4_images_in_each_layout[tensor]",
        "tests/features_test.py::test_logprobs_match_vllm_native",
        "tests/preemption_test.py::*[gemma4]",
        "vllm_keras_hub/tasks/audio_to_text/audio_to_text_test.py::test_an_exported_folder_transcribes_with_plain_vllm",
        "vllm_keras_hub/families/t5gemma/t5gemma_test.py::*",
    ),
}


def _matches(nodeid, pattern):
    return fnmatch.fnmatchcase(nodeid, pattern.replace("[", "[[]"))


def slice_of(nodeid):
    """The extended slice (1 to 4) of the test `nodeid`, or None for the
    default tier."""
    for number, patterns in SLICES.items():
        if any(_matches(nodeid, pattern) for pattern in patterns):
            return number
    return None


def tier_name(nodeid):
    """How docs name the tier of `nodeid`: "every landing" or "slice N"."""
    number = slice_of(nodeid)
    return "every landing" if number is None else f"slice {number}"


def collect_nodeids(root):
    """Every test id of the suite at `root`, both tiers, by a collection of
    its own."""
    import subprocess
    import sys

    listing = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "", "-p", "no:cacheprovider"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout
    return [line for line in listing.splitlines() if "::" in line]


def landing_slice(commits):
    """The extended slice a landing with `commits` commits runs."""
    return commits % SLICE_COUNT + 1


def matching(pattern, nodeids):
    """The node ids of `nodeids` that `pattern` names. A pattern may leave
    out the leading folder (`parallel_test.py::...`), as docs do."""
    if "/" not in pattern.split("::")[0]:
        pattern = "*/" + pattern
    return [nodeid for nodeid in nodeids if _matches(nodeid, pattern)]


# How docs name a test and its tier: `tests/x_test.py::test_y[z]` (the
# folder may be left out, `*` is any text), then `(every landing)` or
# `(slice N)`, in italics or not.
NODE = re.compile(r"`((?:[\w.]+/)*\w+_test\.py)::([^`\s]+)`")
TAG = re.compile(r"\s*\*?\((every landing|slice [1-4])\)\*?")


def references(text):
    """`(pattern, tag or None, start, end)` for each test `text` names;
    `end` is past its tag."""
    named = []
    for match in NODE.finditer(text):
        tag = TAG.match(text, match.end())
        pattern = f"{match.group(1)}::{match.group(2)}"
        end = tag.end() if tag else match.end()
        named.append((pattern, tag.group(1) if tag else None, match.start(), end))
    return named


def retag(text, nodeids):
    """`text` with each named test's tag set to the tier it runs in, and the
    patterns whose tests are in no tier or several, for a person to split."""
    unclear = []
    for pattern, _, start, end in reversed(references(text)):
        named = matching(pattern, nodeids)
        names = {tier_name(nodeid) for nodeid in named}
        if len(names) != 1:
            unclear.append(pattern)
            continue
        reference = text[start:text.index("`", start + 1) + 1]
        text = f"{text[:start]}{reference} *({names.pop()})*{text[end:]}"
    return text, unclear


if __name__ == "__main__":
    # Sets every docs page's tags to the tiers now: python -m vllm_keras_hub.testing.tiers
    import glob

    nodeids = collect_nodeids(".")
    for page in ["README.md", *sorted(glob.glob("docs/*.md"))]:
        with open(page) as f:
            text, unclear = retag(f.read(), nodeids)
        with open(page, "w") as f:
            f.write(text)
        for pattern in unclear:
            print(f"{page}: {pattern} names tests in no tier or in several; split it")
