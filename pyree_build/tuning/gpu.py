"""tune's steps for a GPU kernel (what `replace --target vulkan|cuda|hip` writes): a variant is
the kernel built with the variant's -D values by its target's backend (the object IREE embeds:
SPIR-V, PTX, a code object), and the program compiled again with the replace spec against that
object, so each variant has a module of its own; it runs on the target's device.

The rest of a tune (the check against the reference, the benchmark, the choice, best.json) is
the other tuning/ modules', the same as for a CPU plugin: this module only says how a variant is built and which
module it runs with. Targets are asked of the registry (build_inline_objects builds a kernel
source into the directory iree-compile searches), never named here.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pyree_build import backends
from pyree_build.actions import compile as compile_action
from pyree_build.backends.base import InlineKernelSource
from pyree_build.core import echo, files
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.models.codegen import gpu_source

PathLike = str | os.PathLike[str]
CPU = "llvm-cpu"
# The knob that is also the export's workgroup_size where the target launches the export's size (CUDA, HIP).
WORKGROUP_KNOB = gpu_source.WORKGROUP_SIZE.name
# compile's keywords for the options that pick the GPU (the kernel's build reads the same values).
TARGET_KEYWORDS = ("sm", "vulkan_target", "gfx")


def check_options(target: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options that pick the GPU (`sm`, `gfx`, `vulkan_target`: compile's), each one of the
    target's own: another target's would be ignored without a word."""
    if target not in gpu_source.TARGETS:
        raise PyreeError(f"unknown target '{target}' for tune", fix=f"use one of: {CPU}, {', '.join(gpu_source.TARGETS)}")
    own = {o.dest: o.flags[0] for o in backends.get(target).compile_options}
    for key, value in options.items():
        if key not in own and value is not None:
            flag = "--" + key.replace("_", "-")
            raise PyreeError(f"{flag} is not an option of the {target} target", fix=f"leave out {flag}; {target} takes {', '.join(own.values()) or 'none'}")
    return {k: v for k, v in options.items() if v is not None}


def check_inputs(target: str, program: PathLike | None, spec: PathLike | None, module: PathLike | None, sources: Sequence[str]) -> tuple[str, str]:
    """The program and spec of a GPU tune, resolved; a PyreeError naming what is missing or extra
    (the sources of the spec's other kernels included: before any variant is built)."""
    if target not in gpu_source.TARGETS:
        raise PyreeError(f"unknown target '{target}' for tune", fix=f"use one of: {CPU}, {', '.join(gpu_source.TARGETS)}")
    if len(sources) != 1:
        raise PyreeError(f"a {target} tune takes one kernel source, got {len(sources)}", fix="tune each kernel replace wrote on its own")
    if module is not None:
        raise PyreeError(
            f"--module is the CPU's shared module; a {target} kernel is embedded in the module at compile time, so each variant is compiled anew",
            fix=f"give the program and the spec instead: --program PROGRAM.mlir --spec DIR/spec.mlir --target {target}",
        )
    if program is None or spec is None:
        raise PyreeError(
            f"a {target} tune needs the program and the spec that dispatches the kernel (each variant compiles them with its own kernel)",
            fix=f"pyree-build tune DIR/NAME{gpu_source.SUFFIXES[gpu_source.TARGETS[target]]} --program PROGRAM.mlir --spec DIR/spec.mlir --target {target} ...",
        )
    checked_program, checked_spec = require_file(program, "program").resolve(), require_file(spec, "transform spec").resolve()
    others_of(checked_spec.read_text(encoding="utf-8", errors="replace"), Path(sources[0]).stem, checked_spec, target)
    return str(checked_program), str(checked_spec)


def variant_spec(spec_text: str, kernel: str, flags: Sequence[str]) -> str:
    """The spec a variant compiles with: in the kernel's executable (`@<kernel>_executable`, as
    replace names it), the workgroups counted for the variant's PYREE_WG_SIZE (the count region
    divides the result's elements by it) and, where the export carries a workgroup_size (the
    block CUDA and HIP launch), that size too; other kernels' executables are left as they are.
    A Vulkan shader declares its own size: there the count is what changes."""
    size = dict(f.split("=", 1) for f in flags).get(WORKGROUP_KNOB)
    if size is None or not size.isdigit() or int(size) < 1:
        return spec_text
    # Never past the kernel's executable: the next executable or the call function that follows it.
    within = rf"(@{re.escape(kernel)}_executable\b(?:(?!hal\.executable\.source|util\.func).)*?"
    for marker in (r"ceildiv )\d+", r"<workgroup_size = \[)\d+"):
        spec_text = re.sub(within + marker, rf"\g<1>{size}", spec_text, count=1, flags=re.DOTALL)
    return spec_text


def build(
    source: PathLike,
    target: str,
    *,
    spec: PathLike,
    include_dirs: Sequence[PathLike],
    defines: Sequence[str],
    options: Mapping[str, Any],
    out_dir: Path,
    others: bool = True,
) -> tuple[Path, Path, list[Path]]:
    """The kernel built into `out_dir` with `defines` (its target's backend, cached), the spec the
    variant's module compiles with, and every directory its objects are searched in (with
    `others`, the spec's other kernels too, built as they are from their sources beside it):
    (object, spec, search)."""
    src = Path(source)
    spec_text = Path(spec).read_text(encoding="utf-8")
    search = _build_kernel(src, target, spec_text, include_dirs, defines, options, out_dir / "objects")
    found = sorted(p for d in search for p in Path(d).iterdir() if p.is_file() and p.suffix not in (".d", ".json") and _kernel_of(p.name) == src.stem)
    if not found:
        raise PyreeError(f"the {target} backend built no object for {src.name} in {', '.join(map(str, search))}", file=src,
                         fix="build it by hand (pyree-build spirv / ptx / hsaco) to see why")  # fmt: skip
    for other in others_of(spec_text, src.stem, Path(spec), target) if others else []:
        search += _build_kernel(other, target, spec_text, include_dirs, [], options, out_dir / "others")
    variant_spec_path = out_dir / "spec.mlir"
    text = variant_spec(spec_text, src.stem, [d for d in defines if "=" in d])
    if not variant_spec_path.is_file() or variant_spec_path.read_text(encoding="utf-8") != text:
        with files.atomic_output(variant_spec_path) as tmp:
            tmp.write_text(text, encoding="utf-8")
    return found[0], variant_spec_path, list(dict.fromkeys(search))


def _build_kernel(src: Path, target: str, spec_text: str, include_dirs: Sequence[PathLike], defines: Sequence[str], options: Mapping[str, Any],
                  build_dir: Path) -> list[Path]:  # fmt: skip
    kernel = InlineKernelSource(
        source=src, program=spec_text, build_dir=build_dir, kind="system", include_dirs=[Path(d) for d in include_dirs], defines=list(defines),
        options=dict(options),
    )  # fmt: skip
    with echo.muted_commands():
        return [Path(d) for d in backends.get(target).build_inline_objects(kernel)]


def _kernel_of(object_name: str) -> str:
    """The kernel an object is built from, by replace's names: NAME.spv, NAME_sm_80.ptx, NAME.co."""
    return re.sub(r"_(sm_\d+[a-z]?|gfx\w+)$", "", object_name.rsplit(".", 1)[0])


def others_of(spec_text: str, kernel: str, spec: Path, target: str) -> list[Path]:
    """The sources of the spec's other kernels (one spec replaces several groups): a variant's
    module needs their objects too. They are beside the spec, where replace wrote them."""
    suffix = gpu_source.SUFFIXES[gpu_source.TARGETS[target]]
    names = dict.fromkeys(_kernel_of(Path(p).name) for p in re.findall(r'#hal\.executable\.object<\{path = "([^"]+)"', spec_text))
    sources = []
    for name in (n for n in names if n != kernel):
        source = spec.parent / f"{name}{suffix}"
        if not source.is_file():
            raise PyreeError(
                f"the spec also dispatches the kernel '{name}', whose source {source.name} is not beside it: each variant's module needs its object",
                file=spec, fix=f"tune with the directory `replace` wrote (spec.mlir and every kernel it names, {name}{suffix} included)",
            )  # fmt: skip
        sources.append(source)
    return sources


def compile_variant(program: PathLike, target: str, *, spec: Path, search: Sequence[Path], import_name: str, options: Mapping[str, Any], out: Path) -> Path:
    """The program compiled with the variant's spec and kernel (the dispatch proven in the module)."""
    keywords = {k: v for k, v in options.items() if k in TARGET_KEYWORDS and v is not None}
    with echo.muted_commands():
        return compile_action.compile(
            program, out, target=target, transform_spec=spec, object_search_paths=list(search), expect_imports=[import_name], **keywords
        )


def device_of(target: str, device: str | None) -> str:
    """The device a GPU tune runs on: the target's own (vulkan, cuda, hip), or one of it as given."""
    own = backends.get(target).devices
    if device is None:
        return own[0]
    if device.split("://", 1)[0] not in own:
        raise PyreeError(f"a {target} kernel's module cannot run on --device {device}", fix=f"leave out --device, or give {' or '.join(own)}")
    return device


def device_usable(target: str, device: str) -> bool:
    return bool(backends.get(target).probe(device.split("://", 1)[0])[0])


def require_device(target: str, device: str, built: int, directory: Path) -> None:
    """Stop before the first run where the target's device is not here: every variant was built
    and compiled (so a build error is found without the GPU), none can be checked or timed."""
    usable, reason = backends.get(target).probe(device.split("://", 1)[0])
    if usable:
        return
    raise PyreeError(
        f"{built} variant(s) of the {target} kernel were built and compiled (in {directory}), but checking and timing them needs a "
        f"{target} device, and this machine has none usable: {reason}",
        fix=f"run the same tune where a {target} GPU is; its best.json then builds the winner on any machine: "
        f"pyree-build tune SRC --target {target} --apply best.json --spec DIR/spec.mlir -o OBJECTS_DIR",
    )


def apply(source: PathLike, output_dir: PathLike, *, target: str, spec: PathLike, defines: Sequence[str], include_dirs: Sequence[PathLike] = (),
          options: Mapping[str, Any] | None = None) -> list[Path]:  # fmt: skip
    """The winner's object into `output_dir` (the directory a module's object search path names)
    and the spec it was timed with (`spec` with the winner's workgroups: variant_spec) as
    `output_dir`/spec.mlir; the paths written. Given another kernel's applied spec as `spec`,
    the result holds both kernels' choices (each changes only its own executable)."""
    out = Path(output_dir)
    with files.scratch_dir(out, "tune-apply") as build_dir:
        obj, tuned_spec, _ = build(source, target, spec=spec, include_dirs=include_dirs, defines=defines, options=options or {}, out_dir=build_dir,
                                   others=False)  # fmt: skip
        written = [_place(obj, out / obj.relative_to(build_dir / "objects")), _place(tuned_spec, out / "spec.mlir")]
    echo.log_step(f"wrote {written[1]} (the spec the winner was timed with: compile the module with it and --object-search-path {out})")
    return written


def _place(built: Path, target_path: Path) -> Path:
    target_path.parent.mkdir(parents=True, exist_ok=True)
    with files.atomic_output(target_path) as tmp:
        shutil.copyfile(built, tmp)
    return target_path
