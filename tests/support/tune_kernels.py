"""Shared by the tests: EXPECTED, SLOW, WRONG, CRASH, HANG, tune_args, write_kernel, KERNEL_BODY, INPUTS, QUICK, TUNABLE (once in test_tune.py),
and a model's module with two generated kernels (two_kernel_model)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from conftest import PLUGIN_SAMPLE, run_cli

# UNROLL is the knob; a few of its values are broken on purpose.
WRONG, CRASH, HANG, SLOW = "3", "0", "7", "9"

KERNEL_BODY = """  for (size_t i = 0; i < a->count; ++i) {
    a->out[a->out_offset + i] = a->lhs[a->lhs_offset + i] * a->rhs[a->rhs_offset + i];
  }
  return 0;"""

TUNABLE = """#ifndef UNROLL
#define UNROLL 1
#endif
#if UNROLL == 0  /* crashes */
  *(volatile int*)0 = 1;
#endif
#if UNROLL == 7  /* hangs */
  for (volatile int spin = 1; spin;) {}
#endif
#if UNROLL == 9  /* slow: a busy loop in every call */
  for (volatile int spin = 0; spin < 2000000; ++spin) {}
#endif
  size_t i = 0;
  for (; i + UNROLL <= a->count; i += UNROLL)
    for (size_t u = 0; u < UNROLL; ++u)
      a->out[a->out_offset + i + u] = a->lhs[a->lhs_offset + i + u] * a->rhs[a->rhs_offset + i + u];
  for (; i < a->count; ++i) a->out[a->out_offset + i] = a->lhs[a->lhs_offset + i] * a->rhs[a->rhs_offset + i];
#if UNROLL == 3  /* wrong: one element off by one */
  a->out[a->out_offset] += 1.0f;
#endif
  return 0;"""

INPUTS = ["64xf32=2", "64xf32=4"]

EXPECTED = "64xf32=12"

# Quick settings: every round is short, and a hang is declared after 3 s.
QUICK = ["--timeout", "3", "--budget", "1.5", "--repetitions", "2"]


def write_kernel(directory: Path) -> Path:
    text = (PLUGIN_SAMPLE / "system_plugin.c").read_text(encoding="utf-8")
    assert KERNEL_BODY in text
    path = directory / "kernel.c"
    path.write_text(text.replace(KERNEL_BODY, TUNABLE), encoding="utf-8")
    return path


def tune_args(kernel: Path, module: Path, out: Path, values: str) -> list[object]:
    inputs = [x for spec in INPUTS for x in ("--input", spec)]
    return ["tune", kernel, "--param", f"UNROLL={values}", "--module", module, "--function", "mixed_invocation", *inputs,
            "--expect-output", EXPECTED, *QUICK, "-o", out]  # fmt: skip


class TwoKernels(NamedTuple):
    """tests/support/onnx_models.py's mlp with groups 1 (fc1, bias1, relu1) and 3 (softmax)
    replaced at once: one module calling imports fc1 and sm; sm's plugin built, fc1's source
    left to tune; IREE's module of the same model as the reference."""

    model: Path
    fc1: Path
    sm_plugin: Path
    module: Path
    reference: Path

    def tune_args(self, out: Path) -> list[object]:
        """`tune` of fc1.c over two tile heights in the module, without the other plugin."""
        return ["tune", self.fc1, "--param", "PYREE_TILE_ROWS=8,2", "--module", self.module, "--function", "mlp", "--input", "4x16xf32=0.5",
                "--reference", self.reference, *QUICK, "-o", out]  # fmt: skip


def two_kernel_model(directory: Path) -> TwoKernels:
    from support import onnx_models

    model = Path(onnx_models.save(onnx_models.mlp(), directory / "mlp.onnx"))
    kernels, mlir = directory / "kernels", directory / "mlp.mlir"
    out = TwoKernels(model, kernels / "fc1.c", directory / "sm.so", directory / "replaced.vmfb", directory / "iree.vmfb")
    steps = [
        run_cli("import", model, "-o", mlir),
        run_cli("replace", mlir, "--ops", "1", "--ops", "3", "--import", "fc1", "--import", "sm", "-o", kernels, "--onnx", model),
        run_cli("plugin", kernels / "sm.c", "-o", out.sm_plugin),
        run_cli("compile", mlir, "-o", out.module, "--transform-spec", kernels / "spec.mlir", "--expect-import", "fc1", "--expect-import", "sm"),
        run_cli("compile", mlir, "-o", out.reference),
    ]  # fmt: skip
    assert all(r.returncode == 0 for r in steps), steps
    return out
