"""How long a tool the model path starts on a model's behalf may run (the ONNX importer,
iree-compile's input conversion for `import`, `ops` and `replace`).

A model comes from a hub, and IREE's ONNX lowering loops without end on some attribute values
ONNX does not define (a Pad whose mode is "bogus": iree-compile spins at 100% CPU forever), so
no model verb may wait on a tool unbounded. The default is far beyond what a real model takes
(DenseNet-121's input conversion takes seconds, its whole compile ~21 s), grown with the size
of what the tool reads, so that only a hang meets it; `--timeout` sets another.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pyree_build.core import escape
from pyree_build.core.errors import PyreeError

if TYPE_CHECKING:
    import onnx as onnx_types

PathLike = str | os.PathLike[str]

DEFAULT_S = 600.0
# Added per MB of model, external data or program read: a 14 GB model gets about an hour more.
PER_MB_S = 0.25
# How many distinct suspects a timeout names: enough to point at the cause, short enough to read.
_MAX_SUSPECTS = 6
_STRING = 3  # onnx.AttributeProto.STRING, without loading onnx for a constant


def time_limit(timeout: float | None, files: Iterable[PathLike]) -> float:
    """`timeout` if given (a positive number of seconds), else the default for these inputs."""
    if timeout is not None:
        if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0 and timeout != float("inf")):
            raise PyreeError(f"--timeout must be a positive number of seconds, got {timeout!r}", fix="pass e.g. --timeout 600, or leave it out for the default")
        return float(timeout)
    size = 0
    for path in files:
        try:
            size += os.stat(path).st_size
        except (OSError, TypeError, ValueError):  # a missing or malformed path is reported by the step that reads it
            continue
    return DEFAULT_S + PER_MB_S * size / 1e6


def hang_hint(model: onnx_types.ModelProto | None) -> str:
    """What a timed-out tool working on a model most likely looped on, for its error."""
    why = (
        "IREE's ONNX lowering loops without end on some attribute values ONNX does not define (e.g. a Pad "
        "whose mode is not constant, reflect, edge or wrap); onnx.checker.check_model does not check those "
        "values, onnxruntime.InferenceSession(MODEL) refuses an unknown one"
    )
    suspects = _string_attributes(model) if model is not None else []
    if suspects:
        why += "\nsuspect attributes (check each against the ONNX operator docs): " + ", ".join(suspects)
    return why + "\na large model may need more time: pass --timeout SECONDS"


def _string_attributes(model: onnx_types.ModelProto) -> list[str]:
    """The distinct string attributes of the graph's nodes (op type, name, value: where an
    enumeration is given a value the tools do not know), each with the first node that has it."""
    seen: dict[tuple[str, str, bytes], str] = {}
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.type == _STRING:
                seen.setdefault((node.op_type, attribute.name, attribute.s), node.name)
    shown = []
    for (op_type, name, value), node in list(seen.items())[:_MAX_SUSPECTS]:
        text = value.decode("utf-8", "replace")
        text = text if len(text) <= 40 else text[:37] + "..."
        # One line each, whatever the model's names hold (the details keep their line breaks).
        shown.append(escape.name(f"{op_type} {name}='{text}'") + (f" (node '{escape.name(node)}')" if node else ""))
    if len(seen) > _MAX_SUSPECTS:
        shown.append(f"and {len(seen) - _MAX_SUSPECTS} more")
    return shown
