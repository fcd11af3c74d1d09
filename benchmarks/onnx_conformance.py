"""ONNX's node conformance suite as a property test of import / ops / replace / compile --expect-import.

    python benchmarks/onnx_conformance.py [--data DIR] [--only REGEX] [--slice K/N] [--jobs N] [--timeout S] [--json FILE] [--shuffle SEED]
                                          [--dynamic] [--target vulkan] [-v]
    python benchmarks/onnx_conformance.py --table FILE   # the table of a (partial) run's --json file

For each node test (DIR/<test>/model.onnx, test_data_set_0/input_*.pb, output_*.pb): import the
model, compile it unreplaced (IREE's own module, the control), list its op groups, and for each
group `ops` marks replaceable: replace that group alone, build the generated C as a system
plugin, compile with --expect-import, run on the stored inputs and compare with the stored
outputs. When a test has several replaceable groups they are also replaced all at once (every
import expected, one module). Each group is classified:

    right          the replaced module gives the stored outputs
    wrong          it runs and gives other numbers (a generator bug: the goal is 0)
    error          a step failed with pyree_build's error (its message is kept: it must say what to do)
    crash          a step raised anything else, or a tool died (a bug: the goal is 0)
    iree-differs   IREE's own module already misses the stored outputs (or cannot run them): not
                   the kernel's fault, counted apart

Without --data the suite's data is generated first with onnx's own tool (into --data's
place, a temporary directory). Each test runs in its own process, bounded by --timeout, so
a kernel that crashes or hangs costs one test. The table is per op family (the model's
node types) and in total; below it how the tests ended (run, import failed, skipped: a sequence,
map or optional input) and the groups `ops` refused, counted by reason.

The whole suite in CI-sized runs: `--slice K/N` takes the K-th of N slices of the sorted test
list (after --only), test i (from 0) in slice i % N + 1, so each slice samples every op family
and the N slices together are the suite, each test once; `--table` of their --json files
appended together is the whole suite's table.

With --target vulkan the same runs for the GPU path: the groups `ops --target vulkan` marks
generable are replaced by generated GLSL (`replace --target vulkan`), built to SPIR-V, compiled
(and the control too) for iree-compile's portable Vulkan target and run on the Vulkan device
here (lavapipe without a GPU).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

OUTCOMES = ("right", "wrong", "error", "crash", "iree-differs")
# The Vulkan target of --target vulkan's modules: iree-compile's portable one, whose code for the
# groups left to IREE uses no subgroup operations (lavapipe's subgroups have 8 lanes).
PORTABLE_VULKAN = "vp_android_baseline_2022"


def parse_slice(text: str) -> tuple[int, int]:
    """`K/N` as (K, N), 1 <= K <= N."""
    found = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not found or not 1 <= int(found[1]) <= int(found[2]):
        raise argparse.ArgumentTypeError(f"--slice takes K/N with 1 <= K <= N (the K-th of N slices), got {text!r}")
    return int(found[1]), int(found[2])


def take_slice(tests: list[Path], k: int, n: int) -> list[Path]:
    """The K-th of N deterministic slices of the tests in sorted order: every N-th from the K-th."""
    return [t for i, t in enumerate(sorted(tests)) if i % n == k - 1]


def generate_data(directory: Path, only: str | None = None) -> Path:
    """Write the node tests' data with onnx's own tool; returns the folder holding the tests."""
    import onnx.backend.test.case.node as node
    import onnx.backend.test.cmd_tools as cmd_tools

    def cases() -> list[Any]:
        found = node.collect_testcases(None)
        return [c for c in found if only is None or re.search(only, c.name)]

    # The tool writes every case model_test.collect_testcases returns: the node cases only.
    cmd_tools.model_test.collect_testcases = cases  # type: ignore[attr-defined]
    cmd_tools.generate_data(argparse.Namespace(output=str(directory)))
    return directory / "node"


def _tolerance(dtype: Any) -> tuple[float, float]:
    import numpy as np

    if dtype == np.float64:
        return 1e-7, 1e-9
    if dtype in (np.float16,):
        return 1e-2, 1e-3
    return 1e-4, 1e-5


def compare(actual: list[Any], expected: list[Any]) -> str | None:
    """None when every output matches, else what differs (first output that does)."""
    import numpy as np

    if len(actual) != len(expected):
        return f"{len(actual)} results, {len(expected)} expected"
    for i, (a, e) in enumerate(zip(actual, expected)):
        a = np.asarray(a)
        if a.shape != e.shape:
            return f"output {i}: shape {list(a.shape)}, expected {list(e.shape)}"
        if e.dtype.kind in "fc":
            rtol, atol = _tolerance(e.dtype)
            close = np.isclose(a.astype(e.dtype), e, rtol=rtol, atol=atol, equal_nan=True)
        else:
            close = a.astype(e.dtype) == e
        if not np.all(close):
            where = tuple(int(x) for x in np.argwhere(~close)[0])
            return f"output {i}: {int((~close).sum())} of {e.size} differ; at {list(where)}: {a[where]!r} vs {e[where]!r}"
    return None


def family(test: str, op_types: list[str]) -> str:
    """The ONNX op a test is about: the longest op name its name starts with (test_reduce_sum_... ->
    ReduceSum), else its first node's; `_expanded` tests (a function's body) are a family apart."""
    import onnx.defs

    name = test.removeprefix("test_").replace("_", "").lower()
    known = {s.name for s in onnx.defs.get_all_schemas()} | set(op_types)
    found = max((op for op in known if name.startswith(op.lower())), key=len, default=op_types[0] if op_types else "(none)")
    return found + (" (expanded)" if "_expanded" in test else "")


def _load_tensors(folder: Path, prefix: str) -> list[Any]:
    import onnx
    from onnx import numpy_helper

    arrays = []
    files = sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[-1]))
    for path in files:
        tensor = onnx.TensorProto()
        tensor.ParseFromString(path.read_bytes())
        arrays.append(numpy_helper.to_array(tensor))
    return arrays


def _message(e: BaseException) -> str:
    from pyree_build import PyreeError

    text = " ".join(str(e).split())[:600]
    if isinstance(e, PyreeError):
        text += f" | fix: {e.fix}" if e.fix else " | (NO FIX GIVEN)"
    return text


def _classify_exception(e: BaseException) -> tuple[str, str]:
    from pyree_build import PyreeError

    if isinstance(e, PyreeError):
        text = _message(e)
        # A tool that died by a signal is a crash whatever wraps it.
        if re.search(r"signal|Segmentation|core dumped|stack dump|Aborted|LLVM ERROR|Assertion", text):
            return "crash", text
        return "error", text
    return "crash", f"{type(e).__name__}: {_message(e)} | {traceback.format_exc(limit=-3).strip().splitlines()[-3:]}"


def check_test(test_dir: Path, work: Path, *, together: bool = True, dynamic: bool = False, target: str = "llvm-cpu") -> dict[str, Any]:
    """Everything for one node test, as a JSON-able record."""
    import onnx

    import pyree_build as pb

    record: dict[str, Any] = {"test": test_dir.name, "family": "?", "status": "ok", "groups": []}
    model = onnx.load(str(test_dir / "model.onnx"))
    record["family"] = family(test_dir.name, [n.op_type for n in model.graph.node])
    if any(not i.type.HasField("tensor_type") for i in model.graph.input) or any(not o.type.HasField("tensor_type") for o in model.graph.output):
        record["status"] = "skipped: a sequence, map or optional input or output (not a tensor)"
        return record
    data = test_dir / "test_data_set_0"
    inputs, expected = _load_tensors(data, "input"), _load_tensors(data, "output")
    mlir = work / "model.mlir"
    try:
        pb.import_onnx(test_dir / "model.onnx", mlir)
    except Exception as e:
        record["status"] = f"import failed: {_message(e)}"
        return record
    function = model.graph.name

    def run(module: Path, plugins: list[Path]) -> list[Any]:
        from pyree_build.actions.run import run_to_arrays

        return run_to_arrays(module, function, inputs, plugins=plugins, device="local-sync" if target == "llvm-cpu" else target)

    gpu = target != "llvm-cpu"
    try:
        listed = pb.ops(mlir, targets=[target] if gpu else ())
        for g in listed:
            if gpu:  # generable for the target, else why not, as replace --target decides
                g.replaceable, g.reason = g.targets[target] is None, g.targets[target]
    except Exception as e:
        outcome, message = _classify_exception(e)
        record["status"] = f"ops {outcome}: {message}"
        return record
    iree_right = False
    if any(g.replaceable for g in listed):  # the control is only needed where something is replaced
        try:
            pb.compile(mlir, work / "base.vmfb", **_module_target(target))
            differs = compare(run(work / "base.vmfb", []), expected)
            record["iree"] = "right" if differs is None else f"differs: {differs}"
        except Exception as e:
            record["iree"] = f"fails: {_message(e)}"
        iree_right = record["iree"] == "right"
    replaceable = []
    for g in listed:
        entry: dict[str, Any] = {"index": g.index, "root": g.root, "replaceable": g.replaceable, "reason": g.reason, "same_as": getattr(g, "same_as", None)}
        record["groups"].append(entry)
        if g.replaceable:
            # Every group at once, repeats included: each static matcher takes its own group only
            # (the general form, --dynamic, walks the program: there one import takes a repeat).
            if not dynamic or getattr(g, "same_as", None) is None:
                replaceable.append(g.index)
            entry["outcome"], entry["message"] = _replaced(mlir, work / f"g{g.index}", [g.index], run, expected, iree_right, dynamic, target)
    if together and len(replaceable) > 1:
        record["together"] = _replaced(mlir, work / "all", replaceable, run, expected, iree_right, dynamic, target)
    return record


def _module_target(target: str) -> dict[str, Any]:
    return {"target": target, "vulkan_target": PORTABLE_VULKAN} if target == "vulkan" else {"target": target}


def _replaced(
    mlir: Path, out: Path, indices: list[int], run: Any, expected: list[Any], iree_right: bool, dynamic: bool, target: str = "llvm-cpu"
) -> tuple[str, str]:
    import pyree_build as pb

    names = [f"k{i}" for i in indices]
    step = "replace"
    try:
        pb.replace(mlir, out, ops=indices, imports=names, dynamic=dynamic, target=target)
        plugins: list[Path] = []
        search: list[Path] = []
        if target == "vulkan":
            step = "spirv"
            pb.spirv([out / f"{n}.glsl" for n in names], out / "spv")
            search = [out / "spv"]
        else:
            step = "plugin"
            plugins = [pb.plugin(out / f"{n}.c", out / f"{n}.so", cc="zig") for n in names]
        step = "compile"
        pb.compile(mlir, out / "replaced.vmfb", transform_spec=out / "spec.mlir", expect_imports=names, object_search_paths=search, **_module_target(target))
        step = "run"
        actual = run(out / "replaced.vmfb", plugins)
    except Exception as e:
        outcome, message = _classify_exception(e)
        # IREE's own module fails or differs there too; on a GPU target IREE's own codegen can also
        # crash compiling the groups left to it (NonMaxSuppression's for vulkan, with or without a spec).
        if (step == "run" or (step == "compile" and target != "llvm-cpu")) and not iree_right:
            return "iree-differs", f"{step}: {message}"
        return outcome, f"{step}: {message}"
    differs = compare(actual, expected)
    if not iree_right:
        return "iree-differs", differs or "matches the stored outputs although IREE's own module does not"
    return ("right", "") if differs is None else ("wrong", differs)


def _worker(test_dir: Path, dynamic: bool, target: str = "llvm-cpu") -> None:
    with tempfile.TemporaryDirectory(prefix="pyree-conformance.") as work:
        try:
            record = check_test(test_dir, Path(work), dynamic=dynamic, target=target)
        except Exception as e:
            outcome, message = _classify_exception(e)
            record = {"test": test_dir.name, "family": "?", "status": f"harness {outcome}: {message}", "groups": []}
    print("RECORD " + json.dumps(record), flush=True)


def run_one(test_dir: Path, timeout: float, *, dynamic: bool = False, target: str = "llvm-cpu") -> dict[str, Any]:
    """One test in its own process (a crashing kernel or tool takes only that test down)."""
    argv = [sys.executable, __file__, "--worker", str(test_dir), *(["--dynamic"] if dynamic else []), "--target", target]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"test": test_dir.name, "family": "?", "status": f"timed out after {timeout:.0f} s", "groups": []}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RECORD "):
            record: dict[str, Any] = json.loads(line[len("RECORD ") :])
            return record
    tail = " ".join(done.stderr.split()[-40:])
    return {"test": test_dir.name, "family": "?", "status": f"worker crash (exit {done.returncode}): {tail}", "groups": []}


def _settled(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run that fails where IREE's own module fails or differs is IREE's, also in records
    written before the harness said so."""
    for r in records:
        if r.get("iree", "right") == "right":
            continue
        for g in r["groups"]:
            if g.get("outcome") in ("error", "crash") and (g.get("message") or "").startswith("run:"):
                g["outcome"] = "iree-differs"
        if "together" in r and r["together"][0] in ("error", "crash") and r["together"][1].startswith("run:"):
            r["together"] = ["iree-differs", r["together"][1]]
    return records


def table(records: list[dict[str, Any]]) -> str:
    """Counts per op family and in total."""
    columns = ("tests", "listed", "replaceable", *OUTCOMES, "together ok/all")
    rows: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for record in records:
        for key in (record["family"], "TOTAL"):
            row = rows[key]
            row["tests"] += 1
            row["listed"] += len(record["groups"])
            for g in record["groups"]:
                row["replaceable"] += g["replaceable"]
                if g.get("outcome"):
                    row[g["outcome"]] += 1
            if "together" in record:
                row["together all"] += 1
                row["together ok"] += record["together"][0] in ("right", "iree-differs")
    width = max(len(k) for k in rows) if rows else 5
    lines = [f"{'family':<{width}} " + " ".join(f"{c:>12}" for c in columns)]
    for key in sorted(rows, key=lambda k: (k == "TOTAL", k)):
        row = rows[key]
        cells = [row[c] for c in columns[:-1]]
        lines.append(f"{key:<{width}} " + " ".join(f"{c:>12}" for c in cells) + f" {row['together ok']:>6}/{row['together all']}")
    return "\n".join(lines)


def problems(records: list[dict[str, Any]]) -> list[str]:
    """Every wrong, crash and error group, every test that did not finish: one line each."""
    out = []
    for r in records:
        if r["status"] != "ok" and not r["status"].startswith(("skipped", "import failed")):
            out.append(f"{r['test']}: {r['status']}")
        for g in r["groups"]:
            if g.get("outcome") in ("wrong", "crash", "error"):
                out.append(f"{r['test']} #{g['index']} {g['root']}: {g['outcome']}: {g['message']}")
        if "together" in r and r["together"][0] not in ("right", "iree-differs"):
            out.append(f"{r['test']} (all groups at once): {r['together'][0]}: {r['together'][1]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="folder of node tests (<test>/model.onnx ...); generated when absent")
    parser.add_argument("--only", help="regular expression: only the tests whose names it matches (re.search)")
    parser.add_argument("--slice", type=parse_slice, metavar="K/N", help="only the K-th of N deterministic slices of the sorted tests (N runs: the suite)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="tests at once (default: cores)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per test (default 600)")
    parser.add_argument("--json", type=Path, help="append every record to this file as it comes (JSON lines)")
    parser.add_argument("--table", type=Path, help="only print the table of a --json file (a finished or a partial run)")
    parser.add_argument("--shuffle", type=int, metavar="SEED", help="run the tests in a random order (a partial run is then a sample)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each test's line as it finishes")
    parser.add_argument("--dynamic", action="store_true", help="replace with `replace --dynamic` (matchers for any sizes)")
    parser.add_argument(
        "--target", choices=("llvm-cpu", "vulkan"), default="llvm-cpu", help="vulkan: generated GLSL on the Vulkan device (default llvm-cpu: C plugins)"
    )
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.dynamic, args.target)
        return
    if args.table:
        report([json.loads(line) for line in args.table.read_text(encoding="utf-8").splitlines() if line.strip()])
        return
    with contextlib.ExitStack() as stack:
        data = args.data
        if data is None or not data.exists():
            target = data or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pyree-onnx-node.")))
            print(f"generating the node tests' data into {target} ...", file=sys.stderr)
            data = generate_data(target, args.only)
        if (data / "node").is_dir():
            data = data / "node"
        tests = sorted(p for p in data.iterdir() if (p / "model.onnx").exists() and (not args.only or re.search(args.only, p.name)))
        if args.slice:
            print(f"slice {args.slice[0]}/{args.slice[1]}: {len(take_slice(tests, *args.slice))} of {len(tests)} tests", file=sys.stderr)
            tests = take_slice(tests, *args.slice)
        if args.shuffle is not None:
            random.Random(args.shuffle).shuffle(tests)
        start = time.monotonic()
        records: list[dict[str, Any]] = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {pool.submit(run_one, t, args.timeout, dynamic=args.dynamic, target=args.target): t for t in tests}
            for future in concurrent.futures.as_completed(futures):
                record = future.result()
                records.append(record)
                if args.json:
                    with args.json.open("a", encoding="utf-8") as log:
                        log.write(json.dumps(record) + "\n")
                if args.verbose:
                    outcomes = ",".join(g.get("outcome") or "-" for g in record["groups"])
                    print(
                        f"[{len(records)}/{len(tests)}] {record['test']}: {record['status']} iree={record.get('iree', '-')[:40]} [{outcomes}]",
                        file=sys.stderr,
                        flush=True,
                    )
                    for line in problems([record]):
                        print(f"    {line}", file=sys.stderr, flush=True)
        print(f"{len(tests)} tests in {time.monotonic() - start:.0f} s\n")
        report(records)


def report(records: list[dict[str, Any]]) -> None:
    records = sorted(_settled(records), key=lambda r: r["test"])
    print(table(records))
    print("\n" + summary(records))
    found = problems(records)
    if found:
        print("\nwrong, crashes, errors:")
        print("\n".join(found))


# A refusal whose first clause says only that the generator cannot write it: the op or type
# after it is the reason.
_NO_C = "the group cannot be generated in C: "


def reason_kind(reason: str) -> str:
    """A refusal's reason without what is particular to one group (types, values, names, sizes,
    and op names except where the op is the reason), cut at its first clause: refusals for the
    same reason count together."""
    no_c = reason.startswith(_NO_C)
    text = re.sub(r"tensor<[^>]*>", "tensor<...>", reason.removeprefix(_NO_C))
    text = re.sub(r"%[\w#]+ \((?:tensor<\.\.\.>|[a-z]+\d+|index)\)", "%v (TYPE)", re.sub(r"%[\w#]+", "%v", text))
    if not no_c:
        text = re.sub(r"\b(?:math|arith|linalg|tensor|scf|flow|iree_[a-z_]+)\.[\w.]+", "OP", text)
    text = re.sub(r"(?<![\w])'[^']*'(?!\w)", "'...'", text)  # a quoted name, not an apostrophe
    text = re.sub(r"\b\d+\b", "N", text)
    cut = min((i for i in (text.find(": "), text.find("; "), text.find(" (")) if i >= 20), default=len(text))
    return ("no C for it: " if no_c else "") + " ".join(text[:cut].split())[:110]


def _unlowered(status: str) -> str:
    """What an import failure is about: the ONNX op IREE cannot lower, else its reason's kind."""
    found = re.search(r"ONNX node .*?\((\w+)(?:, graph\.node\[\d+\])?\) cannot be lowered", status)
    if found:
        return found[1]
    illegal = re.search(r"failed to legalize operation '([\w.]+)'", status)
    if illegal:
        return f"IREE cannot legalize {illegal[1]}"
    if killed := re.search(r"(iree-[\w-]+) .*?was killed by (SIG\w+)", status):
        return f"{killed[1]} crashed ({killed[2]})"
    importer = re.search(r"OnnxImportError: ([^|]+?)(?: \||$| command:)", status)
    return (
        f"the importer: {reason_kind(importer[1])}"
        if importer
        else reason_kind(status.removeprefix("import failed: ").removeprefix("error: ").split(": ", 1)[-1])
    )


def summary(records: list[dict[str, Any]]) -> str:
    """How the tests ended, the outcomes in total, and the refused groups by reason."""
    ended: Counter[str] = Counter()
    for r in records:
        ended[r["status"].split(":")[0] if r["status"] != "ok" else "ran"] += 1
    outcomes = Counter(g["outcome"] for r in records for g in r["groups"] if g.get("outcome"))
    refused = Counter(reason_kind(g.get("reason") or "(no reason given)") for r in records for g in r["groups"] if not g["replaceable"])
    unlowered = Counter(_unlowered(r["status"]) for r in records if r["status"].startswith("import failed"))
    lines = [
        f"tests: {len(records)} (" + ", ".join(f"{n} {k}" for k, n in ended.most_common()) + ")",
        "import failed: " + ", ".join(f"{n} {k}" for k, n in unlowered.most_common()),
        f"groups: {sum(len(r['groups']) for r in records)} listed, {sum(g['replaceable'] for r in records for g in r['groups'])} replaceable: "
        + ", ".join(f"{outcomes[o]} {o}" for o in OUTCOMES),
        f"refused by ops: {sum(refused.values())} groups, by reason:",
    ]
    lines += [f"  {n:>5}  {kind}" for kind, n in refused.most_common()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
