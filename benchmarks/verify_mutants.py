"""What default `verify` catches: generated kernels of ONNX node tests, each mutated by one small edit.

    python benchmarks/verify_mutants.py [--data DIR] [--only REGEX] [--tests N] [--shuffle SEED] [--per-group K] [--jobs N] [--json FILE] [-v]

For each node test (generated with onnx's own tool when --data is absent, as
benchmarks/onnx_conformance.py does) and each group `ops` marks replaceable: replace the group
alone, compile the model with the spec once, and check the right kernel first (default `verify`
must pass it: a check that fails a right kernel is a false alarm, counted apart). Then each
mutant, the generated C with one edit, is built as the plugin and
- run on the test's stored inputs: does it give other outputs than the stored ones ("differs")?
- checked by default `verify` (seeded draws, onnxruntime the reference): "caught" when verify
  fails it (a mismatch, or the run failing), "refused" when verify cannot check the model on
  draws (it names the input and asks for --inputs: the right kernel is refused too), else
  missed; a missed mutant is then checked on 30 draws from other seeds: one that no input
  tells apart computes the same function as far as any draw sees (likely an equivalent mutant).

The edits, each made once at each place it applies (at most --per-group per group, spread over
the kinds): `bound` a loop bound or size one smaller; `sign` + and - swapped (not
before a zero), a strict
comparison made loose or back (not one that selects one of its own operands, or a constant of
the same value, as max and relu do: equal operands make that no edit); `index` a load one
element earlier; `bias` a result plus a small amount; `constant` a literal 0.1% larger.

A mutant that computes the same function is caught by no check. One is counted apart as
*equivalent*, with the reason, where that is shown: its plugin's loaded sections (code,
constants, data) are byte for byte the right kernel's (the edit is in code the built knobs
never run, such as a lane loop wider than the row, or the compiler folds it away); read from
the kernel, the edit changes only values no output reads (a buffer IREE's decomposition fills
and nothing reads: a softmax's argmax index); or, run where it acts, a comparison of an
element of the model's one input with a constant C, made strict or loose, in an elementwise
model, gives the same outputs with every element at C (the only inputs where it acts). A
mutant read as equivalent that verify catches is reported as a wrong reading. The target is
every mutant that differs on the stored data caught, and >= 95% of all.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib.util
import json
import random
import re
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# A slice that runs in minutes on two cores: elementwise ops with thresholds, a reduction, a
# broadcast, integer bit operations, a matmul, a softmax (one nest per row).
DEFAULT_ONLY = (
    "^(test_shrink_hard|test_shrink_soft|test_clip|test_clip_inbounds|test_relu|test_leakyrelu|test_abs|test_add_bcast|test_where_example|"
    "test_reduce_sum_default_axes_keepdims_example|test_matmul_2d|test_softmax_axis_1|test_bitshift_right_uint32|test_greater|test_less_equal|"
    "test_thresholdedrelu|test_max_example|test_hardsigmoid)$"
)
# Draws of the search for an input that tells a missed mutant apart (seeds 1000 on): one that
# none tells apart computes the same function as far as any draw can see (likely equivalent).
SEARCH_TRIALS = 30
# A kernel's body: the lines between its first function and the plugin's boilerplate.
_BODY_END = "// The plugin's import"


def _harness() -> Any:
    spec = importlib.util.spec_from_file_location("onnx_conformance", HERE / "onnx_conformance.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mutants(source: str) -> list[tuple[str, str, str]]:
    """(kind, what, mutated source) for each one-edit mutant of a generated kernel."""
    start = source.find("static inline")
    if start < 0:
        start = source.find("\nvoid ")
    end = source.find(_BODY_END)
    head, body, tail = source[:start], source[start:end], source[end:]
    found: list[tuple[str, str, str]] = []
    lines = body.split("\n")

    def put(kind: str, i: int, old: str, new: str) -> None:
        if old != new:
            found.append(
                (kind, f"line {head.count(chr(10)) + i + 1}: {old.strip()} -> {new.strip()}", head + "\n".join([*lines[:i], new, *lines[i + 1 :]]) + tail)
            )

    # Values the kernel sets to a zero literal: adding or subtracting them is no edit.
    zeros = re.findall(r"const \w+ (v\d+) = \(\w+\)\((?:-?0x0\.0p\+0f?|-?0\.0f?|0)\);", body)
    for i, line in enumerate(lines):
        text = line.strip()
        if text.startswith(("//", "#", "PYREE_")):
            continue
        # Sizes and loop bounds written as literals.
        for m in re.finditer(r"(\b(?:rows|cols|n\w*|k\w*)\s*=\s*|<\s*)(\d+)\b", line):
            if int(m[2]) > 1:
                put("bound", i, line, line[: m.start(2)] + str(int(m[2]) - 1) + line[m.end(2) :])
        computed = re.match(r"\s*(const\s+\w+\s+[va]\d+\s*=|\w+\s*[+\-*]?=|out\d+\[)", line) is not None
        if not computed:
            continue
        for m in re.finditer(r"(?<=[\w)\]]) ([+-]) (?=[\w(])", line):
            if re.match(r"\(?(0|" + "|".join(zeros or ["$^"]) + r")\)?\b", line[m.end() :]):
                continue  # x + 0 and x - 0 are the same: no edit
            if "col0" in line[max(0, m.start() - 8) : m.end() + 8] or "row0" in line[max(0, m.start() - 8) : m.end() + 8]:
                continue  # an index's arithmetic: the index edit below
            put("sign", i, line, line[: m.start(1)] + ("-" if m[1] == "+" else "+") + line[m.end(1) :])
        for m in re.finditer(r"\) (<=|>=|<|>) \(", line):
            if _selects_its_operands(line, body):
                continue  # max/min/relu: where the operands are equal either one is the result
            swap = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}[m[1]]
            put("sign", i, line, line[: m.start(1)] + swap + line[m.end(1) :])
        for m in re.finditer(r"\b(in\d+)\[(\([^\]]*\))\]", line):
            index = m[2]
            put("index", i, line, line[: m.start()] + f"{m[1]}[({index} > 0 ? {index} - 1 : {index})]" + line[m.end() :])
        store = re.match(r"(\s*out\d+\[[^\]]*\]\s*=\s*)\((\w+)\)(.*);$", line)
        if store:
            kind = store[2]
            amount = "1" if "int" in kind else "1e-2"
            put("bias", i, line, f"{store[1]}({kind})(({kind})({store[3]}) + ({kind}){amount});")
        for m in re.finditer(r"(?<![\w.])(-?0x[0-9a-fA-F.]+p[+-]\d+f?|-?\d+\.\d*(?:e[+-]?\d+)?f?)(?![\w.])", line):
            if float.fromhex(m[1].rstrip("f")) == 0 if "0x" in m[1] else float(m[1].rstrip("f")) == 0:
                continue  # zero times anything is no edit
            put("constant", i, line, line[: m.start()] + f"({m[1]} * 1.001f)" + line[m.end() :])
    return found


def _selects_its_operands(line: str, body: str) -> bool:
    """A comparison `vN = (X) op (Y)` whose every use selects X or Y (or a constant of the same
    value as one of them: relu selects a copy of the zero it compares with): at equality both
    are the same value, so making it strict or loose changes nothing (no mutant)."""
    m = re.match(r"\s*const \w+ (v\d+) = \(\w+\)\((?:!\()?\((\w+)\) [<>]=? \((\w+)\)\)\)?;", line)
    if m is None:
        return False
    flag, x, y = m[1], m[2], m[3]
    constants = {name: _literal(text) for name, text in re.findall(r"const \w+ (v\d+) = \(\w+\)\(([^()]*)\);", body)}

    def same(a: str, b: str) -> bool:
        return a == b or (a in constants and b in constants and constants[a] == constants[b])

    uses = len(re.findall(rf"\b{flag}\b", body)) - 1
    selects = [(p, q) for p, q in re.findall(rf"\b{flag} \? (\w+) : (\w+)\)", body)]
    return uses > 0 and len(selects) == uses and all((same(p, x) and same(q, y)) or (same(p, y) and same(q, x)) for p, q in selects)


def _literal(text: str) -> float | str:
    """A C literal's value (hex or decimal float, integer), else the text."""
    text = text.strip().rstrip("fFlLuU")
    try:
        return float.fromhex(text) if "0x" in text.lower() and "p" in text.lower() else float(text)
    except ValueError:
        return text


# Equivalent mutants, recognised by reading the kernel. A C statement the liveness reading takes:
# `[const] [TYPE] NAME[...] OP= EXPR` (a value, a buffer's element, a store to an output).
_STATEMENT = re.compile(r"^(?:const\s+)?(?:(?:unsigned\s+)?[A-Za-z_]\w*\s+)?([A-Za-z_]\w*)\s*(\[.*\])?\s*(?:[-+*/%|&^]|<<|>>)?=\s*(.+)$")
_FUNCTION = re.compile(r"^(?:static\s+)?(?:inline\s+)?(?:__attribute__\(\(\w+\)\)\s+)?[\w\s*]+?\b(\w+)\(")
_NOT_NAMES = {"const", "int", "float", "double", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "bool", "size_t"}


def _statements(line: str, function: str) -> list[tuple[str, set[str]]] | None:
    """(the name it writes, the names it reads) for each statement of a line; a `return` writes
    the function's name (a call reads it). None where a statement is none of these (an if, a
    break, a declaration of several names): such a line is never read as dead."""
    text = line.strip()
    if text.startswith("for ("):  # the statements of a one-line loop, after its header
        depth, at = 0, 0
        while at < len(text) and not (depth == 1 and text[at] == ")"):
            depth += {"(": 1, ")": -1}.get(text[at], 0)
            at += 1
        text = text[at + 1 :]
    found = []
    for piece in text.strip().strip("{}").split(";"):
        piece = piece.strip().strip("{}").strip()
        if not piece:
            continue
        names = set(re.findall(r"[A-Za-z_]\w*", piece)) - _NOT_NAMES
        if piece.startswith("return "):
            found.append((function, names - {"return"}))
            continue
        m = _STATEMENT.match(piece)
        if m is None or re.search(r"(?<![=<>!])=(?!=)", m[3]) or "," in re.sub(r"\([^()]*\)", "", m[3]):
            return None
        found.append((m[1], set(re.findall(r"[A-Za-z_]\w*", (m[2] or "") + " " + m[3])) - _NOT_NAMES))
    return found


def dead_edit(source: str, mutated: str) -> str | None:
    """Why the one line `mutated` changes is dead, where it is: every name written by it (by the
    loop it bounds, for a loop's line) reaches no output through what the kernel reads (a
    buffer IREE's decomposition fills and no output reads). None where that cannot be read."""
    old, new = source.split("\n"), mutated.split("\n")
    changed = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
    if len(old) != len(new) or len(changed) != 1:
        return None
    start, end = source.find("static inline"), source.find(_BODY_END)
    first, last = source[: max(start, 0)].count("\n"), source[:end].count("\n")
    writes: dict[str, set[str]] = {}
    lines: dict[int, list[tuple[str, set[str]]] | None] = {}
    function = ""
    for i in range(first, last):
        if (header := _FUNCTION.match(old[i])) and not old[i].startswith(" "):
            function = header[1]
        lines[i] = _statements(old[i], function)
        for name, reads in lines[i] or ():
            writes.setdefault(name, set()).update(reads)
    live = {n for n in writes if re.fullmatch(r"out\d+", n)}
    todo = list(live)
    while todo:
        for name in writes.get(todo.pop(), ()):
            if name not in live:
                live.add(name)
                todo.append(name)
    at = changed[0]
    span = [at]
    if old[at].strip().startswith("for (") and old[at].rstrip().endswith("{"):
        depth, j = 0, at
        while j < last:
            depth += old[j].count("{") - old[j].count("}")
            if depth == 0:
                break
            j += 1
        span = list(range(at, j + 1))
    written: set[str] = set()
    for i in span:
        if i not in lines:
            return None
        statements = lines[i]
        if statements is None:
            if old[i].strip() in ("}", "{"):
                continue
            return None
        written.update(name for name, _ in statements)
    if not written or written & live:
        return None
    return f"dead: it changes only {', '.join(sorted(written))}, which no output reads"


def _spread(found: list[tuple[str, str, str]], limit: int, seed: int) -> list[tuple[str, str, str]]:
    """At most `limit` mutants, taken in turn from each kind (in a seeded order within each)."""
    rng = random.Random(seed)
    by_kind: dict[str, list[tuple[str, str, str]]] = {}
    for m in found:
        by_kind.setdefault(m[0], []).append(m)
    for items in by_kind.values():
        rng.shuffle(items)
    taken: list[tuple[str, str, str]] = []
    while len(taken) < limit and any(by_kind.values()):
        for kind in sorted(by_kind):
            if by_kind[kind] and len(taken) < limit:
                taken.append(by_kind[kind].pop())
    return taken


def check_test(test_dir: Path, work: Path, per_group: int) -> dict[str, Any]:
    """Every replaceable group of one node test: the right kernel, then each mutant."""
    import onnx

    import pyree_build as pb
    from pyree_build.actions.run import run_to_arrays

    harness = _harness()
    record: dict[str, Any] = {"test": test_dir.name, "status": "ok", "groups": []}
    model = onnx.load(str(test_dir / "model.onnx"))
    data = test_dir / "test_data_set_0"
    inputs, expected = harness._load_tensors(data, "input"), harness._load_tensors(data, "output")
    mlir = work / "model.mlir"
    try:
        pb.import_onnx(test_dir / "model.onnx", mlir)
        listed = pb.ops(mlir)
    except pb.PyreeError as e:
        record["status"] = f"import or ops failed: {e.what}"
        return record
    function = model.graph.name
    for group in listed:
        if not group.replaceable or group.same_as is not None:
            continue
        out = work / f"g{group.index}"
        entry: dict[str, Any] = {"index": group.index, "ops": group.ops, "mutants": []}
        record["groups"].append(entry)
        try:
            pb.replace(mlir, out, ops=[group.index], imports=["k"])
            module = pb.compile(mlir, out / "replaced.vmfb", transform_spec=out / "spec.mlir", expect_imports=["k"])
            right = pb.plugin(out / "k.c", out / "k.so", cc="zig")
            if harness.compare(run_to_arrays(module, function, inputs, plugins=[right]), expected) is not None:
                entry["status"] = "the generated kernel is wrong on the stored data (not a mutant's fault): skipped"
                continue
        except pb.PyreeError as e:
            entry["status"] = f"error: {e.what}"
            continue
        try:
            entry["status"] = "ok" if pb.verify(module, test_dir / "model.onnx", plugins=[right]).passed else "verify fails the right kernel"
        except pb.PyreeError as e:
            entry["status"] = f"verify refuses: {e.what}"  # its mutants are counted as refused
        if entry["status"] == "verify fails the right kernel":
            continue  # it would "catch" every mutant: a false alarm, counted apart
        source = (out / "k.c").read_text()
        for n, (kind, what, text) in enumerate(_spread(mutants(source), per_group, group.index)):
            c = out / f"m{n}.c"
            c.write_text(text)
            result: dict[str, Any] = {"kind": kind, "what": what}
            try:
                plugin = pb.plugin(c, out / f"m{n}.so", cc="zig")
            except pb.PyreeError:
                continue  # an edit that does not compile is no mutant
            if _loaded_bytes(plugin) == _loaded_bytes(right):  # the compiler removed or folded the edit: nothing to run
                result.update(differs=False, verify="passed", equivalent=SAME_CODE)
                result["told apart"] = False
                entry["mutants"].append(result)
                continue
            try:
                result["differs"] = harness.compare(run_to_arrays(module, function, inputs, plugins=[plugin]), expected) is not None
            except pb.PyreeError:
                result["differs"] = True  # the run fails: it differs
            result["verify"] = _verify(module, test_dir / "model.onnx", plugin, entry["status"])
            if result["verify"] == "passed":  # can any input tell it apart? many more draws, from other seeds
                result["told apart"] = result["differs"] or _verify(module, test_dir / "model.onnx", plugin, entry["status"], trials=SEARCH_TRIALS) == "caught"
            dead = dead_edit(source, text)
            if result["verify"] == "caught" and dead:
                result["misread"] = f"read as {dead}, yet verify caught it"  # the reading is wrong: reported
            elif result["verify"] == "passed" and not result["told apart"]:
                probe = (model, group, lambda p: run_to_arrays(module, function, p[1], plugins=[p[0]]), right, plugin)
                reason = dead or _equal_where_it_acts(source, text, *probe)
                if reason:
                    result["equivalent"] = reason
            entry["mutants"].append(result)
    return record


SAME_CODE = "it compiles to the same machine code as the right kernel (code the built knobs never run, or an edit the compiler folds away)"


def _loaded_bytes(path: Path) -> dict[str, bytes]:
    """The contents of an ELF64 shared object's sections that are loaded (code, constants, data,
    relocations), by name; not its notes (the build id hashes the source's name)."""
    import struct

    data = path.read_bytes()
    (offset,) = struct.unpack_from("<Q", data, 0x28)
    size, count, names = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, offset + i * size) for i in range(count)]
    table = headers[names][4]

    def name(at: int) -> str:
        return data[table + at : data.index(b"\0", table + at)].decode()

    sh_alloc, sh_nobits = 0x2, 8
    return {name(h[0]): data[h[4] : h[4] + h[5]] for h in headers if h[2] & sh_alloc and h[1] != sh_nobits and not name(h[0]).startswith(".note")}


# ONNX ops whose every output element is a function of the same element of each input.
_ELEMENTWISE = {
    "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "BitShift", "Cast", "Ceil", "Celu", "Clip", "Cos", "Cosh", "Div",
    "Elu", "Equal", "Erf", "Exp", "Floor", "Gelu", "Greater", "GreaterOrEqual", "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN",
    "LeakyRelu", "Less", "LessOrEqual", "Log", "Max", "Min", "Mish", "Mod", "Mul", "Neg", "Not", "Or", "Pow", "Reciprocal", "Relu", "Round",
    "Selu", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Sub", "Tan", "Tanh", "ThresholdedRelu", "Where", "Xor",
}  # fmt: skip


def _equal_where_it_acts(source: str, mutated: str, model: Any, group: Any, run: Any, right: Path, plugin: Path) -> str | None:
    """Why a comparison made strict or loose is equivalent, where it is: it compares an element
    of the model's one input with a constant C, so it acts only where that element is C; in an
    elementwise model each output element sees only its own input element, so running both
    kernels with every element at C is every case the edit reaches. None where that does not
    hold or the outputs there differ."""
    import numpy as np

    old, new = source.split("\n"), mutated.split("\n")
    changed = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
    if len(changed) != 1:
        return None
    line = old[changed[0]]
    m = re.match(r"\s*const \w+ v\d+ = \(\w+\)\((?:!\()?\((\w+)\) [<>]=? \((\w+)\)\)\)?;", line)
    if m is None or re.sub(r"[<>]=?", "", line) != re.sub(r"[<>]=?", "", new[changed[0]]):
        return None  # only a comparison's strictness
    loads = dict(re.findall(r"const \w+ (a\d+) = in(\d+)\[", source))
    constants = {n: _literal(t) for n, t in re.findall(r"const \w+ (v\d+) = \(\w+\)\(([^()]*)\);", source)}
    element, constant = (m[1], m[2]) if m[1] in loads else (m[2], m[1])
    value = constants.get(constant)
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if element not in loads or not isinstance(value, float) or len(inputs) != 1 or any(n.op_type not in _ELEMENTWISE for n in model.graph.node):
        return None
    operand = int(loads[element])
    if operand >= len(group.operands) or group.operands[operand].origin != "input":
        return None
    tensor = inputs[0].type.tensor_type
    dtype = onnx_dtype(tensor.elem_type)
    if dtype is None or dtype.kind != "f" or any(not d.HasField("dim_value") for d in tensor.shape.dim):
        return None
    at = [np.full([d.dim_value for d in tensor.shape.dim], value, dtype)]
    first, second = run((right, at)), run((plugin, at))
    if len(first) != len(second) or not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(first, second)):
        return None
    return (f"the edit acts only where {element} (the model's one input, elementwise) equals {value:g}; with every element at "
            f"{value:g} both kernels give the same outputs")  # fmt: skip


def onnx_dtype(elem_type: int) -> Any:
    import numpy as np
    import onnx

    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None


def _verify(module: Path, model: Path, plugin: Path, status: str, trials: int = 3) -> str:
    """Default verify's verdict on a mutant: caught (a mismatch, or its run failing), passed, or refused."""
    import pyree_build as pb

    if status.startswith("verify refuses"):
        return "refused"
    try:
        return "passed" if pb.verify(module, model, plugins=[plugin], trials=trials, seed=0 if trials == 3 else 1000).passed else "caught"
    except pb.PyreeError:
        return "caught"


def _worker(test_dir: Path, per_group: int) -> None:
    with tempfile.TemporaryDirectory(prefix="pyree-mutants.") as work:
        record = check_test(test_dir, Path(work), per_group)
    print("RECORD " + json.dumps(record), flush=True)


def run_one(test_dir: Path, per_group: int, timeout: float) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--worker", str(test_dir), "--per-group", str(per_group)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"test": test_dir.name, "status": f"timed out after {timeout:.0f} s", "groups": []}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RECORD "):
            record: dict[str, Any] = json.loads(line[len("RECORD ") :])
            return record
    return {"test": test_dir.name, "status": f"worker failed (exit {done.returncode}): {' '.join(done.stderr.split()[-30:])}", "groups": []}


def report(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts, printed, and returned for a test to read."""
    counts: Counter[str] = Counter()
    by_kind: dict[str, Counter[str]] = {}
    missed, refused, alarms, equivalent, misread = [], [], [], [], []
    for r in sorted(records, key=lambda r: r["test"]):
        if r["status"] != "ok":
            print(f"{r['test']}: {r['status']}")
        for g in r["groups"]:
            if g.get("status") != "ok":
                alarms.append(f"{r['test']} #{g['index']}: {g.get('status')}")
            for m in g["mutants"]:
                kind = by_kind.setdefault(m["kind"], Counter())
                for c in (counts, kind):
                    c["mutants"] += 1
                    c["differ on stored data"] += m["differs"]
                    c["caught"] += m["verify"] == "caught"
                    c["caught of those that differ"] += m["differs"] and m["verify"] == "caught"
                    c["refused"] += m["verify"] == "refused"
                    c["told apart"] += m["verify"] == "caught" or bool(m.get("told apart"))
                    c["equivalent"] += "equivalent" in m
                where = f"{r['test']} #{g['index']} {m['kind']}"
                if "misread" in m:
                    misread.append(f"{where}: {m['what']}: {m['misread']}")
                if "equivalent" in m:
                    equivalent.append(f"{where} ({m['equivalent']}): {m['what']}")
                elif m["verify"] != "caught":
                    told = "; 30 more draws tell it apart" if m.get("told apart") else ("" if m["verify"] == "refused" else "; no draw tells it apart")
                    line = f"{where} ({'differs' if m['differs'] else 'same'} on stored data{told}): {m['what']}"
                    (refused if m["verify"] == "refused" else missed).append(line)
    columns = ("mutants", "differ on stored data", "told apart", "caught", "caught of those that differ", "equivalent", "refused")
    print(f"{'edit':<10} " + " ".join(f"{c:>{len(c)}}" for c in columns))
    for name, row in [*sorted(by_kind.items()), ("TOTAL", counts)]:
        print(f"{name:<10} " + " ".join(f"{row[c]:>{len(c)}}" for c in columns))
    total, differ, apart, same = counts["mutants"], counts["differ on stored data"], counts["told apart"], counts["equivalent"]
    if total:
        print(f"\ncaught {counts['caught']} of {total} mutants ({100 * counts['caught'] / total:.1f}%); "
              f"{counts['caught of those that differ']} of the {differ} that differ on the stored data; "
              f"{counts['caught']} of the {apart} that some input tells apart (stored data, or {SEARCH_TRIALS} draws from other seeds)")  # fmt: skip
        if total > same:
            print(f"{same} equivalent (shown so by reading the kernel, or by running it where the edit acts): "
                  f"caught {counts['caught']} of the other {total - same} ({100 * counts['caught'] / (total - same):.1f}%)")  # fmt: skip
    sections = (("verify failed the right kernel or could not check it", alarms), ("read as equivalent, yet caught (a wrong reading)", misread),
                ("equivalent", equivalent), ("missed", missed), ("refused", refused))  # fmt: skip
    for title, lines in sections:
        if lines:
            print(f"\n{title}:")
            print("\n".join(f"  {line}" for line in lines))
    return {"counts": dict(counts), "missed": missed, "refused": refused, "alarms": alarms, "equivalent": equivalent, "misread": misread}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="folder of node tests; generated with onnx's tool when absent")
    parser.add_argument("--only", default=DEFAULT_ONLY, help="regular expression of the tests to take (default: a small slice)")
    parser.add_argument("--tests", type=int, help="at most this many of them")
    parser.add_argument("--shuffle", type=int, metavar="SEED", help="take them in a random order (with --tests: a random sample)")
    parser.add_argument("--per-group", type=int, default=8, help="mutants per group, spread over the kinds of edit (default 8)")
    parser.add_argument("--jobs", type=int, default=1, help="tests at once (default 1)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per test (default 600)")
    parser.add_argument("--json", type=Path, help="write every record to this file (JSON lines)")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per test as it finishes")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.per_group)
        return
    with contextlib.ExitStack() as stack:
        data = args.data
        if data is None or not data.exists():
            target = data or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pyree-mutants-data.")))
            print(f"generating the node tests' data into {target} ...", file=sys.stderr)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                data = _harness().generate_data(target, args.only)
        if (data / "node").is_dir():
            data = data / "node"
        tests = sorted(p for p in data.iterdir() if (p / "model.onnx").exists() and re.search(args.only, p.name))
        if args.shuffle is not None:
            random.Random(args.shuffle).shuffle(tests)
        tests = tests[: args.tests] if args.tests else tests
        start = time.monotonic()
        records = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for record in pool.map(lambda t: run_one(t, args.per_group, args.timeout), tests):
                records.append(record)
                if args.json:
                    with args.json.open("a", encoding="utf-8") as log:
                        log.write(json.dumps(record) + "\n")
                if args.verbose:
                    done = sum(len(g["mutants"]) for g in record["groups"])
                    print(f"[{len(records)}/{len(tests)}] {record['test']}: {record['status']}, {done} mutants", file=sys.stderr, flush=True)
        print(f"{len(tests)} tests in {time.monotonic() - start:.0f} s\n")
        report(records)


if __name__ == "__main__":
    main()
