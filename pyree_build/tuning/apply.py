"""A tune applied: the winner's parameters as -D definitions (`tuned_defines`, checked as --param
is), and the kernel built with them (`build_tuned`: the CPU plugin, or a GPU kernel's object and
spec), as `tune --apply` and CMake's TUNED do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pyree_build.backends.llvm_cpu import plugins as plugin_action
from pyree_build.core import echo, files, lazy
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.tuning.params import parse_params
from pyree_build.tuning.plan import PathLike
from pyree_build.tuning.records import read_best, source_sha256

_tune_gpu = lazy.module("pyree_build.tuning.gpu")


def tuned_defines(tuned: PathLike) -> list[str]:
    """The winner's parameter values as -D definitions (`TILE=4`), to add to a build's own,
    checked as --param checks them: best.json is a file anyone may have edited, and a name
    such as `f(p)` or one holding a line break would define a function or add lines."""
    params = read_best(tuned)["winner"]["params"]
    try:
        checked = parse_params({name: [value] for name, value in params.items()})
    except PyreeError as error:
        raise PyreeError(
            f"not a tune result: {error.what}", file=tuned, fix="tune again (`pyree-build tune ... -o best.json`), or fix the winner's params"
        ) from None
    return [f"{name}={values[0]}" for name, values in checked.items()]


def build_tuned(
    sources: Sequence[PathLike],
    output: PathLike,
    *,
    tuned: PathLike,
    kind: str = "system",
    archs: Sequence[str] = (),
    cc: str = "zig",
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
    depfile: PathLike | None = None,
    jobs: int | None = None,
    cpu: str = "baseline",
    target: str = "llvm-cpu",
    spec: PathLike | None = None,
    target_options: Mapping[str, Any] | None = None,
) -> Path:
    """Build the plugin with the variant a tune chose (CMake: pyree_cpu_plugin(... TUNED best.json)).
    `target` vulkan, cuda or hip: the kernel's object into the directory `output` (and the spec
    there, where the winner's differs: the block size CUDA and HIP launch)."""
    data = read_best(tuned)
    if target != _tune_gpu.CPU:
        return _apply_gpu(sources, output, data, tuned=tuned, target=target, spec=spec, include_dirs=include_dirs, defines=defines, depfile=depfile,
                          options=target_options)  # fmt: skip
    recorded = {Path(s["path"]).name: s.get("sha256") for s in data.get("build", {}).get("sources", [])}
    for src in sources:
        digest = recorded.get(Path(src).name)
        if digest is not None and Path(src).is_file() and digest != source_sha256(Path(src)):
            echo.log_step(f"note: {tuned} was tuned for another version of {Path(src).name}; its choice may no longer be the fastest (tune again)")
    return plugin_action.plugin(
        sources, output, kind=kind, archs=archs, cc=cc, include_dirs=include_dirs, defines=[*defines, *tuned_defines(tuned)], depfile=depfile,
        jobs=jobs, cpu=cpu, depends_also=[Path(tuned).resolve()],  # a new tune rebuilds the plugin
    )  # fmt: skip


def _apply_gpu(sources: Sequence[PathLike], output: PathLike, data: Mapping[str, Any], *, tuned: PathLike, target: str, spec: PathLike | None,
               include_dirs: Sequence[str], defines: Sequence[str], depfile: PathLike | None, options: Mapping[str, Any] | None) -> Path:  # fmt: skip
    build = data.get("build", {})
    if build.get("target", _tune_gpu.CPU) != target:
        raise PyreeError(f"{tuned} was tuned for {build.get('target', 'the CPU')}, not {target}", file=tuned,
                         fix=f"apply it with --target {build.get('target', 'llvm-cpu')}, or tune the {target} kernel")  # fmt: skip
    spec_path = spec if spec is not None else build.get("spec")
    if not spec_path:
        raise PyreeError(f"applying a {target} tune needs the spec", file=tuned, fix="pass --spec DIR/spec.mlir")
    source = [os.fspath(s) for s in ([sources] if isinstance(sources, (str, os.PathLike)) else sources)]
    written = _tune_gpu.apply(source[0], output, target=target, spec=require_file(spec_path, "transform spec"), defines=[*defines, *tuned_defines(tuned)],
                              include_dirs=include_dirs, options=_tune_gpu.check_options(target, options or build.get("target_options") or {}))  # fmt: skip
    if depfile is not None:  # a new tune, or an edited kernel or spec, builds the object again
        files.write_depfile(depfile, written[0], [*source, os.fspath(spec_path), str(Path(tuned).resolve())], written)
    return written[0]
