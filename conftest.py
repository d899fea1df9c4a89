import fnmatch
import json
import os
import time

import pytest

# Before anything imports keras: the served layers run on torch.
os.environ.setdefault("KERAS_BACKEND", "torch")


def _keep_absl_off_the_capture_file():
    """Points absl's log handler at the real stderr.

    absl's handler keeps the `sys.stderr` of its creation: under pytest,
    capture's file. vLLM's `dictConfig` (`vllm/logger.py`) closes every
    logging handler when an in-process engine configures logging, and absl's
    `PythonHandler.close()` closes its stream unless it is `sys.stderr` at
    that moment, which a `capsys` test has replaced. Capture's file closed,
    every later test of the worker then errors ("I/O operation on closed
    file"). Outside pytest the stream is `sys.stderr` and stays open.
    """
    import sys

    from absl import logging as absl_logging

    absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__


_keep_absl_off_the_capture_file()

# The suite's own cache roots, not the user's ~/.cache/vllm and
# ~/.cache/vllm-keras-hub: vLLM's compile and model-info caches, and the
# SmolLM2 preset. Kept between runs, as a user's are (vLLM keys its saved
# compiles by config and traced sources, so a changed file compiles again);
# tests about reuse make their own. Delete the folder for a cold run.
_CACHE_ROOT = os.environ.get("VLLM_KERAS_HUB_TEST_CACHE") or os.path.join(
    os.path.expanduser("~"), ".cache", "vllm-keras-hub-tests"
)
os.environ["VLLM_CACHE_ROOT"] = os.path.join(_CACHE_ROOT, "vllm")
os.environ["VLLM_KERAS_HUB_CACHE"] = os.path.join(_CACHE_ROOT, "vllm-keras-hub")

_ROOT = os.path.dirname(os.path.abspath(__file__))
# Per-test durations of the last runs (setup, call and teardown, seconds),
# which every run updates: they order the next run, longest work first.
# Beside them, the last run's wall time, machine and outcome.
DURATIONS = os.path.join(_ROOT, "reports", "test-durations.json")
LAST_RUN = os.path.join(_ROOT, "reports", "test-run.json")
# A test not timed yet counts as this long.
_UNTIMED_S = 10.0


@pytest.fixture(scope="session")
def shared(request, tmp_path_factory):
    """The run's tiny presets and oracles (`testing/shared.py`), made once
    for all modules and both pytest-xdist workers."""
    from vllm_keras_hub.testing.shared import Shared

    base = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):
        # A worker's base is a folder in the run's own.
        base = base.parent
    return Shared(base / "shared")


@pytest.fixture(scope="session")
def default_server():
    """`vllm-keras-hub serve` of the default model as users start it
    (compiled), with an API key: `(base_url, process)`.

    One server for `server_test.py` and `reliability_test.py`, which share
    an xdist work unit (`GROUPS`), so the compile is paid once.
    """
    from vllm_keras_hub.smollm2 import DEFAULT_MODEL_NAME
    from vllm_keras_hub.testing.server import DEFAULT_SERVER_API_KEY as api_key
    from vllm_keras_hub.testing.server import free_port
    from vllm_keras_hub.testing.server import running_server
    from vllm_keras_hub.testing.server import serve_command

    port = free_port()
    command = serve_command(
        "--port", str(port), "--max-model-len", "512", "--max-num-seqs", "16",
        "--api-key", api_key,
    )  # fmt: skip
    with running_server(
        command, port, model_name=DEFAULT_MODEL_NAME, api_key=api_key
    ) as (base_url, process):
        yield base_url, process


# xdist work units: the tests of one unit run on one worker, in order. A
# module is one unit, so its module-scoped engines start once, except:
# modules whose every test starts its own engine, each test a unit...
SPREAD_MODULES = (
    "tests/model_test.py",
    "tests/native_families_test.py",
    "tests/parallel_test.py",
)
# ... and modules that share one unit, for a session-scoped server.
GROUPS = {
    "tests/server_test.py": "default_server",
    "tests/reliability_test.py": "default_server",
}


# The extended tier: proofs `scripts/test` leaves out of the default run
# (and CI), which must stay within 45 minutes cold on 2 cores. Each is a
# further case of a proof the default run makes (another family, backend,
# layout or restart) or a load test; `scripts/test -m extended` runs them,
# `scripts/test -m ''` runs everything. Patterns are node ids, `*` any text.
EXTENDED = (
    # Load, faults and shutdown against a real server (10 min).
    "tests/reliability_test.py::*",
    # Tensor parallelism beyond Llama3 (compiled) and Gemma4 (KV sharing,
    # the MLP its block multiplies); pipeline beyond Llama3; 2 stages of 2
    # ranks. The other families shard the layers these do.
    *(
        f"tests/parallel_test.py::test_tensor_parallel_greedy_parity[{f}]"
        for f in (
            "gemma", "qwen3_moe", "mistral", "qwen3", "phi3", "falcon", "mixtral",
            "qwen_moe", "bloom", "gpt_oss", "smollm3", "gpt_neox", "gemma4_moe",
            "gemma2", "gpt2", "qwen", "llama", "phi3_su",
        )
    ),
    *(
        f"tests/parallel_test.py::test_pipeline_parallel_greedy_parity[{f}]"
        for f in ("gemma3-True", "gemma3-False", "gpt2-False", "gpt_neox-False", "smollm3-False")
    ),
    # Tensor parallelism for Gemma3n and Qwen3.5; images, adapters, Gemma4's
    # KV sharing, a Qwen3.5 pipeline's states, EAGLE-3 and draft models in
    # either layout; two nodes on loopback.
    "tests/parallel_test.py::test_tensor_parallel_greedy_parity[gemma3n]",
    "tests/parallel_test.py::test_tensor_parallel_greedy_parity[qwen3_5]",
    "tests/parallel_test.py::test_a_multimodal_preset_serves_text_at_two_ranks[*]",
    "tests/parallel_test.py::test_tensor_parallel_images_match_generate[*]",
    "tests/parallel_test.py::test_adapters_per_request_at_two_ranks",
    "tests/parallel_test.py::test_gemma4_pipeline_keeps_kv_sharing_layers_with_their_sources[*]",
    "tests/parallel_test.py::test_pipeline_parallel_images_match_generate[*]",
    "tests/parallel_test.py::test_qwen3_5_images_in_each_layout[*]",
    "tests/parallel_test.py::test_hybrid_pipeline_keeps_each_stages_state_on_its_rank[*]",
    "tests/parallel_test.py::test_an_eagle3_head_and_a_draft_model_at_two_ranks",
    "tests/parallel_test.py::test_adapters_per_request_at_two_stages",
    "tests/parallel_test.py::test_two_nodes_on_loopback_give_generates_tokens[*]",
    # Gemma3's text layers also shard in its images case, and OPT's layout
    # (Keras MultiHeadAttention) is GPT-2's.
    "tests/parallel_test.py::test_tensor_parallel_greedy_parity[gemma3]",
    "tests/parallel_test.py::test_tensor_parallel_greedy_parity[opt]",
    # Qwen3.5-MoE's Gated DeltaNet layers shard as Qwen3.5's, its experts
    # as Qwen3-MoE's; PaliGemma's decoder as Gemma's, its images as the
    # other vision presets' at 2 ranks; data parallelism across two nodes
    # launches as tensor parallelism across two does.
    "tests/parallel_test.py::test_tensor_parallel_greedy_parity[qwen3_5_moe]",
    "tests/parallel_test.py::test_pali_gemma_at_two_ranks_matches_generate",
    "tests/parallel_test.py::test_data_parallel_across_two_nodes_gives_generates_tokens",
    *(
        f"tests/parallel_test.py::test_pipeline_parallel_greedy_parity[{f}-False]"
        for f in ("qwen", "gemma2", "bloom", "gpt_oss", "qwen3_moe")
    ),
    # Pipeline parallelism for the families whose layers the cases above
    # already cut: every family's "2 stages" cell is an engine run.
    *(
        f"tests/parallel_test.py::test_pipeline_parallel_greedy_parity[{f}-False]"
        for f in (
            "falcon", "gemma", "llama", "mistral", "mixtral", "opt", "phi3",
            "phi3_su", "qwen3", "qwen_moe",
        )
    ),
    "tests/parallel_test.py::test_tensor_and_pipeline_parallel_together[*]",
    "tests/parallel_test.py::test_bidirectional_gemma4_images_in_each_layout[*]",
    # vLLM native cross-checks beyond five dense families and two embedders.
    "tests/native_families_test.py::test_moe_families_*",
    "tests/native_families_test.py::test_qwen3_5_*",
    "tests/native_families_test.py::test_same_greedy_tokens_as_vllm_native[qwen]",
    "tests/native_families_test.py::test_same_greedy_tokens_as_vllm_native[gpt2]",
    "tests/embeddings_native_test.py::*[bert]",
    # Qwen3.5-MoE's greedy parity (Qwen3.5's hybrid layers and Qwen3-MoE's
    # experts run by default), and Gemma3n's and Gemma4's text-only serving
    # (their image tests serve text-only prompts too).
    "tests/model_test.py::test_greedy_parity[qwen3_5_moe]",
    "tests/model_test.py::test_multimodal_presets_serve_text_as_generate[gemma3n]",
    "tests/model_test.py::test_multimodal_presets_serve_text_as_generate[gemma4]",
    # Logprobs against vLLM native through `LLM` (`native_parity_test.py`
    # compares them on SmolLM2), Qwen3's embeddings against native, the
    # Gemma4 assistant against native's `Gemma4MTP`, a compiled EAGLE-3 head
    # (Gemma3's eager one runs), a KerasHub draft and GPT-OSS's parsers
    # through a server, and Gemma3n's audio through a server.
    "tests/features_test.py::test_logprobs_match_vllm_native",
    "tests/embeddings_native_test.py::*[qwen3]",
    "tests/mtp_test.py::test_vllm_natives_gemma4_mtp_drafts_the_same_rows",
    "tests/speculative_native_test.py::test_an_eagle3_head_compiled_and_chunked",
    "tests/speculative_test.py::test_serve_with_a_keras_hub_draft",
    "tests/chat_tools_server_test.py::*[gpt_oss*",
    "tests/vision_server_test.py::*[gemma3n]",
    # Gemma4's adapters per request (Llama3's and Qwen3-MoE's run by default)
    # and the converter cache's invalidation.
    "vllm_keras_hub/lora/adapters_test.py::test_gemma4_serves_attention_adapters_and_refuses_its_mlps",
    "vllm_keras_hub/lora/adapters_test.py::test_a_changed_converter_converts_again",
    # Gemma4's bidirectional images beyond a mixed batch and prompt
    # logprobs: clips, video frames, and the prefix cache.
    "tests/vision_gemma4_bidirectional_test.py::test_video_frames_attend_within_themselves_as_the_full_forward",
    "tests/vision_gemma4_bidirectional_test.py::test_the_same_image_again_is_served_from_the_prefix_cache",
    "tests/vision_gemma4_bidirectional_test.py::test_clips_stay_causal_beside_bidirectional_images",
    # KV transfer beyond Llama3 and images, and between two servers;
    # PaliGemma through a server.
    "tests/disaggregation_test.py::test_a_consumer_decodes_from_the_producers_kv[gemma4]",
    "tests/disaggregation_test.py::test_two_servers_and_the_route_between_them",
    "tests/pali_gemma_server_test.py::*",
    "tests/features_test.py::test_data_parallel_matches_one_engine",
    "tests/features_test.py::test_ngram_speculative_decoding",
    "vllm_keras_hub/smollm2_test.py::test_hf_export_matches_keras_hub",
    "vllm_keras_hub/vllm_fixes/saved_compile_test.py::*",
    # Images through a server and plain vLLM beyond Gemma3's (Gemma3n's
    # audio through its server moves below).
    *(
        f"tests/vision_server_test.py::{test}[gemma3n]"
        for test in (
            "test_an_image_url_part_gives_the_tokens_of_the_oracle",
            "test_a_local_file_under_the_allowed_path_gives_the_tokens_of_the_oracle",
            "test_a_system_message_renders_in_the_family_format",
            "test_an_invalid_image_is_a_400",
            "test_too_many_images_is_a_400",
        )
    ),
    "tests/vision_server_test.py::*[gemma4]",
    "vllm_keras_hub/entrypoints/cli_test.py::test_exported_vision_folder_serves_images_with_plain_vllm",
    "tests/model_test.py::test_multimodal_presets_serve_text_as_generate[qwen3_5]",
    "tests/plugin_test.py::test_plain_vllm_serves_a_hugging_face_model[jax]",
    "tests/preemption_test.py::*[gemma4]",
    # The MTP drafter compiled with its target (the eager case runs by
    # default), and at 2 ranks, where it shards as the target's layers do.
    "tests/mtp_test.py::*[compiled]",
    "tests/mtp_test.py::test_the_assistant_at_two_ranks_drafts_as_its_preset",
    "vllm_keras_hub/lora/merged_test.py::test_serve_merges_the_adapter_and_answers_the_openai_client",
    # A fine-tuned preset saved with its adapter merged, compiled (merging
    # at load runs by default).
    "vllm_keras_hub/lora/merged_test.py::test_preset_saved_after_lora_fine_tuning_serves_compiled",
)


def extended(nodeid):
    """Whether the test `nodeid` is in the extended tier."""
    return any(
        fnmatch.fnmatchcase(nodeid, pattern.replace("[", "[[]")) for pattern in EXTENDED
    )


def work_unit(nodeid):
    """The xdist work unit of the test `nodeid`."""
    module = nodeid.split("::")[0]
    if module in SPREAD_MODULES:
        return nodeid
    return GROUPS.get(module, module)


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling over `work_unit`s.

    Not `--dist loadgroup`: pytest-xdist 3.8 marks a group by appending to
    `item._nodeid`, which pytest 9 no longer reads, so every test became
    its own unit and module-scoped engines started on both workers.
    """
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return work_unit(nodeid)

    return WorkUnits(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Marks the extended tier, and orders the work units longest first by
    the durations the last runs wrote, so the two workers finish close
    together; tests within a unit keep their order. xdist
    (`--no-loadscope-reorder`) hands the units out in this order.
    """
    try:
        with open(DURATIONS) as f:
            durations = json.load(f)
    except (OSError, ValueError):
        durations = {}
    keys, units = [], {}
    for index, item in enumerate(items):
        if extended(item.nodeid):
            item.add_marker(pytest.mark.extended)
        key = work_unit(item.nodeid)
        first, total = units.get(key, (index, 0.0))
        units[key] = (first, total + durations.get(item.nodeid, _UNTIMED_S))
        keys.append(key)
    order = [(-units[key][1], units[key][0], index) for index, key in enumerate(keys)]
    items[:] = [item for _, item in sorted(zip(order, items), key=lambda pair: pair[0])]


_TIMES = {}
_STARTED = []


def pytest_sessionstart(session):
    _STARTED.append(time.time())


def pytest_runtest_logreport(report):
    """Adds up each test's setup, call and teardown (on the controller too)."""
    _TIMES[report.nodeid] = _TIMES.get(report.nodeid, 0.0) + report.duration


def _write_json(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=0 if path == DURATIONS else 2)
        f.write("\n")
    os.replace(path + ".tmp", path)


def _write_run(session, exitstatus):
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        cpu = platform.processor()
    workers = getattr(session.config.option, "numprocesses", None) or 0
    _write_json(LAST_RUN, {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": f"{os.cpu_count()} cores ({cpu})",
        "workers": workers,
        "wall_s": round(time.time() - _STARTED[0], 1),
        "tests_s": round(sum(_TIMES.values()), 1),
        "tests": len(_TIMES),
        "failed": session.testsfailed,
        "exit_status": int(exitstatus),
    })


def _write_durations():
    try:
        with open(DURATIONS) as f:
            known = json.load(f)
    except (OSError, ValueError):
        known = {}
    known.update({nodeid: round(seconds, 2) for nodeid, seconds in _TIMES.items()})
    _write_json(DURATIONS, dict(sorted(known.items())))


def pytest_sessionfinish(session, exitstatus):
    """Writes what the run measured: per-test durations, and the support
    matrix the parity tests filled in.

    Under pytest-xdist (scripts/test), a worker hands its matrix rows to the
    controller instead, which merges them in `pytest_testnodedown`; the
    controller sees every test's report, so it writes the durations.
    """
    from vllm_keras_hub.testing import reports
    from vllm_keras_hub.testing import support_matrix

    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["support_matrix"] = support_matrix.RESULTS
        return
    if _TIMES:
        _write_durations()
        _write_run(session, exitstatus)
    if support_matrix.RESULTS:
        with open(reports.path("support_matrix.md"), "w") as f:
            f.write(support_matrix.render())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from vllm_keras_hub.testing import support_matrix

    rows = getattr(node, "workeroutput", {}).get("support_matrix", {})
    for name, values in rows.items():
        support_matrix.RESULTS.setdefault(name, {}).update(values)
