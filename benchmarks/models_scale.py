"""The model path at real model size: import / ops / replace (/ compile --expect-import / verify)
on the nine ImageNet CNNs of onnx's "light" models, against iree-compile of the same model.

    python benchmarks/models_scale.py --work DIR [--only REGEX] [--timeout S] [--json FILE] [--full] [--verify REGEX] [-v]
                                      [--rounds N [--cpu generic|host] [--devices local-sync,local-task]]
    python benchmarks/models_scale.py --table FILE   # the table of a (partial) run's --json file

The models are the onnx wheel's `onnx/backend/test/data/light/light_*.onnx` (alexnet, densenet121,
inception_v1, inception_v2, resnet50, shufflenet, squeezenet, vgg19, zfnet512): the real
architectures at opset 9, every weight stored as a ConstantOfShape node (one value, so the file
is small). `prepare` makes each a model as a user would have it, cached in DIR as <name>.onnx:
converted to opset 17 (onnx's version converter), every ConstantOfShape weight replaced by a
seeded random initializer of its shape and dtype (He-scaled for Conv and Gemm weights, near 1 for
scales and variances, small for biases and means: activations stay O(1) through the depth, so
verify compares meaningful numbers), initializers no longer listed as graph inputs, IR version 8,
checked by onnx.checker.

Per model, side by side in one run, each step timed (wall seconds) and bounded by --timeout in
its own process group, so a step that hangs or crashes costs one cell and its error's first line:

  import      `pyree-build import` (pb.import_onnx) of the model: the MLIR every later step reads
  compile     the wheel's iree-compile of that MLIR to a vmfb for llvm-cpu: the reference
  ops         `pyree-build ops`: groups, how many replaceable, the refusals counted by the first
              clause of their reasons
  replace     `pyree-build replace` of every replaceable group at once, import g<N> for group N
              (a group with the same ops and types as an earlier one is replaced by that one's import)
  with --full, or for the models --verify REGEX selects, also:
  plugins     each generated g<N>.c built as a system plugin (zig)
  compile-x   `pyree-build compile --transform-spec spec.mlir --expect-import g<N>...` (every import called)
  verify      `pyree-build verify` of that module with its plugins against onnxruntime
  with --rounds N as well:
  speed       the model's whole-model time, every group replaced (that module and its plugins)
              over IREE's own module of the same model, each device's sides timed in turn N
              rounds (drift reaches both alike); both built for --cpu (generic: the module for
              a generic CPU, the plugins for the arch's baseline; host: both for this machine)

Ratios (targets): (import + ops) / compile <= 0.5; replace / compile <= 1.0; replaceable >= 90%.
The table is markdown (it goes into the README). Each model's steps share a pyree_build cache of
their own, emptied when the model's run starts: what one step keeps for the next (import's view
of the program, which `ops` and `replace` read) counts as a user gets it, and no number is a hit
left by an earlier run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
MODELS = ("alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet", "vgg19", "zfnet512")
OPSET = 17
# The light models are IR 3 (every initializer also a graph input), which the version converter
# keeps; from IR 4 an initializer need not be an input. 8 is read by onnxruntime and iree-import-onnx.
IR_VERSION = 8
IREE_FLAGS = ("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu")
TARGETS = {"import+ops": 0.5, "replace": 1.0, "replaceable": 0.9}


def light_models() -> dict[str, Path]:
    """Short name (resnet50, alexnet...) -> the onnx wheel's light model file; empty when absent."""
    import onnx

    folder = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    found = {}
    for path in sorted(folder.glob("light_*.onnx")):
        name = path.stem.removeprefix("light_").removeprefix("bvlc_")
        found[name] = path
    return found


# --------------------------------------------------------------------------------------------
# Preparation: the light model as a user would have it


def _final_consumer(users: dict[str, tuple[str, int, Any]], name: str) -> tuple[str, int, Any, bool]:
    """(op_type, input index, node, whether it reads `name` itself) of the op that uses tensor
    `name`, looking through the Unsqueeze / Reshape that only shape a weight (DenseNet's
    scales, Inception's classifier)."""
    op, index, node = users.get(name, ("", -1, None))
    direct = True
    while op in ("Unsqueeze", "Reshape") and index == 0:
        op, index, node = users.get(node.output[0], ("", -1, None))
        direct = False
    return op, index, node, direct


def _weight(rng: Any, shape: tuple[int, ...], dtype: Any, role: tuple[str, int, Any, bool]) -> Any:
    """A random weight for its role: He-scaled normal for a Conv or Gemm weight (activations keep
    their size through ReLUs), 1 + small for a scale (BatchNormalization's, a Mul's) and a
    variance (positive), small (0.05 * normal) for a bias or a mean."""
    import numpy as np

    op, index, node, direct = role
    noise = rng.standard_normal(shape, dtype=np.float32)
    if op in ("Conv", "Gemm") and index == 1 and len(shape) >= 2:
        fan_in = int(np.prod(shape[1:]))
        if op == "Gemm" and direct and len(shape) == 2:  # B is (K, N), or (N, K) with transB
            fan_in = shape[1] if next((a.i for a in node.attribute if a.name == "transB"), 0) else shape[0]
        values = noise * np.float32(np.sqrt(2.0 / max(fan_in, 1)))
    elif (op == "BatchNormalization" and index in (1, 4)) or op == "Mul":
        values = 1 + 0.05 * (np.abs(noise) if index == 4 else noise)
    else:
        values = 0.05 * noise
    return values.astype(dtype)


def prepare(source: Path, output: Path, *, seed: int = 0) -> dict[str, Any]:
    """Write the light model `source` as a real-size opset-17 model with random weights at
    `output` (see the module's docstring); returns facts about it."""
    import numpy as np
    import onnx
    import onnx.version_converter
    from onnx import numpy_helper

    model = onnx.version_converter.convert_version(onnx.load(str(source)), OPSET)
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    rng = np.random.default_rng(seed + zlib.crc32(source.stem.encode()))
    users: dict[str, tuple[str, int, Any]] = {}
    for node in graph.node:
        for i, x in enumerate(node.input):
            users.setdefault(x, (node.op_type, i, node))
    made, kept = [], []
    for node in graph.node:
        shape_name = node.input[0] if node.op_type == "ConstantOfShape" and node.input else None
        if shape_name is None or shape_name not in initializers:
            kept.append(node)
            continue
        shape = tuple(int(d) for d in numpy_helper.to_array(initializers[shape_name]))
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        dtype = numpy_helper.to_array(value).dtype if value is not None else np.dtype(np.float32)
        if dtype.kind == "f":
            array = _weight(rng, shape, dtype, _final_consumer(users, node.output[0]))
        else:  # an integer constant (none in these models) keeps its value
            array = np.full(shape, numpy_helper.to_array(value).ravel()[0] if value is not None else 0, dtype)
        made.append(numpy_helper.from_array(array, node.output[0]))
    del graph.node[:]
    graph.node.extend(kept)
    used = {x for n in graph.node for x in n.input}
    keep_init = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep_init + made)
    # IR 3 listed every initializer as a graph input too (a default an input could override):
    # the model's inputs are the data only.
    stored = set(initializers) | {t.name for t in made}
    data_inputs = [i for i in graph.input if i.name not in stored]
    del graph.input[:]
    graph.input.extend(data_inputs)
    model.ir_version = IR_VERSION
    passes = calibrate(model, seed=seed)
    onnx.checker.check_model(model)
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(output.name + ".tmp")
    onnx.save(model, str(temporary))
    temporary.replace(output)
    left = sum(n.op_type == "ConstantOfShape" for n in model.graph.node)
    return {
        "nodes": len(model.graph.node),
        "weights": len(made),
        "parameters": int(sum(np.prod(t.dims) for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT)),
        "constant_of_shape_left": left,
        "calibration_passes": passes,
    }


def calibrate(model: Any, *, seed: int = 0) -> int:
    """Set each BatchNormalization's mean and variance to the statistics of its input on a
    random image (as training would have), so its output is about unit size: without it a
    ResNet's residual sums grow 2x a block and its softmax saturates to one-hot, which no
    verify could tell a slightly wrong kernel from. A statistic depends on the
    BatchNormalizations before it, so they are set in rounds, those with k before them in round
    k; one onnxruntime session, the statistics fed in as inputs. Returns the rounds."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    graph = model.graph
    bns = [n for n in graph.node if n.op_type == "BatchNormalization" and len(n.input) >= 5]
    if not bns:
        return 0
    # rank of a tensor: the most BatchNormalizations on a path to it (nodes are in topological order)
    rank: dict[str, int] = {}
    for node in graph.node:
        before = max((rank.get(x, 0) for x in node.input if x), default=0)
        for y in node.output:
            rank[y] = before + (node.op_type == "BatchNormalization")
    rounds: dict[int, list[Any]] = {}
    for node in bns:
        rounds.setdefault(rank.get(node.input[0], 0), []).append(node)
    stats = {name for n in bns for name in n.input[3:5]}
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.name in stats}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    kept = [t for t in probe.graph.initializer if t.name not in stats]
    del probe.graph.initializer[:]
    probe.graph.initializer.extend(kept)
    probe.graph.input.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(a.shape)) for name, a in values.items())
    probed = sorted({n.input[0] for n in bns} - {o.name for o in graph.output})
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in probed)
    image = {}
    for i in graph.input:
        dims = [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]
        image[i.name] = np.random.default_rng(seed).standard_normal(dims).astype(np.float32)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    for k in sorted(rounds):
        wanted = sorted({n.input[0] for n in rounds[k]})
        got = dict(zip(wanted, session.run(wanted, {**image, **values})))
        for node in rounds[k]:
            x = got[node.input[0]]
            axes = tuple(a for a in range(x.ndim) if a != 1)
            values[node.input[3]] = x.mean(axis=axes).astype(np.float32)
            values[node.input[4]] = (x.var(axis=axes) + 1e-2).astype(np.float32)
    for t in graph.initializer:
        if t.name in values:
            t.CopyFrom(numpy_helper.from_array(values[t.name], t.name))
    return len(rounds)


# --------------------------------------------------------------------------------------------
# The steps, each run in a process of its own (--step) by the parent, which bounds it


def import_model(model: Path, mlir: Path, timeout: float) -> None:
    """`pyree-build import`: the one place that says how (the weights' form may become an option)."""
    import pyree_build as pb

    pb.import_onnx(model, mlir, timeout=timeout, force=True)


def _first_clause(reason: str | None) -> str:
    """A refusal's kind: its text up to the first ':', ';' or '(' (names and sizes come after)."""
    text = " ".join((reason or "?").split())
    return re.split(r"[:;(]", text, maxsplit=1)[0].strip() or text[:60]


def _step(name: str, model: Path, out: Path, args: dict[str, Any]) -> dict[str, Any]:
    """One step of one model, timed; its facts as a JSON-able dict."""
    import pyree_build as pb

    mlir = out / "model.mlir"
    timeout = float(args["timeout"])
    start = time.monotonic()
    facts: dict[str, Any] = {}
    if name == "import":
        import_model(model, mlir, timeout)
        facts["mlir_mb"] = round(mlir.stat().st_size / 1e6, 1)
    elif name == "ops":
        groups = pb.ops(mlir, timeout=timeout)
        seconds = time.monotonic() - start
        refused = [g for g in groups if not g.replaceable]
        facts = {
            "groups": len(groups),
            "replaceable": len(groups) - len(refused),
            # a group with the same ops and types as an earlier one is replaced by that one's import
            "to_replace": [g.index for g in groups if g.replaceable],
            "refusals": dict(Counter(_first_clause(g.reason) for g in refused).most_common()),
            "roots": dict(Counter(g.root for g in groups).most_common()),
        }
        return {"seconds": seconds, **facts}
    elif name == "replace":
        indices = list(args["indices"])
        pb.replace(mlir, out / "kernels", ops=indices, imports=[f"g{i}" for i in indices], onnx=model, force=True, timeout=timeout)
    elif name == "plugins":
        import concurrent.futures

        sources = sorted((out / "kernels").glob("g*.c"))
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(lambda c: pb.plugin(c, out / "plugins" / f"{c.stem}.so", cc="zig", cpu=_plugin_cpu(args)), sources))
        facts["plugins"] = len(sources)
    elif name == "compile-x":
        names = [c.stem for c in sorted((out / "kernels").glob("g*.c"))]
        pb.compile(mlir, out / "replaced.vmfb", transform_spec=out / "kernels" / "spec.mlir", expect_imports=names, cpu=args.get("cpu", "generic"))
    elif name == "verify":
        plugins = sorted((out / "plugins").glob("g*.so"))
        result = pb.verify(out / "replaced.vmfb", model, plugins=plugins)
        facts["passed"] = result.passed
        if not result.passed:
            bad = next(o for o in result.outputs if not o.passed)
            facts["error"] = f"verify failed: {' '.join(bad.render().split())[:300]}"
        facts["max_abs_error"] = max(o.max_abs_error for o in result.outputs)
    elif name == "speed":
        facts["devices"], facts["cpu"] = _speed(model, mlir, out, args), args.get("cpu", "generic")
    else:
        raise ValueError(f"no step {name!r}")
    return {"seconds": time.monotonic() - start, **facts}


def _plugin_cpu(args: dict[str, Any]) -> str:
    """The CPU the plugins are built for: the arch's baseline beside a generic module, else the host."""
    return "baseline" if args.get("cpu", "generic") == "generic" else "host"


def _speed(model: Path, mlir: Path, out: Path, args: dict[str, Any]) -> dict[str, Any]:
    """Per device: IREE's whole-model median (ms), the replaced module's ratio to it and the
    spread of the per-round ratios. IREE's module is compiled here for the same CPU (with its
    weights, as `pyree-build compile` imports them); the inputs are seeded, one .npy each."""
    import numpy as np
    import onnx

    import pyree_build as pb

    reference = out / "iree.vmfb"
    pb.compile(mlir, reference, cpu=args.get("cpu", "generic"))
    function = re.search(r"func\.func @([\w$.-]+)\(", mlir.read_text(encoding="utf-8"))
    if function is None:
        raise ValueError(f"{mlir}: no func.func to time")
    inputs = []
    initializers = {t.name for t in onnx.load(str(model), load_external_data=False).graph.initializer}
    graph_inputs = [i for i in onnx.load(str(model), load_external_data=False).graph.input if i.name not in initializers]
    for n, value in enumerate(graph_inputs):
        dims = [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
        path = out / f"input{n}.npy"
        np.save(path, np.random.default_rng(n).standard_normal(dims).astype(np.float32))
        inputs.append(f"@{path}")
    plugins = sorted((out / "plugins").glob("g*.so"))
    sides = [(reference, []), (out / "replaced.vmfb", plugins)]
    timed = {}
    for device in args.get("devices", ["local-sync"]):
        result = pb.bench.compare_many(sides, function.group(1), inputs=inputs, device=device, rounds=int(args["rounds"]))
        iree, replaced = result.sides
        timed[device] = {"iree_ms": iree.median_ms, "ratio": replaced.ratio, "spread": [replaced.ratio_min, replaced.ratio_max]}
    return timed


def _worker(name: str, model: Path, out: Path, args: dict[str, Any]) -> None:
    try:
        result = _step(name, model, out, args)
    except BaseException as e:  # noqa: BLE001 - a step's failure is its cell
        lines = [line for line in str(e).strip().splitlines() if line.strip()]
        result = {"error": f"{type(e).__name__}: {lines[0] if lines else ''}"[:400]}
    print("RESULT " + json.dumps(result), flush=True)


def _bounded(argv: list[str], timeout: float, cache: Path) -> tuple[int | None, str, str, float]:
    """(exit status or None when stopped at `timeout`, stdout, stderr, wall seconds); the
    command runs in a process group of its own, all of which a timeout stops, with the
    pyree_build cache `cache` (the model's own, emptied when its run starts)."""
    env = dict(os.environ, PYREE_BUILD_CACHE=str(cache), PYREE_BUILD_SERVER="off")
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, time.monotonic() - start
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err, time.monotonic() - start


def _tail(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(no output)"])[0][:400]


def run_step(name: str, model: Path, out: Path, timeout: float, **args: Any) -> dict[str, Any]:
    """A step in its own process, bounded by `timeout`: its facts, or {"error": first line}."""
    argv = [sys.executable, str(HERE), "--step", name, "--model", str(model), "--out", str(out), "--args", json.dumps({"timeout": timeout, **args})]
    code, stdout, stderr, wall = _bounded(argv, timeout, out / "cache")
    if code is None:
        return {"error": f"timed out after {timeout:.0f} s", "wall": wall}
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return {**result, "wall": wall}
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
    if code == -signal.SIGKILL:
        how += " (out of memory?)"
    return {"error": f"worker died ({how}): {_tail(stderr)}", "wall": wall}


def iree_compile(mlir: Path, vmfb: Path, timeout: float) -> dict[str, Any]:
    """The reference: the wheel's iree-compile of the imported MLIR, nothing else."""
    from pyree_build.core import toolchain

    argv = [str(toolchain.iree_compile().path), str(mlir), *IREE_FLAGS, "-o", str(vmfb)]
    code, _, stderr, wall = _bounded(argv, timeout, vmfb.parent / "cache")
    if code is None:
        return {"error": f"timed out after {timeout:.0f} s", "seconds": None}
    if code != 0:
        return {"error": f"iree-compile exit {code}: {_tail(stderr)}", "seconds": wall}
    return {"seconds": wall, "vmfb_mb": round(vmfb.stat().st_size / 1e6, 1)}


def measure(name: str, source: Path, work: Path, *, timeout: float, full: bool, log: Any = None, speed: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every step of one model, in order; a step whose input a failed step should have made is
    not run (its cell says so). `speed`: the CPU the replaced model is built for ("cpu"), and with
    "rounds" (and "devices") its whole-model time against IREE's (the speed step)."""
    speed = speed or {}
    model = work / f"{name}.onnx"
    record: dict[str, Any] = {"model": name, "steps": {}}
    start = time.monotonic()
    facts = model.with_suffix(".json")
    if model.exists() and facts.exists():
        record["prep"] = {**json.loads(facts.read_text(encoding="utf-8")), "cached": True}
    else:
        try:
            record["prep"] = prepare(source, model)
        except Exception as e:  # noqa: BLE001 - a model that cannot be prepared is one row
            record["prep"] = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}
            return record
        record["prep"]["seconds"] = time.monotonic() - start
        facts.write_text(json.dumps(record["prep"]), encoding="utf-8")
    record["model_mb"] = round(model.stat().st_size / 1e6, 1)
    out = work / name
    if out.exists():
        import shutil

        shutil.rmtree(out)
    out.mkdir(parents=True)
    steps = record["steps"]

    def note(step: str) -> None:
        if log is not None:
            cell = steps[step]
            print(f"  {name} {step}: {cell.get('error') or _seconds(cell.get('seconds'))}", file=log, flush=True)

    steps["import"] = run_step("import", model, out, timeout)
    note("import")
    if "error" in steps["import"]:
        return record
    steps["compile"] = iree_compile(out / "model.mlir", out / "base.vmfb", timeout)
    note("compile")
    steps["ops"] = run_step("ops", model, out, timeout)
    note("ops")
    indices = steps["ops"].get("to_replace") or []
    if "error" in steps["ops"] or not indices:
        return record
    steps["replace"] = run_step("replace", model, out, timeout, indices=indices)
    note("replace")
    if not full or "error" in steps["replace"]:
        return record
    for step in ("plugins", "compile-x", "verify"):
        steps[step] = run_step(step, model, out, timeout, **speed)
        note(step)
        if "error" in steps[step]:
            return record
    if speed.get("rounds") and steps["verify"].get("passed"):
        steps["speed"] = run_step("speed", model, out, timeout, **speed)
        note("speed")
    return record


# --------------------------------------------------------------------------------------------
# The table


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _cell(record: dict[str, Any], step: str) -> str:
    cell = record["steps"].get(step)
    if cell is None:
        return "-"
    if "error" in cell:
        return "timeout" if cell["error"].startswith("timed out") else "FAIL"
    if step == "verify":
        return f"pass {_seconds(cell['seconds'])}" if cell.get("passed") else "FAIL"
    return _seconds(cell.get("seconds"))


def ratios(record: dict[str, Any]) -> dict[str, float | None]:
    steps = record["steps"]

    def seconds(step: str) -> float | None:
        cell = steps.get(step) or {}
        return None if "error" in cell else cell.get("seconds")

    base, imported, listed, replaced = seconds("compile"), seconds("import"), seconds("ops"), seconds("replace")
    ops = steps.get("ops") or {}
    return {
        "import+ops": (imported + listed) / base if base and imported is not None and listed is not None else None,
        "replace": replaced / base if base and replaced is not None else None,
        "replaceable": ops["replaceable"] / ops["groups"] if ops.get("groups") else None,
    }


def table(records: list[dict[str, Any]]) -> str:
    """The markdown table: seconds per step, the ratios (a ratio past its target is marked !)."""
    head = (
        "| model | params (M) | import s | iree-compile s | ops s | groups | replaceable | replace s | plugins s | compile-x s | verify |"
        " (import+ops)/compile | replace/compile |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in records:
        ratio = ratios(r)
        ops = r["steps"].get("ops") or {}
        params = (r.get("prep") or {}).get("parameters")

        def mark(key: str, value: float | None, percent: bool = False) -> str:
            if value is None:
                return "-"
            text = f"{100 * value:.0f}%" if percent else f"{value:.2f}"
            bad = value < TARGETS[key] if key == "replaceable" else value > TARGETS[key]
            return text + (" !" if bad else "")

        replaceable = f"{ops['replaceable']} ({mark('replaceable', ratio['replaceable'], True)})" if "groups" in ops else "-"
        cells = [
            r["model"],
            f"{params / 1e6:.1f}" if params else "-",
            _cell(r, "import"),
            _cell(r, "compile"),
            _cell(r, "ops"),
            str(ops.get("groups", "-")),
            replaceable,
            _cell(r, "replace"),
            _cell(r, "plugins"),
            _cell(r, "compile-x"),
            _cell(r, "verify"),
            mark("import+ops", ratio["import+ops"]),
            mark("replace", ratio["replace"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def speed_table(records: list[dict[str, Any]]) -> str:
    """The speed steps' markdown table: per model and device, IREE's whole-model time and the
    replaced model's ratio to it (the spread of the per-round ratios); empty without one."""
    lines = []
    for r in records:
        cell = r["steps"].get("speed") or {}
        for device, timed in (cell.get("devices") or {}).items():
            low, high = timed["spread"]
            lines.append(f"| {r['model']} | {cell['cpu']} | {device} | {timed['iree_ms']:.1f} | {timed['ratio']:.2f}x ({low:.2f}-{high:.2f}) |")
    if not lines:
        return ""
    head = "| model | CPU | device | IREE ms | every group replaced / IREE (per round) |"
    return "\n".join([head, "|" + "---|" * 5, *lines])


def report(records: list[dict[str, Any]]) -> None:
    records = sorted(records, key=lambda r: r["model"])
    print(table(records))
    print("\ntargets: (import+ops)/compile <= 0.5, replace/compile <= 1.0, replaceable >= 90% (! marks a miss)")
    speeds = speed_table(records)
    if speeds:
        print(f"\nwhole-model time, every replaceable group replaced, against IREE's own module:\n{speeds}")
    refusals: Counter[str] = Counter()
    for r in records:
        refusals.update((r["steps"].get("ops") or {}).get("refusals") or {})
    if refusals:
        print("\nrefusals (first clause of the reason), all models:")
        for reason, count in refusals.most_common():
            print(f"  {count:5}  {reason}")
    failed = [(r["model"], step, cell["error"]) for r in records for step, cell in r["steps"].items() if "error" in cell]
    failed += [(r["model"], "prep", r["prep"]["error"]) for r in records if "error" in (r.get("prep") or {})]
    if failed:
        print("\nfailed steps:")
        for model, step, error in failed:
            print(f"  {model} {step}: {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, help="folder of the prepared models (kept: made once) and each model's outputs (remade each run)")
    parser.add_argument("--only", help="regular expression: only the models whose names it matches (re.search)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per step (default 900)")
    parser.add_argument("--json", type=Path, help="append each model's record to this file as it comes (JSON lines)")
    parser.add_argument("--full", action="store_true", help="also build the plugins, compile with --expect-import and verify, for every model")
    parser.add_argument("--verify", metavar="REGEX", help="as --full for the models whose names this matches")
    parser.add_argument("--rounds", type=int, default=0, help="with --full or --verify: also time each verified model against IREE's, N rounds")
    parser.add_argument(
        "--cpu", choices=("generic", "host"), default="generic", help="the CPU the replaced module and its plugins (and IREE's timed module) are built for"
    )
    parser.add_argument("--devices", default="local-sync,local-task", help="with --rounds: the devices timed (comma-separated)")
    parser.add_argument("--prepare-only", action="store_true", help="only write the prepared models into --work")
    parser.add_argument("--table", type=Path, help="only print the table of a --json file (a finished or a partial run)")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per step as it finishes")
    parser.add_argument("--step", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--args", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        _worker(args.step, args.model, args.out, json.loads(args.args))
        return
    if args.table:
        report([json.loads(line) for line in args.table.read_text(encoding="utf-8").splitlines() if line.strip()])
        return
    if args.work is None:
        parser.error("--work DIR is required (the prepared models are kept there)")
    found = light_models()
    if not found:
        sys.exit("no light models found: onnx's wheel ships them in onnx/backend/test/data/light (pip install onnx)")
    names = [n for n in found if not args.only or re.search(args.only, n)]
    args.work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    if args.prepare_only:
        for name in names:
            target = args.work / f"{name}.onnx"
            if not (target.exists() and target.with_suffix(".json").exists()):
                facts = prepare(found[name], target)
                target.with_suffix(".json").write_text(json.dumps(facts), encoding="utf-8")
                print(name, facts, file=sys.stderr, flush=True)
        return
    records = []
    for name in names:
        full = args.full or bool(args.verify and re.search(args.verify, name))
        began = time.monotonic()
        speed = {"cpu": args.cpu, "rounds": args.rounds, "devices": args.devices.split(",")}
        record = measure(name, found[name], args.work, timeout=args.timeout, full=full, log=sys.stderr if args.verbose else None, speed=speed)
        record["seconds"] = time.monotonic() - began
        record["load"] = round(os.getloadavg()[1], 1)  # other work on the machine: the last 5 minutes' load average
        records.append(record)
        if args.json:
            with args.json.open("a", encoding="utf-8") as log:
                log.write(json.dumps(record) + "\n")
    print(f"{len(names)} models in {time.monotonic() - start:.0f} s on {os.cpu_count()} cores (load average {os.getloadavg()[1]:.1f})\n")
    report(records)


if __name__ == "__main__":
    main()
