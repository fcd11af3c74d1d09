"""What every variant must reproduce: the expected results (a reference module's, onnxruntime's or
the given ones), the inputs drawn for an ONNX model given none, random inputs with the reference
module's results for them (`Case`), and the tolerance of the check (checks.computed_tolerance
against computed results).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pyree_build.actions import checks
from pyree_build.actions import run as run_action
from pyree_build.core import echo, files, lazy
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.tuning.plan import Case, PathLike, Plan

if TYPE_CHECKING:
    import numpy

np = lazy.module("numpy")
_verify = lazy.module("pyree_build.models.verify")
_importer = lazy.module("pyree_build.models.ir.importer")
_verify_inputs = lazy.module("pyree_build.models.verify_inputs")


def expected_outputs(
    plan: Plan, *, reference: PathLike | None, onnx: PathLike | None, expect_output: Sequence[str], plugins: Sequence[PathLike] = ()
) -> list[numpy.ndarray]:
    """The results every variant must reproduce: the reference module's, onnxruntime's or the given ones."""
    given = [reference is not None, onnx is not None, bool(expect_output)]
    if sum(given) != 1:
        raise PyreeError(
            "a tune needs exactly one reference for the results: --reference REF.vmfb, --onnx MODEL.onnx or --expect-output",
            fix="e.g. --reference build/model_without_plugin.vmfb (the same program compiled without your kernel)",
        )
    if reference is not None:
        ref = require_file(reference, "reference module")
        with echo.Stopwatch(f"reference results from {ref.name}"):
            return run_action.run(ref, plan.function, inputs=plan.inputs, plugins=plugins, device=reference_device(plan, ref), timeout=plan.timeout).outputs
    if onnx is not None:
        model_path = require_file(onnx, "ONNX model")
        model = _importer.load_model(model_path)
        arrays = _verify.given_inputs(model, plan.inputs, model_path)
        return list(_verify.reference_outputs(model_path, model, arrays)[1])
    return [checks.spec_array(e if not str(e).endswith(".npy") or str(e).startswith("@") else f"@{e}") for e in expect_output]


def reference_device(plan: Plan, reference: Path) -> str:
    """Where the reference module runs: a CPU tune's device; a GPU kernel's reference on the
    device it was compiled for (the program without the kernel, for the CPU or for the GPU)."""
    return _verify.module_device(reference) if plan.gpu else plan.device


def drawn_inputs(onnx: PathLike, directory: Path) -> list[str]:
    """Inputs for a tune against an ONNX model given none: verify's wide draw (floats past and at
    the model's constants, integers across their type; small integers where onnxruntime refuses
    those), saved as input_N.npy in `directory`, as `@` specs every variant's run reads."""
    model_path = require_file(onnx, "ONNX model")
    model = _importer.load_model(model_path)
    for integers in (None, *_verify_inputs.FALLBACKS):
        drawn = _verify_inputs.draw(model, model_path, seed=0, style="wide", integers=integers)
        try:
            _verify.reference_outputs(model_path, model, drawn.arrays)
            break
        except PyreeError:
            continue  # the last draw goes on: expected_outputs names onnxruntime's refusal
    directory.mkdir(parents=True, exist_ok=True)
    specs = []
    for i, array in enumerate(drawn.arrays):
        path = directory / f"input_{i}.npy"
        with files.atomic_output(path) as tmp, open(tmp, "wb") as f:
            np.save(f, array, allow_pickle=False)
        specs.append(f"@{path.resolve()}")
    echo.log_step(f"inputs for {model_path.name}: {drawn.label}, in {directory}")
    return specs


# Besides the given inputs, each variant gets this many sets of random inputs of the same
# shapes (when a reference module can say what their results are): a kernel right for the
# given values only (a constant, a special case) is wrong.
RANDOM_CASES = 2


def random_cases(plan: Plan, reference: PathLike, directory: Path, count: int = RANDOM_CASES) -> list[Case]:
    """`count` sets of random inputs shaped as the given ones (numbers stay as given), saved
    under `directory`, with the reference module's results for each."""
    rng = np.random.default_rng(0x5EED)
    cases = []
    for k in range(count):
        specs = []
        for i, spec in enumerate(plan.inputs):
            parsed = checks.parse_input(spec)
            if parsed.shape is None and parsed.file is None:  # a scalar parameter
                specs.append(spec)
                continue
            given = checks.spec_array(spec)
            if given.dtype.kind == "f":
                values = rng.uniform(-4, 4, given.shape).astype(given.dtype)
            elif given.dtype.kind in "iu":
                values = rng.integers(0 if given.dtype.kind == "u" else -8, 8, given.shape).astype(given.dtype)
            else:
                values = rng.integers(0, 2, given.shape).astype(given.dtype)
            path = directory / "random_inputs" / f"case{k}_input{i}.npy"
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, values)
            specs.append(f"@{path}")
        with echo.muted_commands():
            outputs = run_action.run(reference, plan.function, inputs=specs, device=reference_device(plan, Path(reference)), timeout=plan.timeout).outputs
        cases.append(Case(specs, list(outputs)))
    return cases


def tolerance(rtol: float | None, atol: float | None, expected: Sequence[numpy.ndarray], *, computed: bool) -> tuple[float, float]:
    """The check's tolerance: what the caller gave; else, against results another implementation
    computed (a reference module, onnxruntime), verify's: 1e-4 relative and 1e-5 times the largest
    float magnitude absolute, since a sum taken in another order (IREE's code, a tiled kernel)
    differs in its last bits, more the longer it is; against values given (--expect-output), 1e-5
    and 1e-8."""
    floats = [np.asarray(a) for a in expected if np.asarray(a).dtype.kind in "fc" and np.asarray(a).size]
    if not computed or not floats:
        return (checks.DEFAULT_RTOL if rtol is None else rtol, checks.DEFAULT_ATOL if atol is None else atol)
    # One tolerance for the kernel's outputs: the loosest of checks' rule for each (one output, as
    # a replaced group has, is held to exactly what verify holds it to).
    per_output = [checks.computed_tolerance(a, rtol, atol) for a in floats]
    return max(r for r, _ in per_output), max(a for _, a in per_output)


def prepare(plan: Plan, directory: Path, reference: PathLike | None, onnx: PathLike | None, expect_output: Sequence[str], rtol: float | None,
            atol: float | None) -> tuple[Plan, list[numpy.ndarray], list[Case]]:  # fmt: skip
    """The results each variant must reproduce, the plan with its inputs (verify's draw where an
    ONNX model is given without them) and tolerance, and the random cases a reference module gives."""
    if onnx is not None and not plan.inputs and not expect_output and reference is None:
        plan = replace(plan, inputs=drawn_inputs(onnx, directory / "inputs"))
    expected = expected_outputs(plan, reference=reference, onnx=onnx, expect_output=expect_output)
    checked_rtol, checked_atol = tolerance(rtol, atol, expected, computed=not expect_output)
    plan = replace(plan, rtol=checked_rtol, atol=checked_atol)
    return plan, expected, random_cases(plan, reference, directory) if reference is not None else []
