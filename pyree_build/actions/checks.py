"""Input specs and output checks for `run`: parse, validate and compare, with clear messages.

The spec grammar is iree-run-module's `--input=`: a scalar (`3.5`), a buffer
(`[DIMxDIMx]TYPE=VALUES`, values separated by spaces or commas, optionally in brackets),
a raw file (`SHAPExTYPE=@file.bin`) or a numpy file (`@file.npy`). Mistakes are caught
here, before the runtime prints a terse flag error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pyree_build.core import lazy, processes, toolchain
from pyree_build.core.errors import PyreeError
from pyree_build.core.records import record

if TYPE_CHECKING:
    import numpy

np = lazy.module("numpy")  # only to read results as arrays

_INT_TYPES = {f"{p}{w}": w for p in ("i", "si", "ui") for w in (1, 2, 4, 8, 16, 32, 64)}
_FLOAT_TYPES = {"f16", "bf16", "f32", "f64", "f8E4M3FN", "f8E5M2", "f8E4M3FNUZ", "f8E5M2FNUZ", "f8E8M0FNU", "f4E2M1FN"}
ELEMENT_TYPES = set(_INT_TYPES) | _FLOAT_TYPES

# IREE element type -> numpy type name; numpy is imported only when arrays are made
# (it costs ~60 ms, which every compile would pay otherwise).
_NUMPY_TYPE_NAMES = {
    "i1": "bool_", "i8": "int8", "si8": "int8", "ui8": "uint8",
    "i16": "int16", "si16": "int16", "ui16": "uint16",
    "i32": "int32", "si32": "int32", "ui32": "uint32",
    "i64": "int64", "si64": "int64", "ui64": "uint64",
    "f16": "float16", "f32": "float32", "f64": "float64",
}  # fmt: skip


def numpy_dtype(element_type: str) -> type:
    """The numpy type for an IREE element type, or a clear error for one numpy lacks (bf16, f8...)."""
    try:
        return getattr(np, _NUMPY_TYPE_NAMES[element_type])
    except KeyError:
        raise PyreeError(
            f"element type '{element_type}' has no numpy equivalent",
            fix="pass a numpy array, or use iree-run-module through pb.run(..., in_process=False)",
        ) from None


_SHAPE_TYPE = re.compile(r"^(?P<dims>(?:\d+x)*)(?P<type>[A-Za-z][A-Za-z0-9]*)$")
_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf|nan|true|false|0x[0-9a-fA-F]+)$", re.I)
_FIX_INPUT = 'write it as SHAPExTYPE=VALUES, e.g. --input "8xf32=2" (one value fills the buffer) or --input "2x2xi32=1 2 3 4"'


@record(frozen=True)
class InputSpec:
    text: str
    shape: tuple[int, ...] | None  # None for a plain scalar or a .npy file
    element_type: str | None
    values: tuple[str, ...]
    file: Path | None


def _bad(spec: str, what: str, fix: str = _FIX_INPUT) -> PyreeError:
    return PyreeError(f"malformed input spec '{spec}': {what}", fix=fix)


# Compiled at import, so in the server before any worker forks: a pattern compiled on first
# use cost each fresh worker ~0.3 ms per pattern, on every `run`.
_SEPARATORS = re.compile(r"[\s,\[\]]+")
_NOT_SEPARATOR = re.compile(r"[^\s,\[\]]")


def _split_values(text: str) -> list[str]:
    return [v for v in _SEPARATORS.split(text) if v]


def parse_input(spec: str) -> InputSpec:
    """Validate one `--input` spec and return its parts; raise PyreeError saying what is wrong."""
    text = spec.strip()
    if not text:
        raise _bad(spec, "it is empty")
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.is_file():
            raise _bad(spec, f"file {path} not found", "check the path after '@' (a .npy file written by numpy.save)")
        return InputSpec(spec, None, None, (), path)
    if "=" not in text:
        if _NUMBER.match(text):
            return InputSpec(spec, None, None, (text,), None)
        raise _bad(spec, "no '=' between the shape/type and the values")
    head, _, body = text.partition("=")
    match = _SHAPE_TYPE.match(head.strip())
    if not match:
        raise _bad(spec, f"'{head}' is not SHAPExTYPE (dimensions are non-negative integers joined by 'x', then an element type)")
    etype = match["type"]
    if etype not in ELEMENT_TYPES:
        raise _bad(spec, f"unknown element type '{etype}'", f"use one of: {', '.join(sorted(ELEMENT_TYPES))}")
    shape = tuple(int(d) for d in match["dims"].split("x") if d)
    body = body.strip()
    if body.startswith("@"):
        path = Path(body[1:])
        if not path.is_file():
            raise _bad(spec, f"file {path} not found", "check the path after '@' (raw little-endian element data)")
        return InputSpec(spec, shape, etype, (), path)
    if _NOT_SEPARATOR.search(body) is None and math.prod(shape) > 0:
        raise _bad(spec, "no values after '='")
    if body.count("[") != body.count("]"):
        raise _bad(spec, "unbalanced brackets in the values")
    values = _split_values(body)
    for value in values:
        if not _NUMBER.match(value):
            raise _bad(spec, f"'{value}' is not a number")
    count = math.prod(shape)
    if values and len(values) not in (1, count):
        raise _bad(
            spec,
            f"{len(values)} values for shape {'x'.join(map(str, shape)) or '(scalar)'}, which has {count} elements",
            f"give one value (it fills the buffer) or exactly {count}",
        )
    return InputSpec(spec, shape, etype, tuple(values), None)


def parse_inputs(specs: Sequence[str]) -> list[InputSpec]:
    return [parse_input(s) for s in specs]


_SCALAR_HEADING = re.compile(r"^result\[\d+\]:\s*")
_RESULT_LINE = re.compile(r"^(?P<dims>(?:\d+x)*)(?P<type>[A-Za-z][A-Za-z0-9]*)=(?P<values>.*)$")


def parse_outputs(stdout: str) -> list[numpy.ndarray]:
    """The results iree-run-module printed (`8xf32=12 12 ...`, `i32=42`), as numpy arrays (0-d for a scalar)."""
    arrays = []
    for line in stdout.splitlines():
        # A scalar result is printed on its heading line: `result[1]: i32=42`.
        match = _RESULT_LINE.match(_SCALAR_HEADING.sub("", line.strip()))
        if not match or match["type"] not in _NUMPY_TYPE_NAMES:
            continue
        shape = tuple(int(d) for d in match["dims"].split("x") if d)
        values = _split_values(match["values"])
        dtype = numpy_dtype(match["type"])
        data: numpy.ndarray
        if match["type"] == "i1":
            # The runtime prints i1 as a byte ("01"/"00").
            data = np.array([v.lower() == "true" or (v.isdigit() and int(v) != 0) for v in values], dtype=dtype)
        else:
            data = np.array([float(v) if dtype in (np.float16, np.float32, np.float64) else int(v, 0) for v in values], dtype=dtype)
        if data.size == math.prod(shape):
            arrays.append(data.reshape(shape))
        elif data.size == 1:  # large outputs may be elided; only a splat is unambiguous
            arrays.append(np.full(shape, data[0], dtype=dtype))
    return arrays


EXPECT_RULE = "each expected TEXT must appear within one output line, as a substring; runs of whitespace compare equal"


def check_expected(output: str, expected: Sequence[str], *, source: str) -> None:
    """Every expected text appears within one output line (substring; whitespace runs equal).

    A substring, like FileCheck's CHECK: "M = 8, N = 8" passes on "M = 8, N = 8, K = 8".
    Within one line, so a text never matches across the end of one result and the next.
    """

    def norm(s: str) -> str:
        return " ".join(s.split())

    lines = [norm(line) for line in output.splitlines()] or [""]
    missing = [e for e in expected if not any(norm(e) in line for line in lines)]
    if missing:
        details = "expected (not found):\n" + "\n".join(f"  {m}" for m in missing)
        details += "\nactual output:\n" + "\n".join(f"  {line}" for line in output.rstrip().splitlines())
        details += f"\nrule: {EXPECT_RULE}"
        raise PyreeError(
            "output does not match what was expected",
            file=source,
            details=details,
            fix="compare the expected and actual lines above; fix the program or the expectation",
        )


def check_with_filecheck(output: str, check_file: str | Path, *, source: str, prefixes: Sequence[str] = ()) -> None:
    """Apply FileCheck semantics (the `filecheck` package) to the output.

    `prefixes` select the check lines as FileCheck's --check-prefix does (default CHECK),
    so upstream files with `CHECK-SYSTEM:` lines work as written.
    """
    path = Path(check_file)
    if not path.is_file():
        raise PyreeError("check file not found", file=path, fix="pass an existing file with CHECK: lines")
    text = path.read_text(encoding="utf-8", errors="replace")
    for prefix in prefixes or ("CHECK",):
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", prefix):
            raise PyreeError(f"'{prefix}' is not a check prefix", fix="a prefix is letters, digits, '-' and '_', e.g. CHECK-SYSTEM")
    if not any(re.search(rf"\b{re.escape(p)}(?:-(?:NEXT|SAME|NOT|DAG|LABEL|EMPTY|COUNT-\d+))?:", text) for p in prefixes or ("CHECK",)):
        raise PyreeError(
            f"no check lines with prefix {', '.join(prefixes or ('CHECK',))} in it, so nothing would be checked",
            file=path,
            fix="write lines like `// CHECK: 8xf32=12`, or pass the prefix the file uses with --check-prefix",
        )
    fc = toolchain.filecheck()
    prefix_args = [a for p in prefixes for a in ("--check-prefix", p)]
    result = processes.spawn(fc.command(*prefix_args, path), what="FileCheck", stdin=output, check=False)
    if result.returncode != 0:
        raise PyreeError(
            f"output does not match the CHECK lines of {path}",
            file=source,
            details=(result.stderr + result.stdout).strip() + "\nactual output:\n" + output.rstrip(),
            fix="compare the CHECK lines with the actual output above",
        )


def spec_array(value: object) -> numpy.ndarray:
    """An input or expected-value spec (`8xf32=2`, `4xf32=1 2 3 4`, `@a.npy`, `2.5`) or an
    array-like, as a numpy array."""
    if isinstance(value, np.ndarray):
        return value
    if not isinstance(value, str):
        return np.asarray(value)
    spec = parse_input(value)
    if spec.file is not None and spec.shape is None:
        return np.load(spec.file)
    dtype = numpy_dtype(spec.element_type) if spec.element_type else None
    if spec.file is not None:
        return np.fromfile(spec.file, dtype=dtype).reshape(spec.shape)
    if spec.shape is None:  # a bare scalar
        return np.asarray(float(spec.values[0]))
    values = [float(v) if dtype is not None and np.issubdtype(dtype, np.floating) else int(float(v)) for v in spec.values]
    if len(values) == 1:
        return np.full(spec.shape, values[0], dtype=dtype)
    return np.asarray(values, dtype=dtype).reshape(spec.shape)


# Against values the user gave (--expect-close, tune --expect-output): numpy.allclose's defaults.
DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-8
# Against results another implementation computed (verify's onnxruntime, tune's reference module
# or model): float32 kernels reorder sums (tiling, vector lanes, fused exp/div), so a few ulps of a
# value near 1 (1e-4 relative) are rounding. The absolute tolerance is relative to each output's
# largest magnitude, so rounding noise near zero passes while a 1000-class softmax (every value
# ~1e-3) is still compared to its own scale. Integer and bool outputs are exact.
COMPUTED_RTOL = 1e-4
COMPUTED_ATOL_SCALE = 1e-5
# float16 has 11 significant bits (one ulp is ~1e-3 relative): 1e-4 would fail every result one
# ulp apart, so a float16 output is held to a few ulps of its values and of its scale.
FLOAT16_TOLERANCE = 4e-3


def computed_tolerance(expected: numpy.ndarray, rtol: float | None = None, atol: float | None = None) -> tuple[float, float]:
    """The (rtol, atol) an output is held to against a computed reference: what the caller gave,
    else COMPUTED_RTOL and COMPUTED_ATOL_SCALE times the output's largest finite magnitude
    (FLOAT16_TOLERANCE for both where it is float16); integer and bool outputs exactly, unless
    an `atol` is given."""
    want = np.asarray(expected)
    half = want.dtype == np.float16
    if want.dtype.kind in "biu" and atol is None:
        return 0.0, 0.0
    finite = np.abs(want[np.isfinite(want)]) if want.dtype.kind in "fc" else np.abs(want.astype(np.float64)).ravel()
    scale = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    default_rtol = FLOAT16_TOLERANCE if half else COMPUTED_RTOL
    return (default_rtol if rtol is None else rtol, (FLOAT16_TOLERANCE if half else COMPUTED_ATOL_SCALE) * scale if atol is None else atol)


def close_elements(actual: numpy.ndarray, expected: numpy.ndarray, *, rtol: float, atol: float) -> numpy.ndarray:
    """The one comparison rule (run --expect-close, verify, tune): element i passes where it equals
    the expected one (NaN where NaN is expected, an infinity of the same sign; integers in their
    own type, so int64 compares exactly) or |actual - expected| <= atol + rtol * |expected|, an
    infinite expected value allowing nothing relative. Shapes must already agree."""
    got, want = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(got - want)
        bound = atol + rtol * np.abs(np.where(np.isfinite(want), want, 0.0))
        return np.asarray(same_elements(actual, expected) | (diff <= bound))


def same_elements(actual: numpy.ndarray, expected: numpy.ndarray) -> numpy.ndarray:
    """Where the elements are the same value: equal (integers in their own type), or both NaN."""
    got_raw, want_raw = np.asarray(actual), np.asarray(expected)
    if want_raw.dtype.kind in "biu" and got_raw.dtype.kind in "biu":
        return np.asarray(got_raw == want_raw)
    got, want = got_raw.astype(np.float64), want_raw.astype(np.float64)
    return np.asarray((got == want) | (np.isnan(got) & np.isnan(want)))


def check_close(results: Sequence[numpy.ndarray], expected: Sequence[str], *, rtol: float, atol: float, source: str) -> None:
    """Result i is within the tolerance of expected spec i (`4xf32=0.1 0.2 ...` or `@ref.npy`)."""
    if not (rtol >= 0 and atol >= 0):
        raise PyreeError(f"tolerances must be non-negative, got rtol {rtol:g}, atol {atol:g}", fix="pass e.g. --rtol 1e-5 --atol 1e-8")
    if len(expected) > len(results):
        raise PyreeError(
            f"{len(expected)} expected results given, the function returned {len(results)}", file=source, fix="give one --expect-close per result, in order"
        )
    for i, (actual, spec) in enumerate(zip(results, expected)):
        want = spec_array(spec)
        if np.shape(actual) != np.shape(want):
            raise PyreeError(
                f"result {i} has shape {list(np.shape(actual))}, the expected value {list(np.shape(want))}", file=source, fix="fix the expected value's shape"
            )
        close = close_elements(actual, want, rtol=rtol, atol=atol)
        if not close.all():
            with np.errstate(invalid="ignore"):
                diff = np.abs(np.asarray(actual, np.float64) - np.asarray(want, np.float64))
            worst = np.unravel_index(np.argmax(np.where(close, -1.0, np.nan_to_num(diff, nan=np.inf))), np.shape(want))
            raise PyreeError(
                f"result {i} differs from the expected value in {int((~close).sum())} of {close.size} elements (rtol {rtol:g}, atol {atol:g})",
                file=source,
                details=f"largest difference at index {list(map(int, worst))}: got {np.asarray(actual)[worst].item()!r}, expected {np.asarray(want)[worst].item()!r}",
                fix="fix the kernel, or loosen --rtol / --atol if the difference is rounding",
            )
