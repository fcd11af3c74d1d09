"""Op groups: the parts of a program a transform spec can replace, found in the IR a spec sees.

A group is built the way a reader of a model thinks of it, and the way IREE will fuse it:
1. ops that came from one source op (one ONNX node: they share its location) and are
   connected are one unit; a linalg.fill whose result only initialises another unit's op
   belongs to that unit, and so does a reshape of values from outside (a weight's
   Unsqueeze) that only that unit's ops read;
2. a unit of elementwise ops (every loop parallel) joins the group of the unit it consumes
   when it is that group's only user (a bias add and a relu after a matmul).
A group can be replaced when the DAG matcher IREE offers
(`transform.iree.match.cast_compatible_dag_from_root`) can find it: one result used
outside, every op reachable from that result's op through operands, no value captured by a
body that the walk cannot reach. What the C generator cannot express is refused later, by op.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pyree_build.models.ir import program

# Tensor ops that only reinterpret a row-major buffer: they may sit inside a group.
RESHAPES = ("tensor.expand_shape", "tensor.collapse_shape")


@dataclass
class Group:
    """One replaceable candidate: its member ops (program order) in one function."""

    index: int
    module: Any  # kept alive with the group: its ops point into it
    function: Any
    members: list[Any]
    root: Any = None
    inputs: list[Any] = field(default_factory=list)  # values from outside, in first-use order
    constants: list[Any] = field(default_factory=list)  # scalar constants the matcher repeats
    empties: list[Any] = field(default_factory=list)  # tensor.empty ops the matcher repeats
    outputs: list[Any] = field(default_factory=list)  # member results used outside
    by_name: list[Any] = field(default_factory=list)  # ops whose bodies capture a constant: matched by name
    refusal: str | None = None
    # Which ops compute from constants alone, shared by the groups of one program: asked
    # afresh per value, the walk back through the program made a deep model quadratic.
    constant: dict[Any, bool | None] = field(default_factory=dict)


def is_member(op: Any) -> bool:
    return bool(op.name.startswith("linalg.") or op.name in RESHAPES)


def _iterators_parallel(op: Any) -> bool:
    """Whether every loop of a structured op is parallel (a loop absent from the outputs'
    maps is a reduction; named ops carry their maps or are elementwise by name)."""
    if op.name in RESHAPES or op.name in ("linalg.fill", "linalg.copy", "linalg.transpose", "linalg.broadcast", "linalg.map"):
        return True
    if "iterator_types" in op.attributes:
        return all("parallel" in str(it) for it in op.attributes["iterator_types"])
    if "indexing_maps" in op.attributes:
        maps = [program.ir.AffineMapAttr(m).value for m in op.attributes["indexing_maps"]]
        outs = maps[len(maps) - len(op.results) :]
        used = {str(e) for m in outs for e in m.results}
        return all(f"d{i}" in used for i in range(maps[0].n_dims))
    return False


def _top_level(op: Any, function: Any) -> Any:
    while op.parent is not None and op.parent != function:
        op = op.parent
    return op


def _users(value: Any, function: Any) -> list[Any]:
    return [_top_level(use.owner.operation, function) for use in value.uses]


def _units(function: Any, members: list[Any]) -> list[list[Any]]:
    """Connected member ops that share a location, in program order."""
    unit_of: dict[Any, int] = {}
    units: list[list[Any]] = []
    for op in members:
        joined = None
        for operand in op.operands:
            owner = program.defining_op(operand)
            producer = owner.operation if owner is not None else None
            if producer is not None and producer in unit_of and str(producer.location) == str(op.location):
                joined = unit_of[producer]
                break
        if joined is None:
            units.append([])
            joined = len(units) - 1
        units[joined].append(op)
        unit_of[op] = joined
    return _absorb_feeders(function, units)


def _feeds_only(unit: list[Any]) -> bool:
    """A unit that computes nothing of the program's: it fills a tensor, or only reshapes
    values from outside the groups (a weight, an argument). Left a group of its own, its
    user would consume two groups and fuse with neither (a BatchNorm, then a Mul by a
    reshaped weight, stayed two kernels and two passes over the feature map)."""
    if all(op.name == "linalg.fill" for op in unit):
        return True
    return all(op.name in RESHAPES and not any(_defined_by_member(v) for v in op.operands) for op in unit)


def _defined_by_member(value: Any) -> bool:
    owner = program.defining_op(value)
    return owner is not None and is_member(owner.operation)


def _absorb_feeders(function: Any, units: list[list[Any]]) -> list[list[Any]]:
    """A unit that only feeds (_feeds_only) tensors some other unit's ops alone use joins that unit."""
    kept: list[list[Any]] = []
    pending = [u for u in units if not _feeds_only(u)]
    others = {id(u) for u in pending}
    for unit in units:
        if id(unit) not in others:
            users = {u for op in unit for r in op.results for u in _users(r, function)}
            target = next((p for p in pending if users and users <= set(p)), None)
            if target is not None:
                target.extend(unit)
                continue
        kept.append(unit)
    return [sorted(u, key=lambda op: program.op_index(op, function)) for u in kept]


def _fuse_consumers(function: Any, units: list[list[Any]], constant: dict[Any, bool | None]) -> list[list[Any]]:
    """Each elementwise unit joins the group it consumes, where it is that group's only user.
    A recomputable op's users do not count (_recomputable): each group computes its own copy,
    so the fill that same-shape convolutions share ties none of them to another. Counted, it
    kept every such convolution but the last apart from its BatchNorm."""
    groups: list[list[Any]] = []
    group_of: dict[Any, int] = {}
    # Each group's users outside it, kept as units join: one pass over the program, where
    # recomputing them per unit made a long elementwise chain quadratic (or worse).
    outside: list[set[Any]] = []
    for unit in units:
        target = None
        if all(_iterators_parallel(op) for op in unit):
            target = _sole_consumer_group(unit, group_of, outside, constant)
        if target is None:
            groups.append([])
            outside.append(set())
            target = len(groups) - 1
        groups[target].extend(unit)
        for op in unit:
            group_of[op] = target
        users = {u for op in unit if not _recomputable(op, constant) for result in op.results for u in _users(result, function)}
        outside[target] = {u for u in outside[target] | users if group_of.get(u) != target}
    return groups


def _sole_consumer_group(unit: list[Any], group_of: dict[Any, int], outside: list[set[Any]], constant: dict[Any, bool | None]) -> int | None:
    """The one group the unit reads from, if the unit is its only user. A value computed from
    constants alone (a BatchNorm's scale from its variance) is nobody's: the unit computes its
    own copy (_take_recomputable), so it does not make a second producer."""
    producers = set()
    for op in unit:
        for operand in op.operands:
            producer = program.defining_op(operand)
            if producer is not None and producer.operation in group_of and not _recomputable(producer.operation, constant):
                producers.add(group_of[producer.operation])
    if len(producers) != 1:
        return None
    (candidate,) = producers
    if not outside[candidate] <= set(unit):
        return None  # the group has another user: fusing would duplicate or split it
    return candidate


def find_groups(module: Any) -> list[Group]:
    """Every group of every function of the module, numbered from 1 in program order."""
    found: list[Group] = []
    for function in program.functions(module):
        members = [op for op in program.body_ops(function) if is_member(op)]
        described = []
        constant: dict[Any, bool | None] = {}
        for ops in _fuse_consumers(function, _units(function, members), constant):
            group = Group(index=0, module=module, function=function, members=ops, constant=constant)
            describe(group)
            described.append(group)
        # How many groups hold each op, counted once for the function (not per group).
        holders = Counter(op for g in described for op in g.members)
        found += [g for g in described if not _absorbed(g, holders)]
    for number, group in enumerate(found, 1):
        group.index = number
    return found


def _absorbed(group: Group, holders: Counter[Any]) -> bool:
    """A group computed from constants alone whose every op another group computes for itself
    (_take_recomputable): no dispatch of its own runs, replaced or not (IREE folds it while
    compiling), so it is no group of the running program. Its ops are listed in those groups."""
    if not all(_recomputable(op, group.constant) for op in group.members):
        return False
    return all(holders[op] > 1 for op in group.members)


def describe(group: Group) -> None:
    """Fill in a group's root, inputs and outputs, and why it cannot be matched if it cannot."""
    _take_recomputable(group)
    members = group.members
    group.outputs = _outside_results(group)
    if len(group.outputs) != 1:
        group.refusal = f"it has {len(group.outputs)} results used outside it; a replacement gives one result"
        return
    owner = program.defining_op(group.outputs[0])
    assert owner is not None  # a member's result
    group.root = owner.operation
    group.refusal = _several_results(group.root)
    if group.refusal:
        return
    operands = {v for member in members for v in member.operands}
    group.by_name = [op for op in members if _captures_unreachable(op, group, operands)]
    for op in group.by_name:
        captured = _captured_non_constant(op, group, operands)
        if captured is not None:
            group.refusal = (
                f"{op.name}'s body reads {captured.get_name()} ({captured.type}) from outside it, not through an operand "
                "(a gather such as tensor.extract): IREE's DAG matcher cannot reach that value, so no spec can pass it to an import"
            )
            return
    reached = _reach(group)
    missing = [op.name for op in members if op not in reached]
    if missing:
        group.refusal = f"{', '.join(missing)} cannot be reached from the result's op through operands"
        return
    used = [operand for op in members for operand in op.operands]
    group.inputs.sort(key=lambda value: next(i for i, operand in enumerate(used) if operand == value))
    if all(_constant_derived(v, group.constant) or _no_elements(v) for v in group.inputs):
        empty = next((v for v in group.inputs if _no_elements(v)), None)
        group.refusal = (
            "it computes from constants only"
            + (f" (input {empty.get_name()}, {empty.type}, has no elements: IREE makes it a constant)" if empty is not None else "")
            + ": IREE evaluates such ops while compiling (const-eval), where no import "
            "can be called (iree-compile fails with 'no executable loader registered'), and they cost nothing at run time"
        )
        return
    demoted = _demoted_edge(group.function)
    if demoted is not None:
        group.refusal = (
            f"the program's {demoted} is stored as another type than IREE computes it in (f64 demoted to f32), and with "
            "a replaced dispatch in it iree-run-module fails ('buffer view byte length ... exceeds backing buffer', "
            "seen on ONNX's f64 node tests)"
        )
        return
    folded = [v for v in group.inputs if _constant_derived(v, group.constant) and not _is_constant(v)]
    if folded:
        group.refusal = (
            f"input {folded[0].get_name()} ({folded[0].type}) is computed from constants only: IREE folds it into a global "
            "while compiling (const-eval), and a replaced dispatch cannot take such a global (iree-compile: 'failed to "
            "legalize unresolved target materialization')"
        )
        return
    _check_inputs(group)


def _outside_results(group: Group) -> list[Any]:
    """The members' results used outside the group (a recomputable op's are its own copy's)."""
    inside = set(group.members)
    own_work = not all(_recomputable(op, group.constant) for op in group.members)  # else its result is its own
    return [
        result
        for op in group.members
        for result in op.results
        if any(u not in inside for u in _users(result, group.function)) and not (own_work and _recomputable(op, group.constant))
    ]


def _several_results(root: Any) -> str | None:
    """Why a group whose last op has several results cannot be replaced. The spec's rewrite
    anchors its call on the op defining the matched result: an op of several results
    (ReduceMax/ReduceMin with keepdims=0: the extremum and its index) gives it several
    anchors, and iree-compile fails. Refused here, so `ops` and `replace` agree."""
    if len(root.results) == 1:
        return None
    types = ", ".join(str(r.type) for r in root.results)
    return (
        f"its last op ({root.name}) has {len(root.results)} results ({types}), and a spec's rewrite takes the "
        "result of an op of one (iree-compile: 'Only one op can be specified as an insertion point')"
    )


def _recomputable(op: Any, constant: dict[Any, bool | None]) -> bool:
    """An op any group may compute for itself: its values come from constants alone (a fill
    of a scalar into a tensor.empty that two same-shape ops share; a batch norm's scale from
    its variance and epsilon; a transposed weight). The replacement computes its own copy
    and the program keeps the op for its other users, so it is no result of the group."""
    if not is_member(op):
        return False
    if op.name == "linalg.fill":
        producers = [program.defining_op(v) for v in op.operands]
        if all(p is not None and _repeated_in_matcher(p.operation) for p in producers):
            return True
    return bool(op.results) and all(_constant_derived(r, constant) for r in op.results)


def _take_recomputable(group: Group) -> None:
    """Every recomputable producer of a member, transitively, becomes a member: the
    replacement computes its own copy from the constants. Passed in as a value instead, IREE
    folds it into a global while compiling (const-eval) or passes a splat, and a replaced
    dispatch takes neither (iree-compile: `failed to legalize unresolved target
    materialization`)."""
    members = set(group.members)
    pending = list(group.members)
    while pending:
        for operand in pending.pop().operands:
            producer = program.defining_op(operand)
            if producer is not None and producer.operation not in members and _recomputable(producer.operation, group.constant):
                members.add(producer.operation)
                pending.append(producer.operation)
    if len(members) != len(group.members):
        group.members = sorted(members, key=lambda op: program.op_index(op, group.function))


def _captures_unreachable(op: Any, group: Group, operands: set[Any]) -> bool:
    """Whether `op`'s body uses a value defined outside it that no operand of a member
    (`operands`) brings into the matcher (IREE's DAG matcher compares bodies only through operands)."""
    for value in program.nested_operands(op):
        producer = program.defining_op(value)
        if producer is not None and _top_level(producer.operation, group.function) != op and value not in operands:
            return True
    return False


def _captured_non_constant(op: Any, group: Group, operands: set[Any]) -> Any | None:
    """A value `op`'s body uses from outside the group's operands that is not a scalar constant."""
    for value in program.nested_operands(op):
        producer = program.defining_op(value)
        if producer is None:
            if value.owner.owner == group.function:
                return value  # an argument of the function itself
            continue  # an argument of a block inside the op
        top = _top_level(producer.operation, group.function)
        if top == op or value in operands:
            continue
        if not (producer.operation.name == "arith.constant" and not program.is_tensor(value.type)):
            return value
    return None


def _constant_derived(value: Any, seen: dict[Any, bool | None]) -> bool:
    """Whether `value` is computed from constants alone (no function argument, no imported
    buffer): what IREE's const-eval folds at compile time. A walk with its own stack: a
    model's depth is no limit (ResNet-50's chain of ops passed Python's recursion limit)."""
    owner = program.defining_op(value)
    if owner is None:
        return False
    root = owner.operation
    stack = [root]
    while stack:
        op = stack[-1]
        if op in seen and seen[op] is not None:
            stack.pop()
            continue
        if op not in seen:
            seen[op] = None  # being decided: its producers first
            if op.name.startswith(("hal.", "util.global.load", "flow.tensor.load", "iree_")):
                seen[op] = _weights(op)
                stack.pop()
                continue
        producers = []
        result = True
        for v in [*op.operands, *program.nested_operands(op)]:
            producer = program.defining_op(v)
            if producer is None:
                if v.owner.owner == _function_of(op):
                    result = False  # an argument of the function: not a constant
                continue
            known = seen.get(producer.operation)
            if known is False:
                result = False
            elif producer.operation not in seen:
                producers.append(producer.operation)
        if result and producers:
            stack.extend(producers)
            continue
        seen[op] = result  # every producer decided (SSA has no cycles)
        stack.pop()
    return bool(seen[root])


def _demoted_edge(function: Any) -> str | None:
    """An input or result of the program whose stored type differs from the tensor IREE
    computes with (hal.tensor.import/export naming another encoding), described: the
    function's, read once for all its groups."""
    return program.function_fact(function, "demoted edge", _find_demoted_edge)


def _find_demoted_edge(function: Any) -> str | None:
    for op in program.body_ops(function):
        if op.name == "hal.tensor.import" and _encoding(op, "target_encoding") not in (None, str(op.results[0].type)):
            return f"input {_encoding(op, 'target_encoding')}"
        if op.name == "hal.tensor.export" and _encoding(op, "source_encoding") not in (None, str(op.operands[0].type)):
            return f"result {_encoding(op, 'source_encoding')}"
    return None


def _encoding(op: Any, name: str) -> str | None:
    """The stored type an import or export names, if it names one."""
    if name not in op.attributes:
        return None
    return str(program.ir.TypeAttr(op.attributes[name]).value)


def _no_elements(value: Any) -> bool:
    return bool(program.is_tensor(value.type) and 0 in program.shape(value.type))


def _is_constant(value: Any) -> bool:
    """A constant the program holds (weights inline, or in a parameter archive)."""
    owner = program.defining_op(value)
    return owner is not None and (owner.operation.name == "arith.constant" or _weights(owner.operation))


def _weights(op: Any) -> bool:
    """A load of a global nothing writes (weights a parameter archive holds: `import` keeps
    large ones there): IREE's const-expr analysis takes it for a constant, as it takes one
    written inline, and hoists what is computed from it alone out of the function."""
    if op.name != "util.global.load" or "global" not in op.attributes:
        return False
    name = str(program.ir.FlatSymbolRefAttr(op.attributes["global"]).value)
    return name not in program.function_fact(_function_of(op), "mutable globals", _mutable_globals)


def _mutable_globals(function: Any) -> set[str]:
    """The globals of `function`'s module that the program may write (state, not weights)."""
    found: set[str] = set()
    for op in function.parent.regions[0].blocks[0].operations:
        op = op.operation
        if op.name == "util.global" and "is_mutable" in op.attributes:
            found.add(program.symbol_name(op))
    return found


def _function_of(op: Any) -> Any:
    while op.parent is not None and op.parent.name not in ("util.func", "func.func"):
        op = op.parent
    return op.parent


def _walk(group: Group, stops: set[Any]) -> tuple[set[Any], list[Any]]:
    """What IREE's DAG matcher visits from the root, through operands only: the members it
    reaches, and every operand value it meets, in order. It does not walk past `stops`."""
    inside = set(group.members)
    reached: set[Any] = set()
    met: list[Any] = []
    stack = [group.root]
    while stack:
        op = stack.pop()
        if op in reached:
            continue
        reached.add(op)
        if op in stops:
            continue
        for operand in op.operands:
            met.append(operand)
            owner = program.defining_op(operand)
            if owner is not None and owner.operation in inside:
                stack.append(owner.operation)
    return reached, met


def _reach(group: Group) -> set[Any]:
    """The members the matcher reaches from the root; the scalar constants and tensor.empty
    ops it meets join the matcher, any other value from outside is an input. Constants that
    by-name ops' bodies capture are not matched but are emitted in C: they join the group too."""
    reached, met = _walk(group, set())
    extra: set[Any] = set()
    for operand in met:
        owner = program.defining_op(operand)
        producer = owner.operation if owner is not None else None
        if producer is not None and producer in reached:
            continue
        if producer is not None and _repeated_in_matcher(producer):
            if producer not in extra:
                extra.add(producer)
                (group.constants if producer.name == "arith.constant" else group.empties).append(producer)
        elif operand not in group.inputs:
            group.inputs.append(operand)
    for op in group.by_name:
        for value in program.nested_operands(op):
            owner = program.defining_op(value)
            if owner is not None and owner.operation.name == "arith.constant" and owner.operation not in extra:
                extra.add(owner.operation)
                group.constants.append(owner.operation)
    return reached | extra


def _repeated_in_matcher(op: Any) -> bool:
    """Scalar constants (a fill value, a relu's zero) are matched by value; tensor.empty
    (static) by its type; a tensor constant (weights) is an input of the replacement."""
    if op.name == "arith.constant":
        return not program.is_tensor(op.results[0].type)
    return bool(op.name == "tensor.empty" and len(op.operands) == 0)


def _check_inputs(group: Group) -> None:
    for value in group.inputs:
        if not program.is_tensor(value.type):
            group.refusal = f"it takes the scalar {value.get_name()} ({value.type}) from outside; the generator passes tensors only"
            return
    _, met = _walk(group, set(group.by_name))
    lost = [v for v in group.inputs if v not in met]
    if lost:
        group.refusal = (
            f"input {lost[0].get_name()} is reached only through {group.by_name[0].name}, whose body uses a constant "
            "from outside it: IREE's DAG matcher can match that op by name only and so cannot reach the input"
        )
