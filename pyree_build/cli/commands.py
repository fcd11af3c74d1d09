"""What each verb runs: a core verb's function here turns its parsed options into one call of
an action and prints the result; a backend verb's declared function is called with its
options by `run_declared`. Actions are loaded on first use (core/lazy.py), so a command
imports only the modules its own work needs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pyree_build import backends
from pyree_build.backends.base import Verb
from pyree_build.cli.parser import compile_options
from pyree_build.client import protocol
from pyree_build.core import echo, lazy
from pyree_build.core import outputs as _outputs
from pyree_build.core.errors import PyreeError

# The action modules of `compile` and `run`, loaded when the verb runs.
COMPILE_MODULE = "pyree_build.actions.compile"
RUN_MODULE = "pyree_build.actions.run"

_compile = lazy.module(COMPILE_MODULE)
_run = lazy.module(RUN_MODULE)
_executables = lazy.module("pyree_build.actions.executables")
_bench = lazy.module("pyree_build.actions.bench")
_tune = lazy.module("pyree_build.tuning.sweep")
_tune_apply = lazy.module("pyree_build.tuning.apply")
_sample_runner = lazy.module("pyree_build.actions.sample_runner")
_scaffold = lazy.module("pyree_build.actions.scaffold")
_doctor = lazy.module("pyree_build.actions.doctor")
_cache = lazy.module("pyree_build.cache.local")
_plans = lazy.module("pyree_build.client.plans")
_importer = lazy.module("pyree_build.models.ir.importer")
_torch_import = lazy.module("pyree_build.models.ir.torch_import")
_verify = lazy.module("pyree_build.models.verify")
_ops = lazy.module("pyree_build.models.ops")
_merge = lazy.module("pyree_build.models.ir.merge")
_replace = lazy.module("pyree_build.models.replace")

# compile's own keywords for backend options; any other backend option goes in `target_options`.
COMPILE_KEYWORDS = ("cpu", "sm", "vulkan_target", "gfx")


def _timeout(a: argparse.Namespace) -> float:
    return _run.DEFAULT_RUN_TIMEOUT_S if a.timeout is None else a.timeout


def _target_options(a: argparse.Namespace, keywords: Sequence[str] = COMPILE_KEYWORDS) -> dict[str, Any]:
    """Values of backend compile options that are not the verb's own `keywords`: the chosen
    target's that were given, and any other's set to more than its default (refused later)."""
    chosen = backends.get(a.target).compile_options
    chosen_dests = {o.dest for o in chosen}
    values = {}
    for option in (*chosen, *compile_options(False)):
        value = getattr(a, option.dest, None)
        if option.dest not in keywords and value is not None and (option.dest in chosen_dests or value != option.kwargs.get("default")):
            values[option.dest] = value
    return values


def compile_command(a: argparse.Namespace) -> None:
    target_options = _target_options(a)
    out = _compile.compile(
        a.source, a.output, target=a.target, cpu=a.cpu, sm=a.sm, object_search_paths=a.object_search_paths,
        flags=a.extra, depfile=a.depfile, substitutions=a.substitutions, substitute_from=a.substitute_from,
        transform_spec=a.transform_spec, pdl_spec=a.pdl_spec, expect_imports=a.expect_imports, preprocess=a.preprocess,
        vulkan_target=a.vulkan_target, gfx=a.gfx, link_bitcode=a.link_bitcode,
        **({"target_options": target_options} if target_options else {}),
    )  # fmt: skip
    echo.log_step(f"wrote {out}")


def run_command(a: argparse.Namespace) -> None:
    if a.check_prefixes and not a.check_file:
        raise PyreeError("--check-prefix selects lines of a --check-file, and none was given", fix="add --check-file FILE")
    said = echo.lines_written()
    with _plans.recording() as read:  # what the run reads, for its plan (client/plans.py)
        result = _run.run(
            a.module, a.function, inputs=a.inputs, plugins=a.plugins, device=a.device, expect=a.expect,
            check_file=a.check_file, skip_unavailable=a.skip_unavailable, check_prefixes=a.check_prefixes, timeout=_timeout(a),
            expect_close=a.expect_close, rtol=a.rtol, atol=a.atol, handed_over=_plans.take_outcome,
        )  # fmt: skip
    quiet_before = echo.lines_written() == said
    if not a.quiet:
        sys.stdout.write(result.stdout)
    checked = a.expect or a.check_file or a.expect_close
    if checked:
        echo.log_step(f"output check passed ({result.seconds:.2f} s)")
    if quiet_before:  # for the native client to run itself next time
        _plans.remember_run(
            a.command_line, result.ran, read, device=a.device, check_file=a.check_file, timeout=_timeout(a),
            printed="" if a.quiet else result.stdout, check_line="output check passed ({seconds} s)\n" if checked and echo.VERBOSITY == 1 else None,
            quiet=a.quiet,
        )  # fmt: skip


def dump_command(a: argparse.Namespace) -> None:
    target_options = _target_options(a, keywords=("sm",))
    index = _executables.dump(
        a.source, a.output_dir, target=a.target, sm=a.sm, flags=a.extra, transform_spec=a.transform_spec, pdl_spec=a.pdl_spec,
        object_search_paths=a.object_search_paths, force=a.force, **({"target_options": target_options} if target_options else {}),
    )  # fmt: skip
    print(_executables.describe(index, a.output_dir))
    echo.log_step(f"wrote {Path(a.output_dir) / 'index.json'}")


def bench_command(a: argparse.Namespace) -> None:
    common = dict(
        function=a.function, inputs=a.inputs, plugins=a.plugins, device=a.device, repetitions=a.repetitions,
        skip_unavailable=a.skip_unavailable, timeout=_timeout(a),
    )  # fmt: skip
    if a.compare:
        if len(a.modules) < 2:
            raise PyreeError(f"--compare takes two modules or more, got {len(a.modules)}", fix="pyree-build bench --compare A.vmfb B.vmfb ...")
        sides = [_bench.parse_side(m) for m in a.modules]
        if len(sides) == 2:
            (module_a, own_a), (module_b, own_b) = sides
            print(_bench.compare(module_a, module_b, plugins_a=own_a, plugins_b=own_b, rounds=a.rounds, **common).render())
        else:
            print(_bench.compare_many(sides, rounds=a.rounds, **common).render())
        return
    if len(a.modules) != 1:
        raise PyreeError(f"bench takes one module, got {len(a.modules)}", fix="pass one module, or --compare A.vmfb B.vmfb")
    print(_bench.bench(a.modules[0], **common).render())


def _ray_resources(text: str | None) -> dict[str, float]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise PyreeError(f"--ray-resources is not JSON: {exc}", fix="e.g. --ray-resources '{\"bench_node\": 1}'") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in value.items()):
        raise PyreeError(f"--ray-resources must map resource names to amounts, got {text}", fix="e.g. --ray-resources '{\"bench_node\": 1}'")
    return {k: float(v) for k, v in value.items()}


def tune_command(a: argparse.Namespace) -> None:
    c_options = dict(kind=a.kind, archs=a.archs, cc=a.cc, include_dirs=a.include_dirs, defines=a.defines, cpu=a.cpu)
    gpu = {dest: getattr(a, dest) for dest in ("vulkan_target", "sm", "gfx") if getattr(a, dest) is not None}
    if a.apply:
        out = _tune_apply.build_tuned(
            a.sources, a.output, tuned=a.apply, depfile=a.depfile, jobs=a.jobs, target=a.target, spec=a.spec, target_options=gpu, **c_options
        )
        echo.log_step(f"wrote {out} ({' '.join('-D' + d for d in _tune_apply.tuned_defines(a.apply))})")
        return
    # No --param: tune sweeps the knobs the source declares (`// pyree-tune:` lines).
    if not a.function:
        raise PyreeError(
            "tune needs --function", fix="pyree-build tune SRC.c --param NAME=V1,V2 --module M.vmfb --function F --reference REF.vmfb -o best.json"
        )
    result = _tune.tune(
        a.sources, a.output, params=a.params, module=a.module, function=a.function, inputs=a.inputs, reference=a.reference, onnx=a.onnx,
        expect_output=a.expect_output, device=a.device, rtol=a.rtol, atol=a.atol, timeout=a.timeout, spread=a.spread, budget=a.budget,
        max_rounds=a.max_rounds, repetitions=a.repetitions, build_dir=a.build_dir, jobs=a.jobs, ray=a.ray,
        ray_resources=_ray_resources(a.ray_resources), depfile=a.depfile, target=a.target, program=a.program, spec=a.spec, target_options=gpu,
        plugins=a.plugins, **c_options,
    )  # fmt: skip
    if not a.quiet:
        print(result.render())
    assert result.best is not None
    echo.log_step(f"wrote {result.output}: best {result.best.label} ({' '.join('-D' + f for f in result.best.flags)})")


def import_command(a: argparse.Namespace) -> None:
    if Path(a.model).suffix == ".pt2":  # a program saved with torch.export.save
        echo.log_step(f"wrote {_torch_import.import_pt2(a.model, a.output, force=a.force)}")
        return
    out = _importer.import_onnx(
        a.model, a.output, opset_version=a.opset_version, data_dir=a.data_dir, externalize_params=a.externalize_params, depfile=a.depfile,
        timeout=a.timeout,
        force=a.force,
    )  # fmt: skip
    echo.log_step(f"wrote {out}")


def verify_command(a: argparse.Namespace) -> None:
    result = _verify.verify(
        a.module, a.onnx_model, torch=a.torch_program, function=a.function, inputs=a.inputs, input_files=a.input_files, plugins=a.plugins, baseline=a.baseline,
        seed=a.seed, trials=a.trials, rtol=a.rtol, atol=a.atol, device=a.device, skip_unavailable=a.skip_unavailable,
    )  # fmt: skip
    if not a.quiet:
        print(result.render())
    rtol = f"rtol {result.rtol:g}" if result.rtol is not None else "rtol 0.0001"
    atol = f"atol {result.atol:g}" if result.atol is not None else "atol 1e-05 x each output's largest magnitude"
    if (result.rtol is None or result.atol is None) and any(o.rtol == _verify.FLOAT16_TOLERANCE for t in result.trials for o in t.outputs):
        atol += " (float16: 0.004 for both)"
    failed = [o for t in result.trials for o in t.outputs if not o.passed]
    indices = sorted({o.index for o in failed})
    failing_sets = [t for t in result.trials if not t.passed]
    sets = f" on {len(failing_sets)} of {len(result.trials)} sets of inputs" if len(result.trials) > 1 else ""
    reference = _reference_text(failed[0].reference, possessive=True) if failed else ""
    if result.iree_differs:
        raise PyreeError(
            f"IREE's own module differs from the reference: {len(indices)} output(s) of {result.function} differ from {reference}{sets} "
            f"({rtol}, {atol}), and the baseline {result.baseline} gives the same values",
            file=result.module,
            details="\n".join(o.render() for o in failed) if a.quiet else None,
            fix="not your kernel: the module without it computes the same; report the op to IREE, or check the model's opset and types",
        )
    if failed:
        blame = "fix the kernel (a plugin or substituted executable) that computes them; loosen --rtol / --atol only for rounding"
        if result.baseline is None:
            blame += "; pass --baseline UNREPLACED.vmfb (the model compiled without your kernel) to tell IREE's own differences from the kernel's"
        raise PyreeError(
            f"{len(indices)} of {len(result.outputs)} outputs of {result.function} differ from {reference}{sets} ({rtol}, {atol})",
            file=result.module,
            details="\n".join(o.render() for o in failed) if a.quiet else None,
            fix=blame,
        )
    sets = f" on {len(result.trials)} sets of inputs" if len(result.trials) > 1 else ""
    echo.log_step(
        f"verified {result.function} against {_reference_text(result.outputs[0].reference)}: {len(result.outputs)} output(s){sets} within {rtol}, {atol}"
    )


def _reference_text(reference: str, *, possessive: bool = False) -> str:
    """How a verify message names its reference: onnxruntime, torch, or the stored outputs."""
    if reference == "stored":
        return "the stored outputs"
    return f"{reference}'s" if possessive else reference


def _split(values: list[str]) -> list[str]:
    return [v for value in values for v in value.split(",") if v]


def ops_command(a: argparse.Namespace) -> None:
    print(_ops.render(_ops.ops(a.source, targets=_split(a.targets), timeout=a.timeout), as_json=a.json))


def replace_command(a: argparse.Namespace) -> None:
    numbers = [_merge.parse(value) for value in _split(a.ops)]
    written = _replace.replace(
        a.source, a.output_dir, ops=numbers, imports=_split(a.imports), kind=a.kind, onnx=a.onnx, function=a.function, dynamic=a.dynamic, force=a.force,
        target=a.target, timeout=a.timeout,
    )  # fmt: skip
    for path in written:
        echo.log_step(f"wrote {path}")


def samples_command(a: argparse.Namespace) -> int:
    return _sample_runner.main_job(Path(a.build_dir), tests_regex=a.tests_regex, jobs=a.jobs)


def new_command(a: argparse.Namespace) -> None:
    out = _scaffold.new_project(a.directory, name=a.name, force=a.force, import_name=a.import_name, import_args=a.import_args)
    written = [name for name in _outputs.read_manifest(out) if "/" not in name]  # the project's top files, as `new` recorded them
    echo.log_step(f"wrote {out}: {', '.join(written)}")
    echo.log_step(f'next: cmake -G Ninja -S {out} -B {out}/build -Dpyree_build_DIR="$(pyree-build --cmake-dir)"')


def cache_command(a: argparse.Namespace) -> None:
    if a.action == "clear":
        removed, left = _cache.cache_clear()
        _plans.forget()  # what the native client would run without pyree_build's checks
        print(f"removed {removed} entries")
        if left:
            print(f"left {len(left)} files the cache did not write, e.g. {left[0]}")
        return
    info = _cache.cache_info()
    if info["root"] is None:
        print(f"cache: off ({_cache.CACHE_ENV}=off)")
    else:
        print(f"cache: {info['root']}\nentries: {info['entries']}\nsize: {int(info['bytes']) / 1e6:.1f} MB")
        if not info["marked"]:
            print(f"note: not a pyree_build cache yet (no {_cache._TAG}); the first cached build marks a new or empty directory")


def server_command(a: argparse.Namespace) -> None:
    try:
        where = protocol.socket_path(create=False)
        report = protocol.control(a.action)
    except protocol.NoContext as err:
        print(f"server: none for this process ({err}: every command runs in its own process)")
        return
    except (protocol.Unsafe, OSError) as err:
        raise PyreeError(f"cannot reach the server: {err}", fix="pyree-build server stop, or PYREE_BUILD_SERVER=off to run in process") from None
    if report is None:
        print(f"server: not running (socket {where})")
        return
    if a.action == "stop":
        pid = int(str(report["pid"]))
        deadline = time.monotonic() + 30
        while protocol.alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        print(f"server: stopped (pid {pid}, {report['requests']} requests served)")
        return
    print(
        f"server: running\npid: {report['pid']}\nsocket: {report['socket']}\nuptime: {report['uptime_s']} s\n"
        f"requests: {report['requests']}\nidle timeout: {report['idle_timeout_s']:g} s\npython: {report['python']}\n"
        f"pages copied ahead: {report.get('learned_pages', 0)} (what earlier workers wrote, copied by the next ones while they wait)\n"
        f"facts known: {report.get('facts_known', 0)} (what earlier workers read or found out about files, known to the next ones)\n"
        f"served again: {report.get('served_again', 0)} (commands a worker served after an earlier one, put back as it was forked)"
    )


def doctor_command(a: argparse.Namespace) -> int:
    return _doctor.report()


COMMANDS: dict[str, Callable[[argparse.Namespace], int | None]] = {
    "compile": compile_command,
    "run": run_command,
    "import": import_command,
    "verify": verify_command,
    "ops": ops_command,
    "replace": replace_command,
    "dump": dump_command,
    "bench": bench_command,
    "tune": tune_command,
    "samples": samples_command,
    "new": new_command,
    "cache": cache_command,
    "doctor": doctor_command,
    "server": server_command,
}


def _takes(function: Callable[..., Any], name: str) -> bool:
    """Whether `function` has a parameter `name` (read from its code: `inspect` costs start-up time)."""
    code = getattr(getattr(function, "__wrapped__", function), "__code__", None)
    return code is not None and name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]


def _show(result: object) -> None:
    """A backend verb's result as the CLI shows every build: paths as `wrote PATH`, text as it is."""
    if isinstance(result, str):
        print(result)
    elif isinstance(result, Path):
        echo.log_step(f"wrote {result}")
    elif isinstance(result, (list, tuple)):
        for item in result:
            _show(item)


def run_declared(verb: Verb, a: argparse.Namespace) -> None:
    """Call a backend verb's function with its options' values (and -j where it takes `jobs`)."""
    function = verb.load()
    kwargs = {o.dest: getattr(a, o.dest) for o in verb.options}
    if _takes(function, "jobs"):
        kwargs["jobs"] = a.jobs
    _show(function(**kwargs))


def dispatch(a: argparse.Namespace) -> int | None:
    """Run the verb the command line chose."""
    command = COMMANDS.get(a.verb)
    if command is not None:
        return command(a)
    run_declared(a.declared_verb, a)
    return None
