"""Constants a linalg body captures from outside it, made part of the body so matchers compare them.

ONNX's Relu imports as a body `arith.cmpf ugt, %in, %cst` + `arith.select ..., %cst` whose `%cst`
(0.0) is defined at the top of the function; norms capture their epsilon, GELU its 0.5. IREE's
DAG matcher (`transform.iree.match.cast_compatible_dag_from_root`) compares bodies through the
values it reached via operands only: a captured value is never reached, so such a body cannot
be compared at all (only matched by name, which would accept a clamp at 0.5 as a relu).

The spec therefore begins by rewriting the program: every scalar constant at the top of a
function that a linalg body uses is cloned into that body, one clone right before each op that
uses it (`transform.structured.fuse_into_containing_op`, whose fallback for an op that cannot be
tiled is exactly this clone-before-use). Then the matcher, cloned from the program rewritten the
same way here (`sink`), carries the constant inside the body, and IREE compares its value like
any other attribute: a spec made for relu(0.0) cannot match a clamp at 0.5. The rewrite changes
no value (IREE's canonicalizer hoists the clones back later).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyree_build.core import lazy

ir = lazy.module("iree.compiler.ir")

_FUNCTIONS = ("util.func", "func.func")


# The linalg ops whose body is written out, so may use a value from outside it; a named op's
# body (matmul, conv, fill) is built from its definition and never does. Trying only these
# keeps the spec's first step to a fraction of the (op, constant) pairs on a CNN.
BODY_OPS = ("linalg.generic", "linalg.map", "linalg.reduce")


def _linalg_ops(operation: Any) -> list[Any]:
    """The BODY_OPS nested in `operation`, in pre-order (the order `transform.structured.match`
    lists them)."""
    return [op for op in nested_ops(operation) if op.name in BODY_OPS]


def nested_ops(operation: Any) -> list[Any]:
    """The ops inside `operation`'s regions, at any depth, in pre-order (an op, then what
    is inside it, then its next sibling: the order `transform.structured.match` lists them).
    A walk with its own stack of iterators, so no nesting depth meets Python's recursion limit."""
    found: list[Any] = []
    stack: list[Iterator[Any]] = [_children(operation)]
    while stack:
        op = next(stack[-1], None)
        if op is None:
            stack.pop()
            continue
        found.append(op)
        stack.append(_children(op))
    return found


def _children(operation: Any) -> Iterator[Any]:
    return (op.operation for region in operation.regions for block in region.blocks for op in block.operations)


def _top_constants(function: Any) -> list[Any]:
    """Scalar arith.constant ops directly in the function's body (tensor constants are
    weights: inputs of a replacement, never cloned)."""
    found = []
    for op in function.regions[0].blocks[0].operations:
        op = op.operation
        if op.name == "arith.constant" and not isinstance(op.results[0].type, ir.ShapedType):
            found.append(op)
    return found


def sink(module: Any) -> None:
    """Rewrite `module` in place as the spec's first step rewrites the program: for each linalg
    op with a written-out body (BODY_OPS, program order), for each scalar constant at the top
    of its function (program order) that its body uses, a clone of the constant before each op
    of the body that uses it.
    An op that also takes the constant as a direct operand is left as it is (IREE's fusion
    refuses that pair)."""
    for function in module.body.operations:
        function = function.operation
        if function.name not in _FUNCTIONS or not len(function.regions) or not len(function.regions[0].blocks):
            continue
        # The spec clones type by type (sorted), each type's constants in program order.
        constants = sorted(_top_constants(function), key=lambda c: str(c.results[0].type))
        # Each constant's uses, found once, by the linalg op they sit in (at any depth): asking
        # the whole use list per op made a model with one shared constant quadratic.
        uses = [_uses_by_op(constant) for constant in constants]
        for op in _linalg_ops(function):
            for constant, (direct, inside) in zip(constants, uses):
                if op not in direct:
                    _clone_into(constant, inside.get(op, []))


def _uses_by_op(constant: Any) -> tuple[set[Any], dict[Any, list[Any]]]:
    """The ops taking `constant` as an operand, and for each op, the ops inside it that use
    it (in use-list order, once per use)."""
    direct: set[Any] = set()
    inside: dict[Any, list[Any]] = {}
    for use in constant.results[0].uses:
        user = use.owner.operation
        direct.add(user)
        parent = user.parent
        while parent is not None:
            inside.setdefault(parent, []).append(user)
            parent = parent.parent
    return direct, inside


def _clone_into(constant: Any, users: list[Any]) -> None:
    """A clone of `constant` before each use by `users` that still reads it (an op around
    these may have taken them already)."""
    value = constant.results[0]
    for user in users:
        operands = user.operands
        for i in range(len(operands)):
            if operands[i] == value:
                clone = constant.clone(ip=ir.InsertionPoint(user))
                operands[i] = clone.results[0]
                break


def constant_values(op: Any) -> list[str]:
    """The scalar constants inside a BODY_OPS op's body, as their attributes print
    (`0.000000e+00 : f32`): what `sink` may have cloned into it, each found by value in the program."""
    if op.name not in BODY_OPS:
        return []
    found: dict[str, None] = {}
    for inner in nested_ops(op):
        if inner.name == "arith.constant" and not isinstance(inner.results[0].type, ir.ShapedType):
            found[str(inner.attributes["value"])] = None
    return list(found)


def types_in(ops: list[Any]) -> list[str]:
    """The scalar types of the constants inside these ops' bodies: the types the spec's
    rewrite must clone for these ops' matchers to see what `sink` made of them."""
    found: dict[str, None] = {}
    for op in ops:
        for inner in nested_ops(op):
            if inner.name == "arith.constant" and not isinstance(inner.results[0].type, ir.ShapedType):
                found[str(inner.results[0].type)] = None
    return list(found)


def spec_lines(types: list[str]) -> list[str]:
    """The spec's first step, for constants of these types, in every util.func: the same
    rewrite as `sink`. Each clone is a separate fuse (each consumes its constant's handle), tried
    under failures(suppress): a constant that an op's body does not use is simply skipped."""
    if not types:
        return []
    names = ", ".join(f'"{n}"' for n in BODY_OPS)
    lines = [
        "// First, each scalar constant a linalg body uses from outside it is cloned into that body",
        "// (before each use), so the matchers below compare its value: see captures.py in pyree_build.",
        "transform.foreach %fns : !transform.any_op {",
        "  ^bb0(%fn: !transform.any_op):",
        f"    %linalg = transform.structured.match ops{{[{names}]}} in %fn : (!transform.any_op) -> !transform.any_op",
        "    transform.foreach %linalg : !transform.any_op {",
        "      ^bb1(%op: !transform.any_op):",
    ]
    for k, type_ in enumerate(sorted(types)):
        lines += [
            f'        %consts{k} = transform.structured.match ops{{["arith.constant"]}} filter_result_type = {type_} in %fn : (!transform.any_op) -> !transform.any_op',
            f"        transform.foreach %consts{k} : !transform.any_op {{",
            "          ^bb2(%c: !transform.any_op):",
            "            transform.sequence %c : !transform.any_op failures(suppress) {",
            "              ^bb3(%constant: !transform.any_op):",
            "                %parent = transform.get_parent_op %constant : (!transform.any_op) -> !transform.any_op",
            '                transform.match.operation_name %parent ["util.func"] : !transform.any_op',
            "                %fused, %into = transform.structured.fuse_into_containing_op %constant into %op"
            " : (!transform.any_op, !transform.any_op) -> (!transform.any_op, !transform.any_op)",
            "            }",
            "        }",
        ]
    return [*lines, "    }", "}"]
