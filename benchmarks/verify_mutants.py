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
comparison made loose or back (not one that selects one of its own operands, as max does:
equal operands make that no edit); `index` a load one element earlier; `bias` a result plus a small
amount; `constant` a literal 0.1% larger. A mutant that computes the same function (an edit
nothing reaches) is caught by no check: the target is every mutant that differs on the stored
data caught, and >= 95% of all.
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
    """A comparison `vN = (X) op (Y)` whose only use selects X or Y: at equality both are the
    same value, so making it strict or loose changes nothing (no mutant)."""
    m = re.match(r"\s*const \w+ (v\d+) = \(\w+\)\((?:!\()?\((\w+)\) [<>]=? \((\w+)\)\)\)?;", line)
    if m is None:
        return False
    flag, x, y = m[1], m[2], m[3]
    return re.search(rf"\b{flag} \? ({x} : {y}|{y} : {x})\)", body) is not None


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
            try:
                result["differs"] = harness.compare(run_to_arrays(module, function, inputs, plugins=[plugin]), expected) is not None
            except pb.PyreeError:
                result["differs"] = True  # the run fails: it differs
            result["verify"] = _verify(module, test_dir / "model.onnx", plugin, entry["status"])
            if result["verify"] == "passed":  # can any input tell it apart? many more draws, from other seeds
                result["told apart"] = result["differs"] or _verify(module, test_dir / "model.onnx", plugin, entry["status"], trials=SEARCH_TRIALS) == "caught"
            entry["mutants"].append(result)
    return record


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
    missed, refused, alarms = [], [], []
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
                if m["verify"] != "caught":
                    told = "; 30 more draws tell it apart" if m.get("told apart") else ("" if m["verify"] == "refused" else "; no draw tells it apart")
                    line = f"{r['test']} #{g['index']} {m['kind']} ({'differs' if m['differs'] else 'same'} on stored data{told}): {m['what']}"
                    (refused if m["verify"] == "refused" else missed).append(line)
    columns = ("mutants", "differ on stored data", "told apart", "caught", "caught of those that differ", "refused")
    print(f"{'edit':<10} " + " ".join(f"{c:>{len(c)}}" for c in columns))
    for name, row in [*sorted(by_kind.items()), ("TOTAL", counts)]:
        print(f"{name:<10} " + " ".join(f"{row[c]:>{len(c)}}" for c in columns))
    total, differ, apart = counts["mutants"], counts["differ on stored data"], counts["told apart"]
    if total:
        print(f"\ncaught {counts['caught']} of {total} mutants ({100 * counts['caught'] / total:.1f}%); "
              f"{counts['caught of those that differ']} of the {differ} that differ on the stored data; "
              f"{counts['caught']} of the {apart} that some input tells apart (stored data, or {SEARCH_TRIALS} draws from other seeds)")  # fmt: skip
    for title, lines in (("verify failed the right kernel or could not check it", alarms), ("missed", missed), ("refused", refused)):
        if lines:
            print(f"\n{title}:")
            print("\n".join(f"  {line}" for line in lines))
    return {"counts": dict(counts), "missed": missed, "refused": refused, "alarms": alarms}


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
