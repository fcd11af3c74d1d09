"""The kernels `replace` generates against IREE's own code, untuned and tuned, side by side in one interleaved run.

    python benchmarks/kernels.py [--cases dense128,dense256,softmax] [--rounds 7] [--devices local-sync,local-task]
                                 [--cpu generic|host] [--tune-budget 20] [--no-tune] [--keep DIR]
    python benchmarks/kernels.py --models user,encoder,squeezenet,bottleneck [--groups [--units 5+6+7,7]] [--only REGEX] [--rounds 5] [--devices ...]
                                 [--cpu generic|host] [--tune-budget 8] [--no-tune | --tune-in alone|model] [--keep DIR]

The cases (issue 36's targets):
- `dense128`, `dense256`: a dense layer, MatMul + Add + Relu (x[M,K] @ W[K,N] + b[N], relu) at
  128x512 @ 512x512 and 256x1024 @ 1024x1024;
- `softmax`: the attention block's softmax group (tests/support/onnx_models.py's transformer block: max,
  exp(x - max) summed, divide) over the scores of 4 heads x 256 tokens, x[4,256,256].

Each model is built with the onnx helper API, imported, its one group replaced by the generated
C, the plugin built with the knobs at their defaults (untuned), and the module checked against
onnxruntime (`verify`) before anything is timed. Then `tune` sweeps the knobs the C declares
(no --param) on each device, against onnxruntime, and the winner is built (tuned). Then IREE's
module, the untuned and the tuned plugin are timed in turn, `rounds` times, on each device, so
drift in clock speed or load hits all alike. Printed: each side's median, its ratio to IREE's
median, and the spread of the per-round ratios (the noise). Targets: untuned <= 2x, tuned <= 1x.

`--models`: whole models instead (issue 47's): `user` (Linear -> GELU -> LayerNorm -> Linear ->
Softmax, x[4,64]) and `encoder` (LayerNorm, Q/K/V, 2 heads, attention with Softmax, MLP with erf
GELU, x[128,256]). Each model is imported and every group `ops` lists as replaceable is replaced
in turn alone, then all at once (each group merged into the kernel before it where `replace`
fuses the two into one loop nest: Linear + GELU, a matmul and its residual add); each module is
verified against onnxruntime and timed interleaved with IREE's module of the same model.
A group's row is the whole model's time with that group replaced, over IREE's whole model: the
group's own cost shows as the difference. The all-at-once module is timed untuned (the knobs'
defaults) and, unless --no-tune, tuned: each kernel built with what `tune` chose for it on that
device as a program of its own (as --groups tunes it, and sharing its results under --keep), or
with `--tune-in model` in turn inside the whole model (`tune --plugin`: the kernels tuned before it
loaded as tuned, the rest as generated, the whole model timed), the module verified against
onnxruntime with those plugins before it is timed.

`--cpu` is the CPU both sides are built for: `generic` compiles the module for a generic CPU
and the plugin for the arch's baseline; `host` compiles both for this machine's CPU.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from onnx import helper

import pyree_build as pb
from pyree_build.models.codegen.c_reference import Kernel
from pyree_build.models.ops import OpGroup
from pyree_build.tuning.params import declared_params

REFERENCE_FORM = Kernel.form  # the header line of a kernel generated as one loop nest per op

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # support/onnx_models.py

from support import onnx_models  # noqa: E402

CASES = {
    "dense128": ("MatMul + Add + Relu, x 128x512 @ W 512x512", (128, 512)),
    "dense256": ("MatMul + Add + Relu, x 256x1024 @ W 1024x1024", (256, 1024)),
    "softmax": ("attention softmax (max, exp sum, divide), x 4x256x256 over the last axis", (4, 256, 256)),
}


def _fmt(ms: float) -> str:
    return f"{ms * 1000:.1f} us" if ms < 1 else f"{ms:.3f} ms"


def _model(case: str) -> tuple[Any, tuple[int, ...]]:
    if case.startswith("dense"):
        m, k = CASES[case][1]
        return onnx_models.dense_layer(m, k, k), (m, k)
    shape = CASES[case][1]
    node = helper.make_node("Softmax", ["x"], ["y"], name="attn", axis=-1)
    return onnx_models._model("attn", [node], {"x": shape}, {"y": shape}), shape


def run_case(case: str, work: Path, args: argparse.Namespace) -> None:
    work.mkdir(parents=True, exist_ok=True)
    model_proto, x_shape = _model(case)
    function = model_proto.graph.name  # the module's function is the model's graph
    model = work / f"{case}.onnx"
    onnx_models.save(model_proto, model)
    mlir = pb.import_onnx(model, work / f"{case}.mlir")
    pb.replace(mlir, work / "kernels", ops=[1], imports=[case], onnx=model, force=True)
    source = work / "kernels" / f"{case}.c"
    plugin_cpu = _plugin_cpu(args)
    untuned = pb.plugin(source, work / "untuned.so", cpu=plugin_cpu)
    iree = pb.compile(mlir, work / "iree.vmfb", cpu=args.cpu)
    replaced = pb.compile(mlir, work / "replaced.vmfb", cpu=args.cpu, transform_spec=work / "kernels" / "spec.mlir", expect_imports=[case])
    print(pb.verify(replaced, model, plugins=[untuned], baseline=iree).render())
    rng = np.random.default_rng(0)
    np.save(work / "x.npy", rng.uniform(-1, 1, x_shape).astype(np.float32))
    inputs = [f"@{work / 'x.npy'}"]
    devices = args.devices.split(",")
    tuned: dict[str, tuple[Path, str]] = {}
    if not args.no_tune:
        for device in devices:
            best = work / f"best-{device}.json"
            result = pb.tune(source, best, module=replaced, function=function, onnx=model, device=device, cpu=plugin_cpu, budget=args.tune_budget,
                             build_dir=work / f"variants-{device}")  # fmt: skip
            assert result.best is not None, result.render()
            tuned[device] = (pb.tune.build_tuned([source], work / f"tuned-{device}.so", tuned=best, cpu=plugin_cpu), result.best.label)
    print(f"\n{CASES[case][0]}, cpu {args.cpu}, {args.rounds} rounds alternated (this machine):")
    for device in devices:
        sides: list[tuple[Path, list[Path]]] = [(iree, []), (replaced, [untuned])]
        names = ["IREE", "generated, untuned"]
        if device in tuned:
            sides.append((replaced, [tuned[device][0]]))
            names.append(f"generated, tuned ({tuned[device][1]})")
        result = pb.bench.compare_many(sides, function, inputs=inputs, device=device, rounds=args.rounds)
        for name, side in zip(names, result.sides):
            ratio = "" if side is result.sides[0] else f"  / IREE {side.ratio:.2f}x (per round {side.ratio_min:.2f} - {side.ratio_max:.2f})"
            print(f"  {device:<11} {name:<48} {_fmt(side.median_ms):>10}{ratio}")


def _light(name: str) -> object:
    """One of onnx's light models as models_scale.py prepares it (opset 17, seeded weights)."""
    import onnx

    sys.path.insert(0, str(REPO / "benchmarks"))
    import models_scale

    path = Path(tempfile.gettempdir()) / f"pyree-kernels-{name}.onnx"
    if not path.exists():
        models_scale.prepare(models_scale.light_models()[name], path)
    return onnx.load(str(path))


def _bottleneck() -> object:
    """ResNet-50's first bottleneck (res2_0: 1x1, 3x3 and 1x1 convolutions with BatchNorm and
    Relu, the projection shortcut, the sum and its Relu), cut from the light model as
    models_scale.py prepares it: from the stem's MaxPool to the first Sum's Relu."""
    import onnx
    from onnx import utils

    out = Path(tempfile.gettempdir()) / "pyree-kernels-bottleneck.onnx"
    if not out.exists():
        whole = _light("resnet50")
        nodes = list(whole.graph.node)  # type: ignore[attr-defined]
        start = next(n.output[0] for n in nodes if n.op_type == "MaxPool")
        summed = next(n.output[0] for n in nodes if n.op_type in ("Sum", "Add"))
        end = next(n.output[0] for n in nodes if n.op_type == "Relu" and n.input[0] == summed)
        utils.extract_model(str(Path(tempfile.gettempdir()) / "pyree-kernels-resnet50.onnx"), str(out), [start], [end])
    return onnx.load(str(out))


MODELS = {
    "bottleneck": ("ResNet-50's first bottleneck (res2_0, light model, opset 17, seeded weights), x[1,64,56,56]", _bottleneck, (1, 64, 56, 56)),
    "user": ("Linear -> GELU -> LayerNorm -> Linear -> Softmax, x[4,64]", lambda: onnx_models.gemm_gelu_norm(), (4, 64)),
    "squeezenet": ("SqueezeNet 1.1 (onnx's light model, opset 17, seeded weights), x[1,3,224,224]", lambda: _light("squeezenet"), (1, 3, 224, 224)),
    "encoder": (
        "encoder block (LayerNorm, Q/K/V, 2 heads, attention, MLP with erf GELU), x[128,256]",
        lambda: onnx_models.transformer_block(tokens=128, width=256, heads=2),
        (128, 256),
    ),
}


Unit = OpGroup | tuple[OpGroup, ...]  # a kernel: one group, or a merge


# Groups a merge may need at once: an erf GELU is two or three groups, its input read twice (by the
# division and by the last multiply), so a Linear merged with only the first is no connected group.
LOOKAHEAD = 3
# Ops that compute a reduction of their own. Merged after another unit's result, such an op would
# read that result inlined into its reduction, recomputing it at every step (a GELU recomputed in
# the next Linear's reduction, once per column tile): one nest, but no faster kernel.
REDUCING_OPS = ("linalg.matmul", "linalg.batch_matmul", "linalg.matvec", "linalg.vecmat", "linalg.conv", "linalg.depthwise", "linalg.pooling", "linalg.mmt4d")


def _merged(mlir: Path, groups: list[OpGroup], work: Path) -> list[Unit]:
    """The replaceable groups as kernels: each group merged into the kernel before it (`replace`'s
    --ops 1+2+3 form) where `replace` fuses them into one loop nest (a Linear and its GELU, a
    matmul and the residual add after it), every other group alone. Whether it does is asked of
    `replace` itself, not read from the model's names: a merge it refuses (the groups are not one
    connected group) or generates as the per-op reference is no merge."""
    out: list[Unit] = []
    n = 0
    while n < len(groups):
        taken = _epilogue(mlir, _members(out[-1]), groups[n : n + LOOKAHEAD], work) if out else 0
        if taken:
            out[-1] = (*_members(out[-1]), *groups[n : n + taken])
        else:
            out.append(groups[n])
        n += taken or 1
    return out


def _epilogue(mlir: Path, unit: tuple[OpGroup, ...], following: list[OpGroup], work: Path) -> int:
    """How many of `following` to merge into `unit` (0: none): the fewest that `replace` fuses
    with it into one loop nest, none of them computing a reduction of its own."""
    for n, g in enumerate(following, start=1):
        if any(op.startswith(REDUCING_OPS) for op in g.ops):
            return 0
        if _fuses(mlir, (*unit, *following[:n]), work / "merge-probes"):
            return n
    return 0


def _fuses(mlir: Path, members: tuple[OpGroup, ...], work: Path) -> bool:
    """Whether `replace` generates one loop nest (tiled or row-wise) for `members` merged."""
    probe = work / _tag(members)
    try:
        pb.replace(mlir, probe, ops=[tuple(g.index for g in members)], imports=["probe"], force=True)
    except pb.PyreeError:
        return False
    return REFERENCE_FORM not in (probe / "probe.c").read_text(encoding="utf-8")


def _timed(modules: list[tuple[str, Path, list[Path]]], iree: Path, function: str, inputs: list[str], device: str, args: argparse.Namespace) -> None:
    sides = [(iree, []), *((m, p) for _, m, p in modules)]
    result = pb.bench.compare_many(sides, function, inputs=inputs, device=device, rounds=args.rounds)
    print(f"  {device:<11} IREE {_fmt(result.sides[0].median_ms):>10}")
    for (name, _, _), side in zip(modules, result.sides[1:]):
        print(
            f"  {device:<11} {name:<58} {_fmt(side.median_ms):>10}  / IREE {side.ratio:.2f}x (per round {side.ratio_min:.2f} - {side.ratio_max:.2f})",
            flush=True,
        )


def _members(unit: Unit) -> tuple[OpGroup, ...]:
    return unit if isinstance(unit, tuple) else (unit,)


def _import_name(unit: Unit) -> str:
    return "g" + "_".join(str(g.index) for g in _members(unit))


def _tag(unit: Unit) -> str:
    """The unit as replace's --ops names it (12+13+14), also its work directory's name."""
    return "+".join(str(g.index) for g in _members(unit))


def _label(unit: Unit) -> str:
    """What the tables print and --only searches: #tag and the ONNX nodes the unit came from."""
    members = _members(unit)
    return f"#{_tag(unit)} " + ", ".join(dict.fromkeys(s for g in members for s in g.source))[:40]


def run_model(name: str, work: Path, args: argparse.Namespace) -> None:
    """One whole model: each replaceable group replaced alone, then all at once, against IREE;
    unless --no-tune, also all at once with each kernel as `tune` chose it alone (run_groups'
    tune of the isolated group, on each device)."""
    work.mkdir(parents=True, exist_ok=True)
    about, build, x_shape = MODELS[name]
    proto = build()
    function = proto.graph.name
    model = Path(onnx_models.save(proto, work / f"{name}.onnx"))
    mlir = pb.import_onnx(model, work / f"{name}.mlir", force=True)
    iree = pb.compile(mlir, work / "iree.vmfb", cpu=args.cpu)
    groups = [g for g in pb.ops(mlir) if g.replaceable]
    np.save(work / "x.npy", np.random.default_rng(0).uniform(-1, 1, x_shape).astype(np.float32))
    inputs = [f"@{work / 'x.npy'}"]

    def replaced(tag: str, units: list[Unit]) -> tuple[Path, list[Path]]:
        ops = [tuple(g.index for g in u) if isinstance(u, tuple) else u.index for u in units]
        names = [_import_name(u) for u in units]
        out = work / tag
        pb.replace(mlir, out / "kernels", ops=ops, imports=names, onnx=model, force=True)
        plugins = [pb.plugin(out / "kernels" / f"{n}.c", out / f"{n}.so", cpu=_plugin_cpu(args)) for n in names]
        vmfb = pb.compile(mlir, out / "replaced.vmfb", cpu=args.cpu, transform_spec=out / "kernels" / "spec.mlir", expect_imports=names)
        verdict = pb.verify(vmfb, model, plugins=plugins, baseline=iree)
        assert verdict.passed, verdict.render()
        return vmfb, plugins

    units = _merged(mlir, groups, work)
    print(f"\n{about}: {len(groups)} replaceable groups, cpu {args.cpu}, {args.rounds} rounds alternated (this machine)")
    modules = []
    for unit in units:
        label = _label(unit)
        if args.only and not re.search(args.only, label):
            continue
        modules.append((f"{label} alone", *replaced(_tag(unit), [unit])))
    every = f"all {len(groups)} at once ({len(units)} kernels)"
    modules.append((every, *replaced("all", units)))
    for device in args.devices.split(","):
        tuned_plugins = _tuned_in_model if args.tune_in == "model" else _tuned_plugins
        tuned = [] if args.no_tune else [(f"{every}, tuned", modules[-1][1], tuned_plugins(mlir, model, units, work, device, args))]
        _timed(modules + tuned, iree, function, inputs, device, args)


def _tuned_in_model(mlir: Path, model: Path, units: list[Unit], work: Path, device: str, args: argparse.Namespace) -> list[Path]:
    """The all-at-once module's plugins, each kernel tuned in turn inside the whole module (`tune
    --plugin`: the kernels before it loaded as tuned, the rest as generated; the whole model timed
    against IREE's on the model's input); the module verified with them."""
    del mlir  # the kernels are the all-at-once module's own
    names = [_import_name(u) for u in units]
    plugins = [work / "all" / f"{n}.so" for n in names]
    x = [f"@{work / 'x.npy'}"]
    for k, name in enumerate(names):
        source = work / "all" / "kernels" / f"{name}.c"
        if not declared_params([source]):
            continue
        best = work / "all" / f"best-{name}-{device}.json"
        result = pb.tune(source, best, module=work / "all" / "replaced.vmfb", plugins=plugins[:k] + plugins[k + 1 :], function=_function(model),
                         inputs=x, reference=work / "iree.vmfb", device=device, cpu=_plugin_cpu(args), budget=args.tune_budget,
                         build_dir=work / "all" / f"variants-{name}-{device}")  # fmt: skip
        assert result.best is not None, result.render()
        print(f"  {device:<11} #{name} tuned in the model: {result.best.label}", flush=True)
        plugins[k] = pb.tune.build_tuned([source], work / "all" / f"{name}-tuned-in-model-{device}.so", tuned=best, cpu=_plugin_cpu(args))
    verdict = pb.verify(work / "all" / "replaced.vmfb", model, plugins=plugins, baseline=work / "iree.vmfb")
    assert verdict.passed, verdict.render()
    return plugins


def _function(model: Path) -> str:
    import onnx

    return str(onnx.load(model, load_external_data=False).graph.name)


def _tuned_plugins(mlir: Path, model: Path, units: list[Unit], work: Path, device: str, args: argparse.Namespace) -> list[Path]:
    """The all-at-once module's plugins, each built with the knobs `tune` chose for its kernel
    alone on `device` (a kernel without knobs: as generated); the module verified with them."""
    plugins = []
    for unit in units:
        tag = _tag(unit)
        best, label = _tuned(_isolated(mlir, _members(unit), work / "groups" / tag, args), device, args)
        source = work / "all" / "kernels" / f"{_import_name(unit)}.c"
        if best is None:
            plugins.append(work / "all" / f"{_import_name(unit)}.so")
            continue
        print(f"  {device:<11} #{tag} tuned: {label}", flush=True)
        plugins.append(pb.tune.build_tuned([source], work / "all" / f"{_import_name(unit)}-tuned-{device}.so", tuned=best, cpu=_plugin_cpu(args)))
    verdict = pb.verify(work / "all" / "replaced.vmfb", model, plugins=plugins, baseline=work / "iree.vmfb")
    assert verdict.passed, verdict.render()
    return plugins


_ELEMENT = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i64": np.int64, "i32": np.int32, "i8": np.int8, "i1": np.bool_}


def _random_inputs(program_text: str, work: Path) -> list[str]:
    """A seeded .npy per argument of the isolated program (`@path`, as run and tune take them):
    floats in [-1, 1), integers in [0, 4)."""
    from pyree_build.models.isolate import argument_types

    rng = np.random.default_rng(0)
    inputs = []
    for k, (shape, element) in enumerate(argument_types(program_text)):
        dtype = _ELEMENT[element]
        values = rng.uniform(-1, 1, shape) if np.issubdtype(dtype, np.floating) else rng.integers(0, 4, shape)
        np.save(work / f"in{k}.npy", np.asarray(values).astype(dtype))
        inputs.append(f"@{work / f'in{k}.npy'}")
    return inputs


def _check_same(replaced: Path, plugin: Path, iree: Path, inputs: list[str]) -> None:
    from pyree_build.actions import checks

    arrays = [np.load(spec.removeprefix("@")) for spec in inputs]
    ours = pb.run(replaced, "group", arrays, plugins=[plugin])
    theirs = pb.run(iree, "group", arrays)
    for got, want in zip(ours, theirs):
        rtol, atol = checks.computed_tolerance(want)
        assert checks.close_elements(got, want, rtol=rtol, atol=atol).all(), f"{replaced}: the generated kernel differs from IREE's module"


class Isolated(NamedTuple):
    """One kernel cut out as a program of its own (models/isolate.py), with IREE's module of the
    same ops, the generated kernel replacing them, and the seeded inputs both are run on."""

    directory: Path
    iree: Path
    source: Path
    replaced: Path
    untuned: Path
    inputs: list[str]


def _isolated(mlir: Path, members: tuple[OpGroup, ...], d: Path, args: argparse.Namespace) -> Isolated:
    """The kernel of `members` (one group, or a merge) alone, its untuned plugin checked against
    IREE's module of the same ops."""
    from pyree_build.models.isolate import isolate

    program_path = isolate(mlir, tuple(g.index for g in members) if len(members) > 1 else members[0].index, d / "group.mlir")
    iree = pb.compile(program_path, d / "iree.vmfb", cpu=args.cpu)
    inner = [g.index for g in pb.ops(program_path) if g.replaceable]
    pb.replace(program_path, d / "kernels", ops=[tuple(inner) if len(inner) > 1 else inner[0]], imports=["k"], force=True)
    source = d / "kernels" / "k.c"
    untuned = pb.plugin(source, d / "untuned.so", cpu=_plugin_cpu(args))
    replaced = pb.compile(program_path, d / "replaced.vmfb", cpu=args.cpu, transform_spec=d / "kernels" / "spec.mlir", expect_imports=["k"])
    inputs = _random_inputs(program_path.read_text(), d)
    _check_same(replaced, untuned, iree, inputs)
    return Isolated(d, iree, source, replaced, untuned, inputs)


def _tuned(kernel: Isolated, device: str, args: argparse.Namespace) -> tuple[Path | None, str]:
    """`tune` (no --param) of the isolated kernel on `device`, checked against IREE's module of
    the same ops: the winner's best.json and label; (None, why) where the kernel declares no knobs.
    A second call with the same kernel and settings reuses the first's result."""
    if not declared_params([kernel.source]):
        return None, "no knobs: the per-op reference body"
    best = kernel.directory / f"best-{device}.json"
    result = pb.tune(kernel.source, best, module=kernel.replaced, function="group", inputs=kernel.inputs, reference=kernel.iree, device=device,
                     cpu=_plugin_cpu(args), budget=args.tune_budget, build_dir=kernel.directory / f"variants-{device}")  # fmt: skip
    assert result.best is not None, result.render()
    return best, result.best.label


def _plugin_cpu(args: argparse.Namespace) -> str:
    return "baseline" if args.cpu == "generic" else "host"


def _named_units(replaceable: list[OpGroup], names: str) -> list[Unit]:
    """The kernels `--units` names (`5+6+7,7`: groups, merged where joined by +), as `replace --ops` takes them."""
    by_index = {g.index: g for g in replaceable}
    units: list[Unit] = []
    for name in names.split(","):
        numbers = [int(n) for n in name.split("+")]
        missing = [n for n in numbers if n not in by_index]
        if missing:
            raise SystemExit(f"--units {name}: no replaceable group {missing[0]} (groups {sorted(by_index)})")
        units.append(tuple(by_index[n] for n in numbers) if len(numbers) > 1 else by_index[numbers[0]])
    return units


def run_groups(name: str, work: Path, args: argparse.Namespace) -> None:
    """Each replaceable group of a model (merges as run_model makes them) as a program of its
    own (models/isolate.py): IREE's module of exactly those ops against the generated kernel,
    untuned and tuned (`tune`, no --param, against IREE's module), interleaved."""
    work.mkdir(parents=True, exist_ok=True)
    about, build, _ = MODELS[name]
    model = Path(onnx_models.save(build(), work / f"{name}.onnx"))
    mlir = pb.import_onnx(model, work / f"{name}.mlir", force=True)
    replaceable = [g for g in pb.ops(mlir) if g.replaceable]
    units = _merged(mlir, replaceable, work) if not args.units else _named_units(replaceable, args.units)
    print(f"\n{about}: each of {len(units)} kernels against IREE's module of the same ops, cpu {args.cpu}, {args.rounds} rounds alternated")
    for unit in units:
        members, tag, label = _members(unit), _tag(unit), _label(unit)
        if args.only and not re.search(args.only, label):
            continue
        kernel = _isolated(mlir, members, work / "groups" / tag, args)
        for device in args.devices.split(","):
            sides: list[tuple[Path, list[Path]]] = [(kernel.iree, []), (kernel.replaced, [kernel.untuned])]
            best, tuned_label = (None, "defaults") if args.no_tune else _tuned(kernel, device, args)
            if best is not None:
                tuned_plugin = pb.tune.build_tuned([kernel.source], kernel.directory / f"tuned-{device}.so", tuned=best, cpu=_plugin_cpu(args))
                sides.append((kernel.replaced, [tuned_plugin]))
            timed = pb.bench.compare_many(sides, "group", inputs=kernel.inputs, device=device, rounds=args.rounds)
            cells = [f"untuned {timed.sides[1].ratio:.2f}x ({timed.sides[1].ratio_min:.2f} - {timed.sides[1].ratio_max:.2f})"]
            if len(timed.sides) > 2:
                # tune kept the kernel as written: the two columns are one plugin, timed twice (the noise, seen).
                same = " = untuned, byte for byte" if sides[2][1][0].read_bytes() == kernel.untuned.read_bytes() else ""
                cells.append(f"tuned {timed.sides[2].ratio:.2f}x ({timed.sides[2].ratio_min:.2f} - {timed.sides[2].ratio_max:.2f}) [{tuned_label}{same}]")
            print(f"  {label:<48} {device:<11} IREE {_fmt(timed.sides[0].median_ms):>10}  " + "  ".join(cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"which of {', '.join(CASES)} (default all)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--devices", default="local-sync,local-task")
    parser.add_argument("--cpu", choices=("generic", "host"), default="generic")
    parser.add_argument("--tune-budget", type=float, default=20.0, help="tune's budget in seconds, per case and device")
    parser.add_argument("--no-tune", action="store_true", help="time the untuned kernels only")
    parser.add_argument(
        "--tune-in",
        choices=("alone", "model"),
        default="alone",
        help="with --models: tune each kernel cut out alone (default; shared with --groups) or in turn inside the whole model (tune --plugin)",
    )
    parser.add_argument("--keep", type=Path, help="work in this directory (kept) instead of a temporary one")
    parser.add_argument("--models", help=f"whole models instead of cases: {', '.join(MODELS)}")
    parser.add_argument(
        "--only", help="with --models: only the kernels whose label (#N sources) this regular expression finds (the all-at-once row is always made)"
    )
    parser.add_argument(
        "--groups", action="store_true", help="with --models: each group as a program of its own against IREE's module of the same ops, untuned and tuned"
    )
    parser.add_argument(
        "--units", help="with --groups: the kernels to cut out, as `replace --ops` names them (5+6+7,7), instead of the merges the whole-model run makes"
    )
    args = parser.parse_args()
    if args.keep:
        run_all(args, args.keep, parser)
        return
    with tempfile.TemporaryDirectory(prefix="pyree-kernels-bench.") as scratch:  # removed however the run ends
        run_all(args, Path(scratch), parser)


def run_all(args: argparse.Namespace, work: Path, parser: argparse.ArgumentParser) -> None:
    if args.models:
        for name in args.models.split(","):
            if name not in MODELS:
                parser.error(f"unknown model {name!r}: choose from {', '.join(MODELS)}")
            (run_groups if args.groups else run_model)(name, work / name, args)
        return
    for case in args.cases.split(","):
        if case not in CASES:
            parser.error(f"unknown case {case!r}: choose from {', '.join(CASES)}")
        run_case(case, work / case, args)


if __name__ == "__main__":
    main()
