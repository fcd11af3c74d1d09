"""A module's results as iree-run-module prints them: read from its metadata (how many, of
which types) and from the `.npy` files a run writes, without numpy where the file is plain."""

from __future__ import annotations

import functools
import io
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyree_build.actions import checks
from pyree_build.actions.arguments import declared_parameters
from pyree_build.cache import facts
from pyree_build.core import echo, lazy, processes, toolchain
from pyree_build.core.errors import PyreeError

if TYPE_CHECKING:
    import numpy

np = lazy.module("numpy")


# A function's name is the model's graph name, data that may hold spaces and brackets ("Extracted
# from {resnet50}", as onnx.utils.extract_model names a graph): it runs up to the argument list,
# whose VM types hold no parentheses.
_EXPORT_LINE = re.compile(r"^\s*\[\s*\d+\]\s+(?P<name>.+?)\((?P<args>[^()]*)\) -> \((?P<results>.*)\)\s*$")
_DECLARED_RESULT = re.compile(r"%output\d+:\s*(?P<type>.+?)(?=,\s*%output\d+:|\)?\s*$)")
NPY_TENSOR = re.compile(r"^tensor<(?:(?:\d+|\?)x)*(?P<type>f16|f32|f64|[su]?i(?:8|16|32|64))>$")


def _metadata(module: Path) -> list[str] | None:
    """iree-dump-module's metadata listing of the module, or None when it cannot be read;
    remembered by the module's content (every run of the same module reads it once)."""
    try:
        dump = toolchain.iree_dump_module()
    except PyreeError:
        return None
    return facts.remembered("module-metadata", [module], functools.partial(_dump_metadata, dump, module), depends_on=[facts.tool_identity(dump.path)])


def _dump_metadata(dump: toolchain.Tool, module: Path) -> list[str] | None:
    with echo.muted_commands():  # an inspection, not a step a pasted -v transcript needs
        listing = processes.spawn(dump.command("--output=metadata", module), what="reading the module's functions", check=False, timeout=60)
    return listing.stdout.splitlines() if listing.returncode == 0 else None


def exported_functions(module: Path) -> list[str] | None:
    """The functions a caller can name with --function (not IREE's own `__init`), or None
    when the module cannot be read."""
    lines = _metadata(module)
    if lines is None:
        return None
    names, in_exports = [], False
    for line in lines:
        if not line.startswith(" "):  # a section heading
            in_exports = line.startswith("Exported Functions")
            continue
        m = _EXPORT_LINE.match(line) if in_exports else None
        if m and not m["name"].startswith("__"):
            names.append(m["name"])
    return names


def function_parameters(module: Path, function: str) -> list[str] | None:
    """The declared parameter types of an exported function (`f32`, `tensor<4xf32>`), or None
    when the module or its declaration cannot be read."""
    lines = _metadata(module) or []
    for i, line in enumerate(lines):
        m = _EXPORT_LINE.match(line)
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if m and m["name"] == function and "iree.abi.declaration:" in following:
            return declared_parameters(following.split("iree.abi.declaration:", 1)[1])
    return None


def function_results(module: Path, function: str) -> tuple[int, list[str]] | None:
    """(number of results, their declared types) of an exported function, read with
    iree-dump-module; None when it cannot tell (the run then reports its own error)."""
    lines = _metadata(module)
    if lines is None:
        return None
    for i, line in enumerate(lines):
        m = _EXPORT_LINE.match(line)
        if not m or m["name"] != function:
            continue
        count = len([r for r in m["results"].split(",") if r.strip()])
        declared: list[str] = []
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if "iree.abi.declaration:" in following and ") -> " in following:
            tail = following.rsplit(") -> ", 1)[1].strip()
            declared = [d["type"].strip() for d in _DECLARED_RESULT.finditer(tail)]
        return count, declared
    return None


def _count_of(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _nested_values(values: Sequence[object], offset: int, dims: list[int], is_float: bool) -> str:
    """`[1 2][3 4]`: the flat `values` from `offset` bracketed by the shape `dims`."""
    if len(dims) <= 1:
        return " ".join(_format_value(v, is_float) for v in values[offset : offset + (dims[0] if dims else 1)])
    step = _count_of(dims[1:])
    return "".join(f"[{_nested_values(values, offset + k * step, dims[1:], is_float)}]" for k in range(dims[0]))


def _nested_array(a: numpy.ndarray, is_float: bool) -> str:
    if a.ndim <= 1:
        return " ".join(_format_value(v, is_float) for v in a.reshape(-1))
    return "".join(f"[{_nested_array(sub, is_float)}]" for sub in a)


def _format_value(value: Any, float_type: bool) -> str:
    return "%G" % float(value) if float_type else "%d" % int(value)  # noqa: UP031 - C's %G, as the runtime prints


# .npy element codes this module reads without numpy: little-endian or single-byte ints and floats.
_NPY_CODES = {
    "<f2": ("e", "f16"), "<f4": ("f", "f32"), "<f8": ("d", "f64"),
    "|i1": ("b", "i8"), "<i2": ("h", "i16"), "<i4": ("i", "i32"), "<i8": ("q", "i64"),
    "|u1": ("B", "ui8"), "<u2": ("H", "ui16"), "<u4": ("I", "ui32"), "<u8": ("Q", "ui64"),
}  # fmt: skip
_NPY_HEADER = re.compile(r"^\{'descr': '(?P<descr>[<>|=][a-z]\d+)', 'fortran_order': False, 'shape': \((?P<shape>[\d, ]*)\), \}\s*$")


def npy_text(index: int, data: bytes, declared: str) -> str | None:
    """format_result for a .npy file's bytes, without numpy: None when the file is not the plain
    C-order little-endian array iree-run-module writes (then numpy reads it)."""
    if data[:6] != b"\x93NUMPY" or data[6] not in (1, 2, 3):
        return None
    size_len = 2 if data[6] == 1 else 4
    (header_len,) = struct.unpack_from("<H" if size_len == 2 else "<I", data, 8)
    start = 8 + size_len + header_len
    m = _NPY_HEADER.match(data[8 + size_len : start].decode("latin-1"))
    if not m or m["descr"] not in _NPY_CODES:
        return None
    code, own_type = _NPY_CODES[m["descr"]]
    shape = [int(d) for d in m["shape"].replace(" ", "").split(",") if d]
    count = _count_of(shape)
    if len(data) - start != count * struct.calcsize(code):
        return None
    values = struct.unpack_from(f"<{count}{code}", data, start)
    etype = NPY_TENSOR.match(declared)["type"]  # type: ignore[index]
    if _NPY_CODES_OF_TYPE.get(etype) != m["descr"]:  # the declaration can differ (f64 demoted to f32)
        etype = own_type
    is_float = code in "efd"
    if not shape:
        return f"result[{index}]: hal.buffer_view\n{etype}={_format_value(values[0], is_float)}\n"
    body = "x".join(map(str, shape)) + f"x{etype}=" + _nested_values(values, 0, shape, is_float)
    return f"result[{index}]: hal.buffer_view\n{body}\n"


_NPY_CODES_OF_TYPE = {
    "f16": "<f2", "f32": "<f4", "f64": "<f8", "i8": "|i1", "si8": "|i1", "ui8": "|u1",
    "i16": "<i2", "si16": "<i2", "ui16": "<u2", "i32": "<i4", "si32": "<i4", "ui32": "<u4",
    "i64": "<i8", "si64": "<i8", "ui64": "<u8",
}  # fmt: skip


def load_npy(data: bytes) -> numpy.ndarray:
    return np.load(io.BytesIO(data))


def format_result(index: int, array: numpy.ndarray, declared: str) -> str:
    """A result as iree-run-module prints it (`result[0]: hal.buffer_view` then `4xf32=1 2 3 4`),
    every element shown: the text that --expect and --check-file see."""
    etype = NPY_TENSOR.match(declared)["type"]  # type: ignore[index]
    if checks.numpy_dtype(etype) != array.dtype.type:  # the declaration can differ (f64 demoted to f32)
        kind = {"f": "f", "i": "i", "u": "ui", "b": "i"}[array.dtype.kind]
        etype = f"{kind}{array.dtype.itemsize * 8}"
    is_float = bool(np.issubdtype(array.dtype, np.floating))
    if array.ndim == 0:
        body = f"{etype}={_format_value(array.item(), is_float)}"
    else:
        body = "x".join(map(str, array.shape)) + f"x{etype}=" + _nested_array(array, is_float)
    return f"result[{index}]: hal.buffer_view\n{body}\n"


def result_text(index: int, data: bytes, declared: str) -> str:
    """A result read from a `.npy` file's bytes, as iree-run-module prints it."""
    text = npy_text(index, data, declared)
    return text if text is not None else format_result(index, load_npy(data), declared)
