"""The index of vLLM fixes names every fix, and a proof that exists."""

import pathlib
import re

from vllm_keras_hub import vllm_fixes

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_fix_file_is_indexed_once():
    files = {
        path.stem
        for path in pathlib.Path(vllm_fixes.__file__).parent.glob("*.py")
        if path.stem != "__init__" and not path.stem.endswith("_test")
    }
    indexed = [fix.module for fix in vllm_fixes.FIXES]
    assert sorted(indexed) == sorted(files)


def test_each_fix_names_its_proof_and_when_it_can_go():
    for fix in vllm_fixes.FIXES:
        path, _, test = fix.proof.partition("::")
        source = (ROOT / path).read_text()
        assert re.search(rf"^(async )?def {re.escape(test)}\(", source, re.M), fix.proof
        assert fix.bug and fix.applied and fix.remove_when
        # The fix's own file says when it can go, as the index does.
        module = (pathlib.Path(vllm_fixes.__file__).parent / f"{fix.module}.py").read_text()
        assert "Remove when" in module, fix.module
