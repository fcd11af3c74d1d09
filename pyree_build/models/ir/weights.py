"""An ONNX model's large weights located, not loaded: the model as the importer needs it is its
graph and each weight's shape and type, never the weights' bytes.

`import` used to hand the whole file to iree-import-onnx, which parses it, checks it, infers
its shapes (each a copy of every weight through protobuf), converts every weight to numpy and
writes the archive from those copies: VGG-19's 575 MB of weights took 6 s there, iree-compile
of the imported program 2.3 s. Here the file is read at the protobuf wire level (a scan of the
model's outline that steps over every weight's bytes) and rewritten without the bytes of each
weight the importer externalizes; the importer runs on that small model, and the archive is
written from the byte ranges of the original file, copied once (`write_archive`). Its bytes are
those iree-import-onnx's own archive holds (a test compares them).

Which weights: the ones iree-import-onnx externalizes, in the order it makes their globals:
every initializer of the main graph with at least `threshold` elements (in the order of
`graph.initializer`, one per name), then every `Constant` node of the main graph whose `value`
has that many, in node order. Of those, a weight whose bytes are `raw_data` in the model file or
external data in a file of its own is a byte range of that file; one held in a typed field
(`float_data`...) is converted by onnx, as the importer does. Nothing in the model becomes code:
names are matched as data, and a model the scan cannot read is refused as not ONNX.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pyree_build.core import lazy, readers, toolchain
from pyree_build.core.errors import PyreeError
from pyree_build.core.records import record

if TYPE_CHECKING:
    import onnx as onnx_types

onnx = lazy.module("onnx")

# Protobuf field numbers of the messages walked (onnx.proto3).
_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INITIALIZER = 1, 5
_NODE_OP_TYPE, _NODE_ATTRIBUTE, _NODE_DOMAIN = 4, 5, 7
_ATTRIBUTE_NAME, _ATTRIBUTE_TENSOR = 1, 5
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_NAME, _TENSOR_RAW_DATA, _TENSOR_DATA_LOCATION = 1, 2, 8, 9, 14
_LENGTH_DELIMITED = 2
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
DOUBLE = 11  # TensorProto.DataType.DOUBLE: kept in the MLIR (inline_doubles)

# Bytes per element of the types whose raw_data is a plain little-endian array (onnx.proto3);
# a type not listed keeps its bytes in the model (onnx converts them, as the importer does).
_ELEMENT_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2, 17: 1, 18: 1, 19: 1, 20: 1}


@record(frozen=True)
class Weight:
    """One externalized weight: its shape and type, and where its bytes are: `length` bytes at
    `offset` of `file`, or `data` when they are not a range of a file."""

    what: str  # for messages: "initializer 'W'" or "Constant node 'c'"
    dims: tuple[int, ...]
    data_type: int
    file: Path | None
    offset: int
    length: int
    data: bytes | None = None


@record
class Weightless:
    """The model without the bytes of its externalized weights (each marked as external data at
    the place it lives), and those weights in the order the importer makes their globals."""

    model: onnx_types.ModelProto
    weights: list[Weight]
    data_files: list[Path]  # the external data files the model names (the model file itself not among them)


class _NotWire(Exception):
    """The bytes are not a protobuf message this scan can step through."""


def _varint(buf: mmap.mmap | bytes, i: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= end or shift > 63:
            raise _NotWire
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | 0x80 if value else low)
        if not value:
            return bytes(out)


@record(frozen=True)
class _Field:
    number: int
    wire_type: int
    start: int  # of the field's key
    body: int  # of its value (after the length, for a length-delimited field)
    end: int


def _fields(buf: mmap.mmap | bytes, start: int, end: int) -> Iterator[_Field]:
    i = start
    while i < end:
        key, j = _varint(buf, i, end)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, k = _varint(buf, j, end)
            field = _Field(number, wire_type, i, j, k)
        elif wire_type == 1 or wire_type == 5:
            field = _Field(number, wire_type, i, j, j + (8 if wire_type == 1 else 4))
        elif wire_type == _LENGTH_DELIMITED:
            length, k = _varint(buf, j, end)
            field = _Field(number, wire_type, i, k, k + length)
        else:  # groups (3, 4) are not in onnx.proto; anything else is not protobuf
            raise _NotWire
        if number == 0 or field.end > end:
            raise _NotWire
        yield field
        i = field.end


def _message(number: int, body: bytes) -> bytes:
    return _encode_varint(number << 3 | _LENGTH_DELIMITED) + _encode_varint(len(body)) + body


@record
class _Scan:
    buf: mmap.mmap
    source: Path
    threshold: int
    initializers: dict[str, tuple[int, Weight | None]]  # name -> (position, its weight if stripped)
    constants: list[Weight | None]


def _dims(buf: mmap.mmap, field: _Field) -> list[int]:
    if field.wire_type == 0:
        return [_varint(buf, field.body, field.end)[0]]
    dims, i = [], field.body
    while i < field.end:
        value, i = _varint(buf, i, field.end)
        dims.append(value)
    return dims


def _tensor(scan: _Scan, field: _Field, what: str) -> tuple[bytes, Weight | None, int]:
    """(the tensor's bytes as the weightless model holds them, its Weight when its raw_data
    moves out, its element count)."""
    buf = scan.buf
    dims: list[int] = []
    data_type, name, raw, external = 0, "", None, False
    for f in _fields(buf, field.body, field.end):
        if f.number == _TENSOR_DIMS:
            dims += _dims(buf, f)
        elif f.number == _TENSOR_DATA_TYPE and f.wire_type == 0:
            data_type = _varint(buf, f.body, f.end)[0]
        elif f.number == _TENSOR_NAME and f.wire_type == _LENGTH_DELIMITED:
            name = bytes(buf[f.body : f.end]).decode("utf-8", "replace")
        elif f.number == _TENSOR_RAW_DATA and f.wire_type == _LENGTH_DELIMITED:
            raw = f
        elif f.number == _TENSOR_DATA_LOCATION and f.wire_type == 0:
            external = _varint(buf, f.body, f.end)[0] == _EXTERNAL
    count = math.prod(dims)
    size = _ELEMENT_BYTES.get(data_type)
    if raw is None or external or count < scan.threshold or size is None or raw.end - raw.body != count * size:
        return bytes(buf[field.start : field.end]), None, count
    # The tensor without its raw_data: every other field as it was, in its order.
    kept = b"".join(bytes(buf[f.start : f.end]) for f in _fields(buf, field.body, field.end) if f.start != raw.start)
    weight = Weight(what.format(name=name), tuple(dims), data_type, scan.source, raw.body, raw.end - raw.body)
    return _message(field.number, kept), weight, count


def _constant_node(scan: _Scan, field: _Field) -> bytes:
    """A node of the main graph: a `Constant` whose `value` is large loses that value's bytes."""
    buf = scan.buf
    parts = list(_fields(buf, field.body, field.end))
    op_type = next((bytes(buf[f.body : f.end]) for f in parts if f.number == _NODE_OP_TYPE), b"")
    domain = next((bytes(buf[f.body : f.end]) for f in parts if f.number == _NODE_DOMAIN), b"")
    if op_type != b"Constant" or domain not in (b"", b"ai.onnx"):
        return bytes(buf[field.start : field.end])
    out, weight = [], None
    for f in parts:
        if f.number != _NODE_ATTRIBUTE or f.wire_type != _LENGTH_DELIMITED:
            out.append(bytes(buf[f.start : f.end]))
            continue
        attribute = list(_fields(buf, f.body, f.end))
        name = next((bytes(buf[a.body : a.end]) for a in attribute if a.number == _ATTRIBUTE_NAME), b"")
        tensor = next((a for a in attribute if a.number == _ATTRIBUTE_TENSOR and a.wire_type == _LENGTH_DELIMITED), None)
        if name != b"value" or tensor is None:
            out.append(bytes(buf[f.start : f.end]))
            continue
        rewritten, weight, count = _tensor(scan, tensor, "Constant node's value '{name}'")
        body = b"".join(rewritten if a is tensor else bytes(buf[a.start : a.end]) for a in attribute)
        out.append(_message(_NODE_ATTRIBUTE, body))
        scan.constants.append(_externalized(weight, count, scan.threshold))
    return _message(_GRAPH_NODE, b"".join(out))


# A weight the importer externalizes whose bytes stay in the model (a typed field, external data).
_KEPT = Weight("", (), 0, None, 0, 0)


def _externalized(stripped: Weight | None, count: int, threshold: int) -> Weight | None:
    """What the importer makes of a tensor: a global from the stripped bytes, a global from bytes
    left in the model (_KEPT), or an inline constant (None)."""
    return stripped if stripped is not None else _KEPT if count >= threshold else None


def _graph(scan: _Scan, field: _Field) -> bytes:
    out = []
    for f in _fields(scan.buf, field.body, field.end):
        if f.number == _GRAPH_INITIALIZER and f.wire_type == _LENGTH_DELIMITED:
            rewritten, weight, count = _tensor(scan, f, "initializer '{name}'")
            out.append(rewritten)
            name = _tensor_name(rewritten)
            position = scan.initializers[name][0] if name in scan.initializers else len(scan.initializers)
            scan.initializers[name] = (position, _externalized(weight, count, scan.threshold))
        elif f.number == _GRAPH_NODE and f.wire_type == _LENGTH_DELIMITED:
            out.append(_constant_node(scan, f))
        else:
            out.append(bytes(scan.buf[f.start : f.end]))
    return _message(_MODEL_GRAPH, b"".join(out))


def _tensor_name(message: bytes) -> str:
    _, body = _varint(message, 0, len(message))
    _, body = _varint(message, body, len(message))
    for f in _fields(message, body, len(message)):
        if f.number == _TENSOR_NAME and f.wire_type == _LENGTH_DELIMITED:
            return message[f.body : f.end].decode("utf-8", "replace")
    return ""


def _weightless_bytes(path: Path, threshold: int) -> tuple[bytes, _Scan]:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise _NotWire
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            scan = _Scan(buf, path, threshold, {}, [])
            out = [
                _graph(scan, top) if top.number == _MODEL_GRAPH and top.wire_type == _LENGTH_DELIMITED else bytes(buf[top.start : top.end])
                for top in _fields(buf, 0, size)
            ]
            scan.buf = None  # type: ignore[assignment]  # the map closes here
            return b"".join(out), scan


def _tensors_in_order(model: onnx_types.ModelProto, threshold: int) -> list[tuple[str, onnx_types.TensorProto]]:
    """(what, tensor) of each weight the importer externalizes, in the order it makes them."""
    by_name: dict[str, onnx_types.TensorProto] = {}
    for tensor in model.graph.initializer:
        by_name[tensor.name] = tensor
    found = [(f"initializer '{name}'", t) for name, t in by_name.items() if math.prod(t.dims) >= threshold]
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            value = next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)
            if value is not None and math.prod(value.dims) >= threshold:
                found.append((f"Constant node's value '{value.name}'", value))
    return found


def _external_range(tensor: onnx_types.TensorProto, data_dir: Path, what: str, source: Path) -> Weight:
    entries = {e.key: e.value for e in tensor.external_data}
    file = data_dir / entries.get("location", "")
    try:
        offset = int(entries.get("offset", "0"))
        length = int(entries["length"]) if "length" in entries else os.stat(file).st_size - offset
        available = os.stat(file).st_size
    except (ValueError, OSError) as exc:
        raise PyreeError(
            f"the external data of {what} cannot be read: {exc}",
            file=source,
            fix="check the model's external data (onnx.load with load_external_data=True reads it)",
        ) from None
    if offset < 0 or length < 0 or offset + length > available:
        raise PyreeError(
            f"the external data of {what} lies outside {file.name}: {length} bytes at offset {offset} of a {available}-byte file",
            file=source,
            fix="the model and its data file do not belong together: save them again with onnx.save(..., save_as_external_data=True)",
        )
    return Weight(what, tuple(tensor.dims), tensor.data_type, file, offset, length)


def load(path: Path, data_dir: Path, threshold: int) -> Weightless:
    """The model at `path` without the bytes of each weight of `threshold` elements or more that
    the importer externalizes. A model whose outline the scan cannot read is refused as not
    ONNX, as onnx.load refuses it; its external data (under `data_dir`) stays where it is,
    except that of small tensors, which the importer reads and which is loaded here."""
    try:
        data, scan = _weightless_bytes(path, threshold)
        model = onnx.load_model_from_string(data)
    except ImportError:
        raise PyreeError("the onnx package is not installed", file=path, fix=toolchain.INSTALL_ONNX) from None
    except (_NotWire, Exception):  # the same refusal as onnx.load's of a file that is not a model
        raise PyreeError(
            "not an ONNX model: it does not parse as an ONNX ModelProto",
            file=path,
            fix="pass the .onnx file itself (torch.onnx.export writes one); an .mlir file is already imported: compile it",
        ) from None
    data_files = external_data_files(model, path, data_dir)  # before the weights are marked as external data
    ordered = [w for _, w in sorted(scan.initializers.values(), key=lambda p: p[0]) if w is not None] + [w for w in scan.constants if w is not None]
    tensors = _tensors_in_order(model, threshold)
    if len(tensors) != len(ordered):  # the scan and onnx read the model differently: trust onnx
        ordered = [_KEPT] * len(tensors)
    weights = []
    for (what, tensor), found in zip(tensors, ordered):
        if found is not _KEPT:
            _mark_external(tensor, found, data_dir)
            weights.append(found)
        elif onnx.external_data_helper.uses_external_data(tensor):
            weights.append(_external_range(tensor, data_dir, what, path))
        else:
            array = onnx.numpy_helper.to_array(tensor)
            weights.append(Weight(what, tuple(tensor.dims), tensor.data_type, None, 0, array.nbytes, array.tobytes()))
    _load_small_external(model, data_dir, {id(t) for _, t in tensors})
    return Weightless(model, weights, data_files)


def external_data_files(model: onnx_types.ModelProto, source: Path, data_dir: Path) -> list[Path]:
    """The files the model's externally stored tensors live in, each checked to exist."""
    files: dict[Path, str] = {}
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if onnx.external_data_helper.uses_external_data(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            files.setdefault(data_dir / location, tensor.name)
    for path, tensor in files.items():
        what = readers.problem(path)
        if what is not None:
            raise PyreeError(
                f"external data file of tensor '{tensor}' not found (looked for {path})"
                if what == "not found"
                else f"external data file of tensor '{tensor}' is {what}, not a regular file ({path})",
                file=source,
                fix="put the data file beside the model (onnx.save(..., save_as_external_data=True) writes it there), or pass --data-dir DIR",
            )
    return list(files)


def _mark_external(tensor: onnx_types.TensorProto, weight: Weight, data_dir: Path) -> None:
    """Say in the tensor where its bytes are (they are in the model file), so that the
    weightless model is still a true ONNX model."""
    assert weight.file is not None
    location = os.path.relpath(weight.file, data_dir) if weight.file.is_relative_to(data_dir) else os.fspath(weight.file)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(weight.offset)), ("length", str(weight.length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _load_small_external(model: onnx_types.ModelProto, data_dir: Path, externalized: set[int]) -> None:
    helper = onnx.external_data_helper
    for tensor in helper._get_all_tensors(model):
        if id(tensor) not in externalized and helper.uses_external_data(tensor):
            helper.load_external_data_for_tensor(tensor, os.fspath(data_dir))
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]


# IREE's parameter archive (iree/schemas/parameter_archive.h, version 0.0), as its own writer lays
# it out: the header, the entry table (each entry 16-byte aligned), the names, then the data,
# each entry at a 64-byte boundary, the file padded to 4 KiB.
_IRPA_MAGIC = 0x41505249  # "IRPA"
_IRPA_HEADER_BYTES = 88
_IRPA_ENTRY_BYTES = 76  # a data entry: the entry header and its storage range
_IRPA_DATA = 2  # the entry type of data stored in the archive
_IRPA_DATA_ALIGNMENT = 64
_IRPA_FILE_ALIGNMENT = 4096


def _aligned(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _irpa_layout(keys: Sequence[bytes], lengths: Sequence[int]) -> tuple[bytes, list[int], int]:
    """(the archive's bytes up to its data, each entry's file offset, the file's size)."""
    count = len(keys)
    entries_at = _aligned(_IRPA_HEADER_BYTES, 16)
    entries_length = (_aligned(_IRPA_ENTRY_BYTES, 16) * (count - 1) + _IRPA_ENTRY_BYTES) if count else 0
    names_at = entries_at + entries_length
    names = b"".join(keys)
    data_at = _aligned(names_at + len(names), _IRPA_DATA_ALIGNMENT) if count else names_at + len(names)
    offsets, end = [], 0
    for length in lengths:
        offsets.append(_aligned(end, _IRPA_DATA_ALIGNMENT))
        end = offsets[-1] + length
    head = bytearray(struct.pack("<IHHQQQQ", _IRPA_MAGIC, 0, 0, _IRPA_HEADER_BYTES, 0, 0, count))
    head += struct.pack("<QQQQQQ", entries_at, entries_length, names_at, len(names), data_at, end)
    head += bytes(entries_at - len(head))
    name_at = 0
    for k, (key, length, offset) in enumerate(zip(keys, lengths, offsets)):
        head += struct.pack("<QIQQQQQQQQ", _IRPA_ENTRY_BYTES, _IRPA_DATA, 0, name_at, len(key), 0, 0, _IRPA_DATA_ALIGNMENT, offset, length)
        head += bytes(_aligned(_IRPA_ENTRY_BYTES, 16) - _IRPA_ENTRY_BYTES if k < count - 1 else 0)
        name_at += len(key)
    head += names + bytes(data_at - names_at - len(names))
    return bytes(head), [data_at + o for o in offsets], _aligned(data_at + end, _IRPA_FILE_ALIGNMENT)


def write_archive(weights: Sequence[Weight], keys: Sequence[str], archive: Path) -> None:
    """The parameter archive holding each weight under its key (the program's parameter names,
    in the same order): the bytes IREE's own writer makes, each weight copied once from where it
    lies, in the kernel (copy_file_range), not through this process."""
    head, offsets, size = _irpa_layout([k.encode("utf-8", "surrogateescape") for k in keys], [w.length for w in weights])
    sources: dict[Path, int] = {}
    out = os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.pwrite(out, head, 0)
        for weight, at in zip(weights, offsets, strict=True):
            if weight.data is not None:
                os.pwrite(out, weight.data, at)
                continue
            assert weight.file is not None
            if weight.file not in sources:
                sources[weight.file] = os.open(weight.file, os.O_RDONLY)
            _copy_range(sources[weight.file], weight.offset, out, at, weight.length, weight.what)
        os.ftruncate(out, size)
    finally:
        os.close(out)
        for fd in sources.values():
            os.close(fd)


def _copy_range(source: int, offset: int, out: int, at: int, length: int, what: str) -> None:
    done = 0
    while done < length:
        try:
            n = os.copy_file_range(source, out, length - done, offset + done, at + done)
        except OSError:  # a filesystem pair the kernel cannot copy between: through this process
            n = os.pwrite(out, os.pread(source, min(length - done, 1 << 24), offset + done), at + done)
        if n == 0:
            raise PyreeError(f"the bytes of {what} end before its length: the model file was cut short while it was read", fix="import the model again")
        done += n


# A global the importer makes for an externalized weight, in the form it prints it (IREE 3.13).
_PARAMETER_GLOBAL = re.compile(
    r'^\s*util\.global private @(?:"(?:[^"\\]|\\.)*"|\S+) = #stream\.parameter\.named<"(?:[^"\\]|\\.)*"::"(?P<key>(?:[^"\\]|\\.)*)"> : tensor<(?P<type>[^>]*)>$',
    re.MULTILINE,
)


def _unescape(text: str) -> str:
    """An MLIR string literal's body as the string it stands for (`\\\\` and `\\XX` escapes)."""
    if "\\" not in text:
        return text
    out, i, raw = bytearray(), 0, text.encode("utf-8")
    while i < len(raw):
        if raw[i] == 0x5C and raw[i + 1 : i + 2] == b"\\":
            out.append(0x5C)
            i += 2
        elif raw[i] == 0x5C and re.fullmatch(rb"[0-9A-Fa-f]{2}", raw[i + 1 : i + 3]):
            out.append(int(raw[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(raw[i])
            i += 1
    return out.decode("utf-8", "surrogateescape")


def program_keys(text: str, weights: Sequence[Weight]) -> list[str] | str:
    """The parameter key of each weight in the importer's output (`text`), in order; or why its
    globals do not line up with `weights` (count or shape)."""
    found = list(_PARAMETER_GLOBAL.finditer(text))
    if len(found) != len(weights):
        return f"the importer made {len(found)} parameter globals for {len(weights)} weights"
    keys = []
    for match, weight in zip(found, weights):
        dims = tuple(int(d) for d in match["type"].split("x")[:-1]) if "x" in match["type"] else ()
        if dims != weight.dims:
            return f"the parameter global of {weight.what} is tensor<{match['type']}>, the weight's shape is {list(weight.dims)}"
        keys.append(_unescape(match["key"]))
    return keys


def check(weightless: Weightless, source: Path) -> None:
    """onnx's checker on the model, as iree-import-onnx runs it on a model it reads whole: a
    model it refuses is a PyreeError with the checker's reason. It checks a copy in which each
    tensor held by reference is an empty tensor of its type (the checker would look for the
    referenced bytes in the current directory; `load` located them and checked their size)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(weightless.model)
    for tensor in _referenced(copy):
        del tensor.dims[:]
        tensor.dims.append(0)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    try:
        onnx.checker.check_model(copy)
    except Exception as exc:  # the checker's ValidationError (a C++ type) and what else it raises
        reason = str(exc).strip() or type(exc).__name__
        raise PyreeError(
            f"the model does not pass onnx's checker: {reason}",
            file=source,
            fix="correct the model so that onnx.checker.check_model accepts it, or re-export it",
        ) from None


def _referenced(model: onnx_types.ModelProto) -> Iterator[onnx_types.TensorProto]:
    """The tensors whose bytes are not in the model: those `load` left where they lie, and the
    model's own external data (its files were checked to exist)."""
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if tensor.data_location == _EXTERNAL:
            yield tensor


def _bytes_of(weight: Weight) -> bytes:
    if weight.data is not None:
        return weight.data
    assert weight.file is not None
    with open(weight.file, "rb") as f:
        f.seek(weight.offset)
        return f.read(weight.length)


def inline_doubles(text: str, weights: Sequence[Weight]) -> tuple[str, list[str]]:
    """The importer's output with each double weight's global holding its value (`dense<"0x...">`)
    instead of naming a parameter, and what those weights are. IREE 3.13 demotes f64 to f32 and
    converts a global's value with it, but reads a parameter's bytes as they are: f64 bytes
    read as f32 values."""
    found = list(_PARAMETER_GLOBAL.finditer(text))
    doubles = [(m, w) for m, w in zip(found, weights) if w.data_type == DOUBLE]
    if not doubles:
        return text, []
    pieces, last = [], 0
    for match, weight in doubles:
        start, end = match.span()
        line = text[start:end]
        value = line.index("#stream.parameter.named<")
        head = line[:value]
        pieces += [text[last:start], f'{head}dense<"0x{_bytes_of(weight).hex().upper()}"> : tensor<{match["type"]}>']
        last = end
    pieces.append(text[last:])
    return "".join(pieces), [w.what for _, w in doubles]
