"""A program as a transform spec sees it: the IR after input conversion and ABI (IREE's
`--compile-to=abi`, where preprocessing and so `--iree-preprocessing-transform-spec-filename`
start), with locations, parsed by the MLIR Python bindings that ship in the compiler wheel.

Reading IREE's own parser and printer instead of a home-made one means every op, type and
attribute is read exactly as iree-compile will see it; the printed text of an op is what a
matcher must repeat.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pyree_build.cache import facts, local
from pyree_build.core import files, lazy, processes, toolchain
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.models.ir import captures

ir = lazy.module("iree.compiler.ir")
passmanager = lazy.module("iree.compiler.passmanager")

PathLike = str | os.PathLike[str]
T = TypeVar("T")

# The phase after which IREE runs preprocessing, where a transform spec is applied.
SPEC_PHASE = "abi"
_TARGET_FLAGS = ("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu")


def spec_view_text(source: PathLike) -> str:
    """The program after input conversion and ABI, printed with its locations. Kept in the
    cache by the program's content (import leaves it there: its check is this same compile),
    so `ops` and `replace` of a program read before run no input conversion again."""
    src = require_file(source, "program").resolve()
    if src.suffix not in (".mlir", ".mlirbc"):
        raise PyreeError(
            "expected an MLIR program (.mlir or .mlirbc)",
            file=src,
            fix="import an ONNX model first: pyree-build import MODEL.onnx -o MODEL.mlir",
        )
    kept = _kept_view(src)
    if kept is not None:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            return kept.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="pyree-ops.") as scratch:
        out = Path(scratch) / "program.mlir"
        processes.spawn(
            view_command(src, out),
            what="iree-compile (input conversion)",
            file=src,
            fix="the program must compile with iree-compile; fix the error shown (an imported model: re-import it with this IREE release)",
        )
        text = out.read_text(encoding="utf-8")
    remember_view(src, text)
    return text


def view_command(source: Path, out: Path) -> list[str]:
    """The iree-compile command that writes the program as a spec sees it."""
    return [str(toolchain.iree_compile().path), str(source), f"--compile-to={SPEC_PHASE}", "--mlir-print-debuginfo", *_TARGET_FLAGS, "-o", str(out)]


# Views kept in the cache, by the program's bytes and the compiler's identity; a view larger
# than this (weights inline as text) is not worth its disk: reading it costs what making it does.
_VIEWS = "spec-views"
_VIEW_KEPT_MAX = 64 << 20


def _kept_view(source: Path) -> Path | None:
    directory = local.work_dir(_VIEWS)
    digest = local.hash_file(source)
    if directory is None or digest is None:
        return None
    key = local.digest("pyree_build.spec-view.v1", digest, facts.tool_identity(toolchain.iree_compile().path), SPEC_PHASE, *_TARGET_FLAGS)
    return directory / f"{key}.mlir"


def remember_view(source: Path, text: str) -> None:
    """Keep `text`, the view of the program whose bytes `source` holds (view_command's output)."""
    if len(text) > _VIEW_KEPT_MAX:
        return
    kept = _kept_view(source)
    if kept is None:
        return
    with contextlib.suppress(OSError), files.atomic_output(kept) as private:
        private.write_text(text, encoding="utf-8")


def after_spec(source: PathLike, spec_text: str) -> str:
    """The program `source` after a transform spec's phase (preprocessing), with `spec_text`
    applied: where the spec placed its calls, before IREE optimizes anything away."""
    src = require_file(source, "program").resolve()
    with tempfile.TemporaryDirectory(prefix="pyree-placed.") as scratch:
        spec_file, out = Path(scratch) / "spec.mlir", Path(scratch) / "placed.mlir"
        spec_file.write_text(spec_text, encoding="utf-8")
        argv = [str(toolchain.iree_compile().path), str(src), "--compile-to=preprocessing", *_TARGET_FLAGS,
                f"--iree-preprocessing-transform-spec-filename={spec_file}", "-o", str(out)]  # fmt: skip
        processes.spawn(argv, what="iree-compile (where the generated spec places each call)", file=src,
                        fix="report this: the generated spec should apply to the program it was generated from")  # fmt: skip
        return out.read_text(encoding="utf-8")


def parse(text: str, *, generalize: bool = False) -> Any:
    """The module parsed in a fresh context, as a generated spec's matchers see it: after the
    spec's first step, which clones the scalar constants linalg bodies use into them
    (captures.sink). With `generalize`, every named linalg op is rewritten as the
    linalg.generic it stands for (in place: the op order is unchanged)."""
    context = ir.Context()
    module = ir.Module.parse(text, context)
    if generalize:
        pipeline = "builtin.module(util.func(linalg-generalize-named-ops))"
        passmanager.PassManager.parse(pipeline, context).run(module.operation)
    # After the pass: its pattern driver hoists constants out of bodies again.
    captures.sink(module)
    return module


def functions(module: Any) -> list[Any]:
    """The module's util.func (and func.func) ops that have a body."""
    found = []
    for op in module.body.operations:
        operation = op.operation
        if operation.name in ("util.func", "func.func") and len(operation.regions) and len(operation.regions[0].blocks):
            found.append(operation)
    return found


def symbol_name(operation: Any) -> str:
    return str(ir.StringAttr(operation.attributes["sym_name"]).value)


# What is read once per function and asked per group (its ops' positions, its program edges):
# asked afresh per group, the answer's cost made every group's work grow with the model's size.
# Facts are kept only for modules being read (`reading`), and dropped with them: keyed by an op
# of a freed module, a lookup would compare a live op with a dead one (a segfault in MLIR's
# bindings). Parsing fixes a body's top-level ops (sink and generalization change what is inside
# ops, never which ops a body holds), so a fact stays true while its module is read.
_READING: list[tuple[Any, dict[Any, dict[str, Any]]]] = []


@contextlib.contextmanager
def reading(module: Any) -> Iterator[None]:
    """Keep `module` alive and its functions' facts (function_fact) for the block."""
    entry: tuple[Any, dict[Any, dict[str, Any]]] = (module, {})
    _READING.append(entry)
    try:
        yield
    finally:
        _READING[:] = [e for e in _READING if e is not entry]


def function_fact(function: Any, name: str, compute: Callable[[Any], T]) -> T:
    """`compute(function)`, computed once per function and `name` while its module is read
    (`reading`); computed afresh outside."""
    parent = function.parent
    for module, by_function in _READING:
        if parent is not None and parent == module.operation:
            known = by_function.setdefault(function, {})
            if name not in known:
                known[name] = compute(function)
            return known[name]
    return compute(function)


def _body(function: Any) -> tuple[tuple[Any, ...], dict[Any, int]]:
    def listed(function: Any) -> tuple[tuple[Any, ...], dict[Any, int]]:
        ops = tuple(op.operation for op in function.regions[0].blocks[0].operations)
        return ops, {op: i for i, op in enumerate(ops)}

    return function_fact(function, "body", listed)


def body_ops(function: Any) -> tuple[Any, ...]:
    """The function's top-level ops, in program order."""
    return _body(function)[0]


def op_index(op: Any, function: Any) -> int:
    """Where a top-level op of `function` is in its body (program order)."""
    return _body(function)[1][op]


# loc("fc1"), loc("fc1"("m.mlir":7:10)), loc(fused["a", "b"]), loc("m.mlir":7:10)
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"(:\d+:\d+)?')
_FILE_LINE = re.compile(r'"((?:[^"\\]|\\.)*)":(\d+):\d+')


_ESCAPE = re.compile(rb"\\([0-9A-Fa-f]{2}|.)", re.DOTALL)
_NAMED_ESCAPES = {b"n": b"\n", b"t": b"\t"}


def string_value(body: str) -> str:
    """The text an MLIR string literal's body stands for. MLIR prints every byte outside
    printable ASCII as `\\HH` (`é` is `\\C3\\A9`): the bytes are collected, then read as UTF-8."""

    def byte(m: re.Match[bytes]) -> bytes:
        escaped = m.group(1)
        return bytes([int(escaped, 16)]) if len(escaped) == 2 else _NAMED_ESCAPES.get(escaped, escaped)

    return _ESCAPE.sub(byte, body.encode("utf-8", "surrogateescape")).decode("utf-8", "replace")


def location_names(location: Any) -> list[str]:
    """The names in an op's location (ONNX node names where the importer put them), as text."""
    return [string_value(m.group(1)) for m in _STRING.finditer(str(location)) if m.group(1) and not m.group(2)]


def location_lines(location: Any) -> list[tuple[str, int]]:
    """(file, line) pairs of an op's location."""
    return [(string_value(f), int(line)) for f, line in _FILE_LINE.findall(str(location))]


def element_type(type_: Any) -> str:
    """`f32` for tensor<4x8xf32>; the type itself for a scalar."""
    if isinstance(type_, ir.ShapedType):
        return str(type_.element_type)
    return str(type_)


def shape(type_: Any) -> list[int | None]:
    """Dimensions of a ranked tensor type, None for a dynamic one."""
    return [None if type_.is_dynamic_dim(i) else type_.get_dim_size(i) for i in range(type_.rank)]


def is_tensor(type_: Any) -> bool:
    return isinstance(type_, ir.RankedTensorType)


def defining_op(value: Any) -> Any | None:
    """The op that defines `value`, or None for a block argument."""
    if isinstance(value, ir.OpResult):
        return value.owner
    return None


def result_index(value: Any) -> int:
    return int(value.result_number)


def nested_operands(operation: Any) -> list[Any]:
    """Operands of the ops inside `operation`'s regions (values a body may capture)."""
    return [v for op in captures.nested_ops(operation) for v in op.operands]


def nested_op_names(operation: Any) -> list[str]:
    return [op.name for op in captures.nested_ops(operation)]


def position(value: Any, function: Any) -> tuple[int, int]:
    """Where a value is, as (op index in the body, result number), or (-1, argument number):
    the same in a program and in its generalised copy, whose ops correspond one to one."""
    owner = defining_op(value)
    if owner is None:
        return -1, int(value.arg_number)
    return op_index(owner.operation, function), result_index(value)


def value_at(where: tuple[int, int], function: Any) -> Any:
    index, number = where
    if index < 0:
        return function.regions[0].blocks[0].arguments[number]
    return body_ops(function)[index].results[number]
