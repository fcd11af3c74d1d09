"""Issue 35 items 7 and 17: what a tune trusts.

7: a variant right on its first call only (garbage from the second) was checked with one call
and chosen as the best; each variant is now called several times in one process, with random
inputs too when a reference module can judge them, and the winner is checked again after its
benchmark. 17: `tune --apply` and CMake's TUNED took any
parameter name or value from best.json: a line break added preprocessor lines, a name such as
`f(p, c, r)` redefined a function. Both are refused as --param refuses them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE, assert_clean_error, run_cli
from support.tune_kernels import EXPECTED, INPUTS, KERNEL_BODY

import pyree_build as pb
from pyree_build.core.errors import PyreeError

# MODE 1: right on every call, but slow. MODE 2: right on the first call of a process only.
# MODE 4: right for the given inputs (2 and 4) only.
# MODE 3: right for its first calls, wrong once a benchmark has called it many times (the state
# outlives the process: a file, as a cache or a tuning table on disk would).
_STATEFUL = """  static int calls = 0;
  ++calls;
#if MODE == 1
  for (volatile int spin = 0; spin < 3000000; ++spin) {}
#endif
  for (size_t i = 0; i < a->count; ++i) a->out[a->out_offset + i] = a->lhs[a->lhs_offset + i] * a->rhs[a->rhs_offset + i];
#if MODE == 2
  if (calls > 1) a->out[a->out_offset] += 1.0f;
#endif
#if MODE == 4
  if (a->lhs[a->lhs_offset] != 2.0f) a->out[a->out_offset] = 8.0f;  /* right for the given inputs only */
#endif
#if MODE == 3
  if (calls > 5) { FILE* f = fopen(MARK_FILE, "w"); if (f) fclose(f); }
  FILE* seen = fopen(MARK_FILE, "r");
  if (seen) { fclose(seen); a->out[a->out_offset] += 1.0f; }
#endif
  return 0;"""


def _kernel(directory: Path) -> Path:
    text = (PLUGIN_SAMPLE / "system_plugin.c").read_text(encoding="utf-8")
    assert KERNEL_BODY in text
    path = directory / "stateful.c"
    path.write_text("#include <stdio.h>\n" + text.replace(KERNEL_BODY, _STATEFUL), encoding="utf-8")
    return path


def _tune(kernel: Path, module: Path, out: Path, modes: str, *reference: object) -> object:
    inputs = [x for spec in INPUTS for x in ("--input", spec)]
    return run_cli("tune", kernel, "--param", f"MODE={modes}", "-D", f'MARK_FILE="{out.parent / "mark"}"', "--module", module,
                   "--function", "mixed_invocation", *inputs, *(reference or ("--expect-output", EXPECTED)), "--timeout", "20",
                   "--budget", "1.5", "--repetitions", "2", "-o", out)  # fmt: skip


REFERENCE = """func.func @mixed_invocation(%a: tensor<?xf32>, %b: tensor<?xf32>) -> tensor<?xf32> {
  %p = arith.mulf %a, %b : tensor<?xf32>
  %s = arith.addf %p, %b : tensor<?xf32>
  return %s : tensor<?xf32>
}
"""


def test_a_variant_right_for_the_given_inputs_only_is_never_chosen(system_module, tmp_path):
    """With --reference, each variant also gets random inputs of the same shapes."""
    (tmp_path / "ref.mlir").write_text(REFERENCE)
    compiled = run_cli("compile", tmp_path / "ref.mlir", "--target", "llvm-cpu", "-o", tmp_path / "ref.vmfb")
    assert compiled.returncode == 0, compiled
    out = tmp_path / "best.json"
    result = _tune(_kernel(tmp_path), system_module, out, "1,4", "--reference", tmp_path / "ref.vmfb")
    assert result.returncode == 0, result
    best = json.loads(out.read_text())
    assert best["winner"]["params"] == {"MODE": "1"}, result.stdout
    status = {v["params"]["MODE"]: v for v in best["variants"]}
    assert status["4"]["status"] == "wrong result" and "random inputs" in status["4"]["reason"], status["4"]


def test_a_variant_right_on_its_first_call_only_is_never_chosen(system_module, tmp_path):
    out = tmp_path / "best.json"
    result = _tune(_kernel(tmp_path), system_module, out, "1,2")
    assert result.returncode == 0, result
    best = json.loads(out.read_text())
    assert best["winner"]["params"] == {"MODE": "1"}, result.stdout
    status = {v["params"]["MODE"]: v for v in best["variants"]}
    assert status["2"]["status"] == "wrong result" and "call 2 of 3" in status["2"]["reason"], status["2"]


def test_the_winner_is_checked_again_after_its_benchmark(system_module, tmp_path):
    out = tmp_path / "best.json"
    result = _tune(_kernel(tmp_path), system_module, out, "1,3")
    assert result.returncode == 0, result
    best = json.loads(out.read_text())
    assert best["winner"]["params"] == {"MODE": "1"}, result.stdout
    status = {v["params"]["MODE"]: v for v in best["variants"]}
    assert status["3"]["status"] == "wrong result" and "after its benchmark" in status["3"]["reason"], status["3"]


HOSTILE_PARAMS = {
    "a line break in a name": {"UNROLL\n#error INJECTED": "1"},
    "a function-like name": {"simple_mul_workgroup(p, c, r)": "evil_fn(p, c, r)"},
    "a line break in a value": {"UNROLL": "1\n#error INJECTED"},
}


def _best_json(path: Path, params: dict[str, str]) -> Path:
    path.write_text(json.dumps({"format": "pyree_build.tune.v1", "winner": {"params": params}}))
    return path


@pytest.mark.parametrize("kind", sorted(HOSTILE_PARAMS))
def test_apply_refuses_params_param_would_refuse(tmp_path, kind):
    tuned = _best_json(tmp_path / "best.json", HOSTILE_PARAMS[kind])
    src = PLUGIN_SAMPLE / "system_plugin.c"
    result = run_cli("tune", src, "--apply", tuned, "-o", tmp_path / "k.so")
    assert_clean_error(result, "not a tune result")
    assert "error: INJECTED" not in result.output, result.output  # the compiler never saw the line
    assert not (tmp_path / "k.so").exists()
    with pytest.raises(PyreeError, match="not a tune result"):
        pb.tune.build_tuned([src], tmp_path / "k2.so", tuned=tuned)


def test_param_refuses_a_value_with_a_line_break():
    with pytest.raises(PyreeError, match="line break"):
        pb.tune.parse_params({"UNROLL": ["1\n#error INJECTED"]})
