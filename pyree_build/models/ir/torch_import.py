"""A PyTorch program -> MLIR through iree-turbine's `aot.export` (the FX importer), each op named
by the module it came from.

`torch.export` records, for every node of the graph, the stack of modules it was traced in
(`nn_module_stack`). The FX importer gives each op the location of the node's stack trace,
which names Python files, not modules; here each op gets instead the innermost module's path
(`fc1`, `blocks.0.attn`), or the node's own name for an op of the top module (`add`), with the
node's index in the graph as its child (`loc("fc1"("torch graph.node":7:0))`), so no two nodes
share a location (op groups are told apart by it) and `ops` shows the names as `source:`.
The names are only ever MLIR location strings, built by the MLIR API, never text spliced into
the program. Then IREE's input conversion runs once, as for an ONNX import.

Weights stay in the program (`dense_resource` blobs of the MLIR file), as aot.export writes them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyree_build.core import echo, lazy, processes
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.files import prepare_output_dir, write_atomic
from pyree_build.core.outputs import check_ours, check_outputs, record_ours
from pyree_build.models.ir import importer, limits

torch = lazy.module("torch")
aot = lazy.module("iree.turbine.aot")
fx_importer = lazy.module("iree.compiler.extras.fx_importer")
ir = lazy.module("iree.compiler.ir")

PathLike = str | os.PathLike[str]
NODE_INDEX_FILE = "torch graph.node"
INSTALL_TORCH = 'pip install "pyree_build[torch]" and torch (pip install torch, or the build your platform needs: pytorch.org)'


def _turbine() -> Any:
    """iree-turbine's aot, imported (torch first: turbine's own error would name torch less clearly)."""
    try:
        torch.__version__  # noqa: B018 - the first read imports the module
        aot.export  # noqa: B018
    except ImportError as exc:
        raise PyreeError(f"importing a torch program needs torch and iree-turbine ({exc})", fix=INSTALL_TORCH) from None
    bridge_bindings()
    return aot


# The MLIR binding classes iree-turbine asks `X.isinstance(value)`: IREE 3.13's bindings dropped
# that static method for Python's isinstance; turbine (3.9, its newest release) still calls it
# where it converts a custom op's types.
_ASKED = ("IntegerType", "RankedTensorType", "F16Type", "F32Type", "F64Type", "IndexType", "OpResult", "BlockArgument")


def bridge_bindings() -> None:
    for name in _ASKED:
        cls = getattr(ir, name, None)
        if cls is not None and not hasattr(cls, "isinstance"):
            cls.isinstance = staticmethod(lambda value, cls=cls: isinstance(value, cls))


def node_names(program: Any) -> dict[Any, tuple[str, int]]:
    """Each call node of the exported graph: (the innermost module's path, or the node's name for
    an op of the top module; its index in the graph)."""
    names = {}
    for index, node in enumerate(program.graph.nodes):
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        path = str(stack[-1][0]) if stack and stack[-1] and stack[-1][0] else ""
        names[node] = (path or str(node.name), index)
    return names


@contextlib.contextmanager
def _named_locations(names: Mapping[Any, tuple[str, int]]) -> Iterator[None]:
    """The FX importer's node locations, while it runs, as the nodes' module names."""
    original = fx_importer.ContextCache.get_node_location

    def location(self: Any, node: Any) -> Any:
        if node not in names:
            return original(self, node)
        name, index = names[node]
        child = fx_importer.Location.file(NODE_INDEX_FILE, index, 0, context=self._c)
        return fx_importer.Location.name(name, childLoc=child, context=self._c)

    fx_importer.ContextCache.get_node_location = location
    try:
        yield
    finally:
        fx_importer.ContextCache.get_node_location = original


def export_program(model: Any, example_args: Sequence[Any] = (), *, dynamic_shapes: Any = None) -> Any:
    """`model` as a torch.export.ExportedProgram (one already exported is taken as it is)."""
    if isinstance(model, torch.export.ExportedProgram):
        return model
    if not isinstance(model, torch.nn.Module):
        raise PyreeError(
            f"import_torch takes a torch.nn.Module or a torch.export.ExportedProgram, not {type(model).__name__}",
            fix="pass the model (and example_args), or torch.export.export(model, args)",
        )
    args = tuple(example_args) if isinstance(example_args, (list, tuple)) else (example_args,)
    try:
        return torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
    except Exception as exc:  # torch.export raises many error types: each says what it could not trace
        raise PyreeError(
            f"torch.export could not export {type(model).__name__}", details=str(exc), fix="make the module exportable (see torch.export's message above)"
        ) from None


def mlir_text(program: Any, source: Path | None = None) -> str:
    """The program as MLIR (torch dialect), each op located by its module's name."""
    aot = _turbine()
    with _named_locations(node_names(program)):
        try:
            output = aot.export(program)
        except Exception as exc:  # the FX importer raises what it raises for an op or value it cannot import
            raise PyreeError(
                "iree-turbine's aot.export could not import the program",
                file=source,
                details=f"{type(exc).__name__}: {exc}",
                fix="rewrite the construct it names in the model (a tuple-valued op such as unbind: index the tensor instead), "
                "or export to ONNX (torch.onnx.export) and import that",
            ) from None
        return str(output.mlir_module.operation.get_asm(enable_debug_info=True))


def import_torch(
    model: Any, example_args: Sequence[Any] = (), *, output: PathLike, dynamic_shapes: Any = None, source: PathLike | None = None, force: bool = False
) -> Path:
    """Import a torch model (an nn.Module with `example_args`, or an ExportedProgram) to MLIR.

    `dynamic_shapes` is torch.export's (`{"x": {0: torch.export.Dim("batch")}}`): those sizes
    are dynamic (`?`) in the program. `source`: the file the program came from (a .pt2), named
    by errors. An output pyree_build did not write is refused unless `force`."""
    _turbine()
    out = Path(output)
    inputs = [Path(source)] if source is not None else []
    (out,) = check_outputs([out], inputs)
    check_ours([out], force=force, verb="import")
    program = export_program(model, example_args, dynamic_shapes=dynamic_shapes)
    named = Path(source) if source is not None else out
    with echo.Stopwatch(f"iree-turbine aot.export -> {out.name}"):
        text = mlir_text(program, Path(source) if source is not None else None)
    with tempfile.TemporaryDirectory(prefix="pyree-torch.") as scratch:
        staged = Path(scratch) / out.name
        staged.write_text(text, encoding="utf-8")
        with processes.time_limit(limits.time_limit(None, inputs or [staged])):
            importer.check_lowering(named, staged, [], named_as=out)
        prepare_output_dir(out.parent)
        write_atomic(out, text)
    record_ours([out])
    return out


# What torch.export.load unpickles with Python's full unpickler (which runs code): payloads saved
# with use_pickle, custom and opaque objects, and any file torch.load reads that fails its safe
# (weights_only) load, since torch then tries again without it.
_OBJECT_PREFIXES = ("custom_obj_", "opaque_obj_")


def _safe_load_error(data: bytes) -> str | None:
    """Why `data` is not a plain torch.load file of tensors (None: it is)."""
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # the safe unpickler refuses with its own error types; nothing ran
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def check_archive(source: Path) -> None:
    """Refuse a .pt2 that torch.export.load would unpickle with the full unpickler: a model is
    data, and such a file could run code as it is read. Plain tensors, the graph's JSON and
    sample inputs that load under torch.load(weights_only=True) pass."""
    try:
        archive = zipfile.ZipFile(source)
    except (OSError, zipfile.BadZipFile) as exc:
        raise PyreeError("this file is not a .pt2 archive (a zip)", file=source, details=str(exc), fix=_SAVE_FIX) from None
    with archive:
        for name in archive.namelist():
            why = _unsafe_entry(archive, name)
            if why:
                raise PyreeError(
                    f"the archive's {name} {why}, which torch.export.load would unpickle with Python's full unpickler: "
                    "reading it could run code, so pyree_build does not load it",
                    file=source,
                    fix="export the program again from code you trust (torch.export.save of tensors and graph only); load it yourself "
                    "with torch.export.load if you trust its author, and pass the program to pb.import_torch",
                )


def _unsafe_entry(archive: zipfile.ZipFile, name: str) -> str | None:
    parts = name.split("/")
    if name.endswith("_config.json") and len(parts) >= 3 and parts[-2] in ("weights", "constants"):
        config = json.loads(archive.read(name)).get("config", {})
        for fqn, payload in config.items():
            path_name = str(payload.get("path_name", ""))
            if path_name.startswith(_OBJECT_PREFIXES):
                return f"holds a pickled Python object ({fqn})"
            if payload.get("use_pickle"):
                entry = "/".join([*parts[:-1], path_name])
                why = _safe_load_error(archive.read(entry)) if entry in archive.namelist() else "names no payload"
                if why:
                    return f"holds {fqn} as a pickle that is not plain tensors ({why})"
    elif name.endswith(".pt"):  # sample inputs and legacy weights or constants: torch.load files
        why = _safe_load_error(archive.read(name))
        if why:
            return f"is a pickle that is not plain tensors ({why})"
    return None


_SAVE_FIX = "save the program with torch.export.save(torch.export.export(model, args), 'model.pt2')"


def load_program(path: PathLike) -> Any:
    """A program saved with torch.export.save (a .pt2 archive), checked first (check_archive)."""
    source = require_file(path, "exported torch program")
    _turbine()
    check_archive(source)
    try:
        return torch.export.load(str(source))
    except Exception as exc:  # torch.export.load raises what its readers raise for a damaged or foreign file
        raise PyreeError(
            "torch.export.load cannot read this file as an exported program",
            file=source,
            details=str(exc),
            fix=_SAVE_FIX,
        ) from None


def import_pt2(model: PathLike, output: PathLike, *, force: bool = False) -> Path:
    """`pyree-build import model.pt2`: a program saved with torch.export.save, imported."""
    source = require_file(model, "exported torch program")
    return import_torch(load_program(source), output=output, source=source, force=force)
