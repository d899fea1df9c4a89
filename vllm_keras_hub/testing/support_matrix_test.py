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
             chat={"llama3": ["renders", "tools: `llama3_json`"]},
             refused={"Gemma3nBackbone": ["pp2"]}),
    )
    assert second["rows"]["llama3"]["cells"] == {"batched": ["FAIL", "r2"], "tp2": ["pass", "r1"]}
    assert second["runs"] == {"r1": {"commit": "aaa", "date": "d1"},
                              "r2": {"commit": "bbb", "date": "d2"}}
    assert second["chat"] == {"llama3": ["renders; tools: `llama3_json`", "r2"]}
    text = support_matrix.render(second)
    assert "| Llama3 | llama3 | " in text and "FAIL (r2)" in text and "pass (r1)" in text
    assert "- r1: aaa, d1" in text and "refused" not in text.split("| Llama3 |")[1].split("\n")[0]


def test_a_run_no_cell_names_any_more_is_dropped():
    rows = {"llama3": {"backbone": "Llama3Backbone", "batched": "pass"}}
    first = support_matrix.merge(support_matrix.load("/no/such/file"), _run("aaa", "d1", rows))
    second = support_matrix.merge(first, _run("bbb", "d2", rows))
    assert list(second["runs"]) == ["r2"]


def test_a_run_of_uncommitted_changes_is_refused():
    with pytest.raises(ValueError, match="uncommitted"):
        support_matrix.merge(support_matrix.load("/no/such/file"), _run(None, "d1", {}))
