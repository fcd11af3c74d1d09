"""ONNX -> MLIR through the compiler wheel's own importer (`iree-import-onnx`), then each
top-level node op named by its ONNX node (an MLIR name location), then checked by IREE's
own input conversion (`iree-compile --compile-to=input`), so an op IREE cannot lower is
named here, by its node, and not later in a compile.

The importer creates every node's op under `Location.name(node.name)` but prints without
locations; the names are put back on the printed ops by aligning them, in order, with the
graph's nodes (initializers come first, then `torch.constant.none`, then one op per node).
Where that alignment is not certain (an op with regions, an op the alignment does not
know), the file is left without names rather than guessed at.

A location is what tells one node's ops from another's (op groups are formed by it), so no
two nodes share one: a model's names are data and may repeat, by accident or on purpose.
Where several nodes carry one name, each one's location adds its index in the graph as the
name's child (`loc("n"("onnx graph.node":3:0))`: graph.node[3]), a form no name alone can
take; an unnamed node keeps the location of its line in the file.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pyree_build.actions import parameters
from pyree_build.cache.local import cached_action
from pyree_build.core import echo, escape, lazy, processes, toolchain
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.outputs import check_ours, check_outputs, record_ours
from pyree_build.core.records import record
from pyree_build.models.ir import limits, program, weights

if TYPE_CHECKING:
    import onnx as onnx_types

onnx = lazy.module("onnx")

PathLike = str | os.PathLike[str]

_FUNC = re.compile(r'^  func\.func (?:public )?@(?P<name>"(?:[^"\\]|\\.)*"|[\w.$-]+)\(')
_NONE = re.compile(r"^    %[\w.$-]+ = torch\.constant\.none\s*$")
_RESULTS = r"(?:%[\w.$-]+(?::\d+)? = )?"
_OPERATOR = re.compile(rf'^    {_RESULTS}torch\.operator "onnx\.(?P<op>[^"]+)"\(.* : .*[^{{(\s]\s*$')
_CALL = re.compile(rf"^    {_RESULTS}(?:func\.)?call @(?P<callee>[\w.$-]+)\(")
_GLOBAL_LOAD = re.compile(rf"^    {_RESULTS}util\.global\.load ")
_FROM_BUILTIN = re.compile(rf"^    {_RESULTS}torch_c\.from_builtin_tensor ")
_RETURN = re.compile(r"^    (?:func\.)?return\b")
_DIAGNOSTIC = re.compile(r'^(?:<unknown>:0|(?P<file>[^\n]*?):(?P<line>\d+):\d+): error: (?:loc\("(?P<loc>(?:[^"\\]|\\.)*)"\): )?(?P<message>.*)$', re.M)
_ONNX_OP = re.compile(r'name = "onnx\.(?P<op>[^"]+)"')

INSTALL_ONNX = toolchain.INSTALL_ONNX

# The oldest default-domain opset imported as it is. IREE 3.13's ONNX lowering is written for
# the current ops (e.g. an opset-9 MaxPool cannot be lowered, its opset-17 form can), so an
# older model is raised to this opset with onnx's version converter first.
MIN_OPSET = 17


@record(frozen=True)
class NodeOp:
    """An ONNX node and the line (0-based) of the op the importer made for it."""

    name: str
    op_type: str
    line: int
    index: int  # in graph.node


def load_model(path: PathLike, role: str = "ONNX model") -> onnx_types.ModelProto:
    """The model's protobuf without its external data; a file that is not an ONNX model, or
    a missing `onnx`, is a PyreeError naming the file."""
    src = require_file(path, role)
    try:
        model = onnx.load_model(str(src), load_external_data=False)
    except ImportError:
        raise PyreeError("the onnx package is not installed", file=src, fix=INSTALL_ONNX) from None
    except Exception as exc:  # protobuf's DecodeError and whatever else a foreign file makes onnx raise
        raise PyreeError(f"not an ONNX model: it does not parse as an ONNX ModelProto ({type(exc).__name__})", file=src, fix=_NOT_ONNX_FIX) from None
    if not model.HasField("graph") or model.ir_version <= 0 or not model.opset_import or not (model.graph.node or model.graph.output):
        raise PyreeError("not an ONNX model: it has no graph, IR version or opset", file=src, fix=_NOT_ONNX_FIX)
    return model


_NOT_ONNX_FIX = "pass the .onnx file itself (torch.onnx.export writes one); an .mlir file is already imported: compile it"


def _line_kind(line: str) -> tuple[str, str]:
    """What a top-level line of the graph's function is: (kind, detail)."""
    for kind, pattern in (("op", _OPERATOR), ("call", _CALL)):
        m = pattern.match(line)
        if m:
            return kind, m.group(1)
    if _GLOBAL_LOAD.match(line):
        return "global", ""
    if _FROM_BUILTIN.match(line):
        return "builtin", ""
    if _RETURN.match(line):
        return "return", ""
    return "unknown", line.strip()[:80]


def _body(lines: Sequence[str]) -> tuple[int, int] | str:
    """(first line after `torch.constant.none`, the function's closing line), or why not found."""
    starts = [i for i, line in enumerate(lines) if _FUNC.match(line)]
    if len(starts) != 1:
        return f"{len(starts)} public functions, expected the graph's one"
    end = next((i for i in range(starts[0] + 1, len(lines)) if lines[i] == "  }"), None)
    none = next((i for i in range(starts[0] + 1, end or 0) if _NONE.match(lines[i])), None)
    if end is None or none is None:
        return "the graph's function has no torch.constant.none line, which separates initializers from nodes"
    return none + 1, end


def _is_inline_constant(node: onnx_types.NodeProto) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx") and any(a.name == "value" for a in node.attribute)


def align_nodes(lines: Sequence[str], graph: onnx_types.GraphProto) -> list[NodeOp] | str:
    """Each node with its op's line, in graph order, or why the alignment is not certain."""
    found = _body(lines)
    if isinstance(found, str):
        return found
    kinds = [(i, *_line_kind(lines[i])) for i in range(*found) if lines[i].strip()]
    aligned, k = [], 0
    for index, node in enumerate(graph.node):
        if k >= len(kinds):
            return f"node '{node.name}' ({node.op_type}) has no op left to match"
        i, kind, detail = kinds[k]
        if _is_inline_constant(node) and kind == "global" and k + 1 < len(kinds) and kinds[k + 1][1] == "builtin":
            k += 2  # a large constant the importer externalized: a load, no op of the node's own
            continue
        if not ((kind == "op" and detail == node.op_type) or (kind == "call" and node.op_type in detail)):
            return f"node '{node.name}' ({node.op_type}) meets {kind} {detail!r} on line {i + 1}"
        aligned.append(NodeOp(node.name, node.op_type, i, index))
        k += 1
    if [kind for _, kind, _ in kinds[k:]] != ["return"]:
        return f"{len(kinds) - k} lines left after the last node, expected only the return"
    return aligned


# The "file" of the child location that tells apart nodes of one name; its line is the node's
# index in graph.node. No file: a diagnostic at it names a node, not a line of a file.
NODE_INDEX_FILE = "onnx graph.node"


def node_location(node: NodeOp, repeated: bool) -> str:
    """The MLIR location of the node's op: its name, with its index in the graph where the name
    is repeated in it; "" for an unnamed node, whose op keeps its line's location (each line is
    one node's)."""
    if not node.name:
        return ""
    name = escape.mlir_string(node.name)
    return f'loc("{name}"("{NODE_INDEX_FILE}":{node.index}:0))' if repeated else f'loc("{name}")'


def name_locations(text: str, graph: onnx_types.GraphProto) -> tuple[str, list[NodeOp]] | str:
    """The importer's output with each node's location (node_location) on its op, or why it is
    left as it is."""
    lines = text.split("\n")
    aligned = align_nodes(lines, graph)
    if isinstance(aligned, str):
        return aligned
    counts = collections.Counter(node.name for node in graph.node)
    for node in aligned:
        location = node_location(node, counts[node.name] > 1)
        if location:
            lines[node.line] = lines[node.line].rstrip() + " " + location
    return "\n".join(lines), aligned


def default_opset(model: onnx_types.ModelProto) -> int | None:
    """The model's opset of the default ONNX domain (None when it imports none)."""
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def upgrade_opset(model: onnx_types.ModelProto, source: Path) -> tuple[onnx_types.ModelProto | None, str]:
    """(the model raised to MIN_OPSET, a note for the user) for an older model that onnx's
    version converter can raise; (None, the converter's reason) when it cannot; (None, "")
    for a model recent enough."""
    current = default_opset(model)
    if current is None or current >= MIN_OPSET:
        return None, ""
    try:
        converted = onnx.version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:  # the converter raises its own (C++) error types for ops it cannot convert
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, (
            f"note: {source}: opset {current} is older than {MIN_OPSET} and onnx's version converter cannot raise it ({reason}); "
            f"importing it as it is (if IREE cannot lower an op, re-export the model at opset {MIN_OPSET} or newer)"
        )
    return converted, (
        f"note: {source}: opset {current} is older than {MIN_OPSET}, whose ops IREE lowers: converted to opset {MIN_OPSET} with "
        f"onnx's version converter before the import (pass --opset-version N to choose another)"
    )


def _import_failure(output: str) -> str | None:
    """The importer's own message (the last lines of its traceback), without the traceback."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    if not any(line.startswith("Traceback") for line in lines):
        return None
    tail = [line for line in lines if not line.startswith((" ", "Traceback", "During handling", "The above exception"))]
    return "\n".join(tail[-3:]) or None


def _node_of(diagnostic: re.Match[str], nodes: Sequence[NodeOp]) -> NodeOp | None:
    if diagnostic["loc"] is not None:
        return next((n for n in nodes if escape.mlir_string(n.name) == diagnostic["loc"]), None)
    if diagnostic["file"] == NODE_INDEX_FILE:
        return next((n for n in nodes if n.index == int(diagnostic["line"])), None)
    if diagnostic["line"] is not None:
        return next((n for n in nodes if n.line + 1 == int(diagnostic["line"])), None)
    return None


def unsupported_node_error(output: str, source: Path, nodes: Sequence[NodeOp]) -> PyreeError | None:
    """The first error of IREE's input conversion as an error naming the ONNX node it is about."""
    diagnostics = list(_DIAGNOSTIC.finditer(output))
    for diagnostic in diagnostics:
        node = _node_of(diagnostic, nodes)
        op = _ONNX_OP.search(diagnostic["message"])
        if node is None and op is None:
            continue
        name = f"'{node.name}'" if node is not None and node.name else "(unnamed)"
        op_type = node.op_type if node is not None else op["op"] if op else "?"
        if node is not None and (not node.name or sum(n.name == node.name for n in nodes) > 1):
            op_type += f", graph.node[{node.index}]"  # the name alone does not say which node
        return PyreeError(
            f"ONNX node {name} ({op_type}) cannot be lowered by IREE {toolchain.iree_compile().version}",
            file=source,
            details="\n".join(d.group(0) for d in diagnostics[:5]),
            fix=f"replace {op_type} in the model with ops IREE supports (e.g. export it with another opset, or decompose it), "
            "or remove that node; custom-domain ops need their own lowering",
        )
    return None


# The form of the locations the import writes, keyed: the cache does not key pyree_build's own
# code, and an import from before repeated names got their node's index would merge nodes.
_LOCATIONS = "locations=name,index-where-repeated"
# The importer runs on the model without its weights' bytes (models/ir/weights.py).
_WEIGHTS = "weights=by-range"
# Likewise the form of its parameter globals (an older import's #stream form is not imported by compile).
_PARAMETERS = f"parameters=flow,scope={parameters.SCOPE},threshold={parameters.PARAM_ELEMENTS_THRESHOLD}"


@record
class ImportJob:
    source: Path
    model: onnx_types.ModelProto
    flags: list[str]
    weights: list[weights.Weight] | None  # the weights `model` holds by reference (None: it holds them all)
    hang_hint: str
    output: Path | None = None  # the program's final path: the check's view names it, not the private one


def _run_importer(job: ImportJob, model: Path, out: Path, flags: Sequence[str]) -> None:
    with echo.Stopwatch(f"iree-import-onnx {job.source.name} -> {out.name}"):
        processes.spawn(
            toolchain.onnx_importer().command(model, "-o", out, *flags),
            what="iree-import-onnx",
            file=job.source,
            explain=_import_failure,
            fix="the importer could not read the model; check it with onnx.checker.check_model, or re-export it",
            hang_hint=job.hang_hint,
        )


_PARAMETER_FLAGS = ["--externalize-params", "--params-scope", parameters.SCOPE, "--num-elements-threshold", str(parameters.PARAM_ELEMENTS_THRESHOLD)]


def _import_weightless(job: ImportJob, private: list[Path]) -> str:
    """The importer on the model without its weights' bytes, then the archive written from
    where those bytes lie (models/ir/weights.py); the program's text."""
    assert job.weights is not None
    with tempfile.TemporaryDirectory(prefix="pyree-import.") as scratch:
        model = Path(scratch) / "weightless.onnx"
        model.write_bytes(job.model.SerializeToString())
        # --large-model: shapes inferred from the file, and no weight loaded (it skips the
        # checker, which would look for the weights' file; the model was checked as it was read).
        _run_importer(job, model, private[0], ["--large-model", *_PARAMETER_FLAGS, "--no-save-params"])
    imported = private[0].read_text(encoding="utf-8")
    keys = weights.program_keys(imported, job.weights)
    if isinstance(keys, str):  # never seen: the importer made its globals otherwise than weights.py reads it
        if echo.VERBOSITY >= 1:
            echo.log_step(f"note: {job.source}: {keys}; importing the whole file instead")
        return _import_whole(job, private)
    imported, kept = weights.inline_doubles(imported, job.weights)
    if kept:
        echo.log_step(
            f"note: {job.source}: {kept[0]}{f' and {len(kept) - 1} more' if len(kept) > 1 else ''} is double: kept in the MLIR, not the archive "
            "(IREE 3.13 demotes a program's f64 to f32, and would read the archive's f64 bytes as f32)"
        )
    archived = [(key, w) for key, w in zip(keys, job.weights) if w.data_type != weights.DOUBLE]
    with echo.Stopwatch(f"writing {len(archived)} weights to {private[1].name}"):
        weights.write_archive([w for _, w in archived], [key for key, _ in archived], private[1])
    return imported


def _import_whole(job: ImportJob, private: list[Path]) -> str:
    params = ["--save-params-to", str(private[1]), *_PARAMETER_FLAGS] if len(private) > 1 else []
    _run_importer(job, job.source, private[0], [*job.flags, *params])
    return private[0].read_text(encoding="utf-8")


def _import_into(job: ImportJob, private: list[Path]) -> list[str]:
    """The importer into private paths, the node names, then IREE's input conversion as a check."""
    out = private[0]
    externalize = len(private) > 1
    imported = _import_weightless(job, private) if job.weights is not None else _import_whole(job, private)
    text = parameters.flow_form(imported) if externalize else imported  # the form compile imports back
    named = name_locations(text, job.model.graph)
    nodes: list[NodeOp] = []
    if isinstance(named, str):
        if echo.VERBOSITY >= 2:
            echo.log_step(f"note: {job.source}: ops left without ONNX node names: the alignment is not certain ({named})")
    else:
        text, nodes = named
    if text != imported:
        out.write_text(text, encoding="utf-8")
    check_lowering(job.source, out, nodes, hang_hint=job.hang_hint, named_as=job.output)
    return []


def check_lowering(source: Path, imported: Path, nodes: Sequence[NodeOp], *, hang_hint: str | None = None, named_as: Path | None = None) -> None:
    """IREE's input conversion of the imported file, once: an op it cannot lower is named by
    node. The compile is the one `ops` reads the program through (program.view_command), and
    its output is kept for it: a model's input conversion runs once from import to replace."""
    with tempfile.TemporaryDirectory(prefix="pyree-check.") as scratch:
        view = Path(scratch) / "view.mlir"
        argv = program.view_command(imported, view)
        with echo.Stopwatch(f"iree-compile --compile-to={program.SPEC_PHASE} {imported.name} (check)"):
            result = processes.spawn(
                argv, what="iree-compile (input conversion of the imported model)", file=source, check=False,
                crash_hint="iree-compile crashed converting the imported model: most likely an ONNX op whose lowering is broken in this IREE release",
                hang_hint=hang_hint,
            )  # fmt: skip
        if result.returncode == 0:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                text = view.read_text(encoding="utf-8")
                if named_as is not None:  # an op of an unnamed node is located by its line: in the file the user gets
                    text = text.replace(f'loc("{escape.mlir_string(str(imported))}":', f'loc("{escape.mlir_string(str(named_as))}":')
                program.remember_view(imported, text)
    if result.returncode != 0:
        output = result.stderr + result.stdout
        raise unsupported_node_error(output, source, nodes) or PyreeError(
            f"iree-compile (input conversion of the imported model) failed (exit code {result.returncode})",
            file=source,
            details=output or "(the tool printed nothing)",
            command=argv,
            fix="the model uses something IREE cannot convert; see the error above",
        )


def _at_opset(proto: onnx_types.ModelProto, src: Path, opset_version: int | None, *, converted_here: bool) -> tuple[onnx_types.ModelProto, int | None]:
    """The model at the opset it is imported at, and that opset (None: its own). An older model
    is raised to MIN_OPSET with a note; `converted_here`: a model the importer gets without
    its weights is converted here to a chosen opset (the importer cannot convert it then)."""
    if opset_version is None:
        converted, note = upgrade_opset(proto, src)
        if note:
            echo.log_step(note)
        if converted is not None:  # the importer converts the same way; its ops are the converted model's nodes
            return converted, MIN_OPSET
    elif converted_here and opset_version > (default_opset(proto) or 0):  # only upward, as the importer does
        return onnx.version_converter.convert_version(proto, opset_version), opset_version
    return proto, opset_version


def import_onnx(
    model: PathLike,
    output: PathLike,
    *,
    opset_version: int | None = None,
    data_dir: PathLike | None = None,
    externalize_params: bool = True,
    depfile: PathLike | None = None,
    timeout: float | None = None,
    force: bool = False,
) -> Path:
    """Import an ONNX model to MLIR (torch dialect, as iree-compile takes it).

    The compiler wheel's `iree-import-onnx` does the import; then every top-level node op
    gets its ONNX node name as its location (`loc("fc1")`), which iree-compile keeps on the
    ops it lowers from it (`--mlir-print-debuginfo`); then IREE's input conversion runs once,
    so an op it cannot lower is a PyreeError naming the node. `opset_version` upgrades the
    model first; without it a model older than opset MIN_OPSET (17) is raised to it with onnx's
    version converter, and a note says so; `data_dir` is where external data lives (default: the model's directory).
    `externalize_params` (the default) keeps each weight of 100 elements or more out of the MLIR, in
    `<output stem>_params.irpa` beside it (scope `model`; written even where no weight is that large, then empty): at
    model size weights printed as text cost minutes to write and to parse at each later step. The program's globals
    name them (`#flow.parameter.named<"model"::"W1">`) and `compile` imports every one of them back into the module,
    so the .vmfb holds them all; keep the archive beside the MLIR. False keeps every weight inline (`--inline-params`).
    `timeout`: the seconds the import's tools may take in all (default: limits.time_limit's,
    beyond any real model's; a model IREE loops on is stopped by it, and nothing is written).
    An output that exists and that pyree_build did not write, or that was edited since, is
    refused unless `force`: a model's import never replaces the user's own file.
    """
    src = require_file(model, "ONNX model")
    weights_dir = Path(data_dir) if data_dir is not None else src.parent
    if externalize_params:
        weightless = weights.load(src, weights_dir, parameters.PARAM_ELEMENTS_THRESHOLD)
        weights.check(weightless, src)
        proto, data = weightless.model, weightless.data_files
    else:
        proto = load_model(src)
        data = weights.external_data_files(proto, src, weights_dir)
    seconds = limits.time_limit(timeout, [src, *data])
    out = Path(output)
    finals = [out, parameters.archive_for(out)] if externalize_params else [out]
    outs = check_outputs(finals, [src, *data], depfile=depfile)
    check_ours(outs, force=force, verb="import")
    proto, opset_version = _at_opset(proto, src, opset_version, converted_here=externalize_params)
    flags = [*(["--opset-version", str(opset_version)] if opset_version is not None else []), *(["--data-dir", str(data_dir)] if data_dir is not None else [])]
    job = ImportJob(src, proto, flags, weightless.weights if externalize_params else None, limits.hang_hint(proto), outs[0])
    onnx_version = toolchain._dist_version("onnx") or "unknown"
    with processes.time_limit(seconds):
        cached_action(
            "import", key=[*flags, f"externalize={externalize_params}", f"onnx={onnx_version}", _WEIGHTS, _LOCATIONS, _PARAMETERS], inputs=[src, *data], outputs=outs,
            build=functools.partial(_import_into, job), tools_used=[toolchain.onnx_importer(), toolchain.iree_compile()], depfile=depfile,
        )  # fmt: skip
    record_ours(outs)
    return outs[0]
