"""A function's arguments as a runner takes them.

IREE passes a scalar parameter (`%a: f32`) by value, not as a buffer: iree.runtime wants a
Python number of the parameter's kind (a float for f32, an int for i32; a numpy scalar or a
0-d array is refused, and an int given for an f32 is reinterpreted bit for bit), and
iree-run-module wants a bare number (`--input 2`, not `f32=2`). The function's declaration
says which parameters are scalars, so a value is converted by what its parameter is.
"""

from __future__ import annotations

import re
from typing import Any

from pyree_build.core.errors import PyreeError

_SCALAR_TYPE = re.compile(r"^(?:[su]?i\d+|f\d+|bf16|index)$")
_PARAMETER = re.compile(r"%input\d+:\s*(?P<type>.+?)(?=,\s*%input\d+:|$)")
# A scalar input spec with its type, as tensors are written (`f32=2`).
_TYPED_SCALAR = re.compile(r"^\s*(?P<type>[a-z]+\d*)=(?P<value>[-+.\w]+)\s*$")


def declared_parameters(declaration: str) -> list[str]:
    """The parameter types of an `iree.abi.declaration` (`sync func @f(%input0: f32, ...) -> (...)`)."""
    head = declaration.split(") -> ", 1)[0]
    inside = head.split("(", 1)[1] if "(" in head else ""
    return [m["type"].strip() for m in _PARAMETER.finditer(inside)]


def is_scalar(declared: str | None) -> bool:
    return bool(declared) and bool(_SCALAR_TYPE.match(declared or ""))


def is_typed_scalar_spec(value: object) -> bool:
    """`f32=2`: the form of a tensor spec without a shape, which iree-run-module refuses for a scalar."""
    return isinstance(value, str) and bool(_TYPED_SCALAR.match(value))


def scalar(value: object, declared: str, position: int) -> float | int:
    """`value` for the scalar parameter `declared` (input number `position`), as a Python number."""
    if isinstance(value, str):
        typed = _TYPED_SCALAR.match(value)
        text = typed["value"] if typed else value.strip()
        try:
            number: Any = float(text) if declared.startswith(("f", "bf")) else int(float(text))
        except ValueError:
            raise PyreeError(
                f"input {position} is for a scalar parameter ({declared}); '{value}' is not a number", fix=f"pass a number: 2, or '{declared}=2'"
            ) from None
    elif isinstance(value, bool) or not (isinstance(value, (int, float)) or getattr(value, "shape", None) == ()):
        raise PyreeError(
            f"input {position} is for a scalar parameter ({declared}), got {type(value).__name__} {getattr(value, 'shape', '')}".rstrip(),
            fix="pass a number (a Python float or int, a numpy scalar or a 0-d array)",
        )
    else:
        number = value.item() if hasattr(value, "item") else value
    return float(number) if declared.startswith(("f", "bf")) else int(number)
