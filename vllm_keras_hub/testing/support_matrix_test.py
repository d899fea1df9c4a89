import pytest

from vllm_keras_hub.testing import support_matrix


def _run(commit, date, rows, chat=None, refused=None):
    return {"commit": commit, "date": date, "rows": rows, "chat": chat or {},
            "refused": refused or {}}


def test_a_cell_keeps_the_run_that_last_measured_it():
    first = support_matrix.merge(
        support_matrix.load("/no/such/file"),
        _run("aaa", "d1", {"llama3": {"backbone": "Llama3Backbone", "batched": "pass",
                                      "tp2": "pass"}}),
    )
    second = support_matrix.merge(
        first,
        _run("bbb", "d2", {"llama3": {"backbone": "Llama3Backbone", "batched": "FAIL"}},
             chat={"llama3": {"served": ["tools: `llama3_json`"], "format": ["renders"]}},
             refused={"Gemma3nBackbone": ["pp2"]}),
    )
    assert second["rows"]["llama3"]["cells"] == {"batched": ["FAIL", "r2"], "tp2": ["pass", "r1"]}
    assert second["runs"] == {"r1": {"commit": "aaa", "date": "d1"},
                              "r2": {"commit": "bbb", "date": "d2"}}
    assert second["chat"] == {
        "llama3": {"format": ["renders", "r2"], "served": ["tools: `llama3_json`", "r2"]}
    }
    text = support_matrix.render(second)
    assert "| Llama3 | llama3 | " in text and "FAIL (r2)" in text and "pass (r1)" in text
    assert "renders (r2); served: tools: `llama3_json` (r2)" in text
    assert "- r1: aaa, d1" in text and "refused" not in text.split("| Llama3 |")[1].split("\n")[0]


def test_a_run_no_cell_names_any_more_is_dropped():
    rows = {"llama3": {"backbone": "Llama3Backbone", "batched": "pass"}}
    first = support_matrix.merge(support_matrix.load("/no/such/file"), _run("aaa", "d1", rows))
    second = support_matrix.merge(first, _run("bbb", "d2", rows))
    assert list(second["runs"]) == ["r2"]


def test_a_run_of_uncommitted_changes_is_refused():
    with pytest.raises(ValueError, match="uncommitted"):
        support_matrix.merge(support_matrix.load("/no/such/file"), _run(None, "d1", {}))


def test_a_run_of_one_kind_of_chat_test_keeps_the_others_cell():
    served = support_matrix.merge(
        support_matrix.load("/no/such/file"),
        _run("aaa", "d1", {}, chat={"qwen3": {"served": ["tools: `hermes`; thinking: `qwen3`"]}}),
    )
    both = support_matrix.merge(
        served, _run("bbb", "d2", {}, chat={"qwen3": {"format": ["renders"]}})
    )
    assert both["chat"]["qwen3"] == {
        "served": ["tools: `hermes`; thinking: `qwen3`", "r1"], "format": ["renders", "r2"]
    }  # fmt: skip


def test_a_layout_served_after_a_refusal_is_no_longer_refused():
    refused = support_matrix.merge(
        support_matrix.load("/no/such/file"),
        _run("aaa", "d1", {}, refused={"Gemma3nBackbone": ["pp2", "tp2"]}),
    )
    served = support_matrix.merge(
        refused, _run("bbb", "d2", {"gemma3n": {"backbone": "Gemma3nBackbone", "pp2": "pass"}})
    )
    assert served["refused"] == {"Gemma3nBackbone": {"tp2": "r1"}}
    assert served["rows"]["gemma3n"]["cells"]["pp2"] == ["pass", "r2"]
