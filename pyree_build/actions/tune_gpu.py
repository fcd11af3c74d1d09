"""tune's steps for a GPU kernel (what `replace --target vulkan|cuda|hip` writes): a variant is
the kernel built with the variant's -D values by its target's backend (the object IREE embeds:
SPIR-V, PTX, a code object), and the program compiled again with the replace spec against that
object, so each variant has a module of its own; it runs on the target's device.

The rest of a tune (the check against the reference, the benchmark, the choice, best.json) is
tune.py's, the same as for a CPU plugin: this module only says how a variant is built and which
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
from pyree_build.actions.models import gpunest
from pyree_build.actions.models import spec as spec_module
from pyree_build.backends.base import InlineKernelSource
from pyree_build.core import echo, files
from pyree_build.core.errors import PyreeError, require_file

PathLike = str | os.PathLike[str]
CPU = "llvm-cpu"
# The knob that is also the export's workgroup_size where the target launches the export's size (CUDA, HIP).
WORKGROUP_KNOB = gpunest.WORKGROUP_SIZE.name
# compile's keywords for the options that pick the GPU (the kernel's build reads the same values).
TARGET_KEYWORDS = ("sm", "vulkan_target", "gfx")


def check_options(target: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options that pick the GPU (`sm`, `gfx`, `vulkan_target`: compile's), each one of the
    target's own: another target's would be ignored without a word."""
    if target not in gpunest.TARGETS:
        raise PyreeError(f"unknown target '{target}' for tune", fix=f"use one of: {CPU}, {', '.join(gpunest.TARGETS)}")
    own = {o.dest: o.flags[0] for o in backends.get(target).compile_options}
    for key, value in options.items():
        if key not in own and value is not None:
            flag = "--" + key.replace("_", "-")
            raise PyreeError(f"{flag} is not an option of the {target} target", fix=f"leave out {flag}; {target} takes {', '.join(own.values()) or 'none'}")
    return {k: v for k, v in options.items() if v is not None}


def check_inputs(target: str, program: PathLike | None, spec: PathLike | None, module: PathLike | None, sources: int) -> tuple[str, str]:
    """The program and spec of a GPU tune, resolved; a PyreeError naming what is missing or extra."""
    if target not in gpunest.TARGETS:
        raise PyreeError(f"unknown target '{target}' for tune", fix=f"use one of: {CPU}, {', '.join(gpunest.TARGETS)}")
    if sources != 1:
        raise PyreeError(f"a {target} tune takes one kernel source, got {sources}", fix="tune each kernel replace wrote on its own")
    if module is not None:
        raise PyreeError(
            f"--module is the CPU's shared module; a {target} kernel is embedded in the module at compile time, so each variant is compiled anew",
            fix=f"give the program and the spec instead: --program PROGRAM.mlir --spec DIR/spec.mlir --target {target}",
        )
    if program is None or spec is None:
        raise PyreeError(
            f"a {target} tune needs the program and the spec that dispatches the kernel (each variant compiles them with its own kernel)",
            fix=f"pyree-build tune DIR/NAME{gpunest.SUFFIXES[gpunest.TARGETS[target]]} --program PROGRAM.mlir --spec DIR/spec.mlir --target {target} ...",
        )
    return str(require_file(program, "program").resolve()), str(require_file(spec, "transform spec").resolve())


def variant_spec(spec_text: str, entry: str, flags: Sequence[str]) -> str:
    """The spec a variant compiles with: where the kernel's export carries a workgroup_size (the
    block CUDA and HIP launch), it is the variant's PYREE_WG_SIZE; a Vulkan shader declares its
    own size, so its spec is the same for every variant."""
    size = dict(f.split("=", 1) for f in flags).get(WORKGROUP_KNOB)
    if size is None or not size.isdigit():
        return spec_text
    # Within the kernel's own export: never past the next export or executable (another kernel's size).
    export = re.compile(rf"(hal\.executable\.export public @{re.escape(entry)} (?:(?!hal\.executable\.).)*?<workgroup_size = \[)\d+( : index)", re.DOTALL)
    return export.sub(rf"\g<1>{size}\g<2>", spec_text, count=1)


def entry_of(source: PathLike, target: str) -> str:
    """The kernel's name in its object, as replace's spec exports it: a shader's is `main`."""
    return "main" if target == "vulkan" else Path(source).stem


def build(
    source: PathLike, target: str, *, spec: PathLike, include_dirs: Sequence[PathLike], defines: Sequence[str], options: Mapping[str, Any], out_dir: Path
) -> tuple[Path, Path]:
    """The kernel built into `out_dir` with `defines` (its target's backend, cached), and the spec
    the variant's module compiles with: (the object, the spec)."""
    src = Path(source)
    spec_text = Path(spec).read_text(encoding="utf-8")
    kernel = InlineKernelSource(
        source=src, program=spec_text, build_dir=out_dir / "objects", kind="system", include_dirs=[Path(d) for d in include_dirs],
        defines=list(defines), options=dict(options),
    )  # fmt: skip
    with echo.muted_commands():
        search = backends.get(target).build_inline_objects(kernel)
    found = sorted(p for d in search for p in Path(d).iterdir() if p.is_file() and p.name.startswith(src.stem) and p.suffix not in (".d", ".json"))
    if not found:
        raise PyreeError(f"the {target} backend built no object for {src.name} in {', '.join(map(str, search))}", file=src,
                         fix="build it by hand (pyree-build spirv / ptx / hsaco) to see why")  # fmt: skip
    variant_spec_path = out_dir / "spec.mlir"
    text = variant_spec(spec_text, entry_of(src, target), [d for d in defines if "=" in d])
    if not variant_spec_path.is_file() or variant_spec_path.read_text(encoding="utf-8") != text:
        with files.atomic_output(variant_spec_path) as tmp:
            tmp.write_text(text, encoding="utf-8")
    return found[0], variant_spec_path


def compile_variant(program: PathLike, target: str, *, spec: Path, objects: Path, import_name: str, options: Mapping[str, Any], out: Path) -> Path:
    """The program compiled with the variant's spec and kernel (the dispatch proven in the module)."""
    keywords = {k: v for k, v in options.items() if k in TARGET_KEYWORDS and v is not None}
    with echo.muted_commands():
        return compile_action.compile(
            program, out, target=target, transform_spec=spec, object_search_paths=[objects.parent], expect_imports=[import_name], **keywords
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
    """The winner's object into `output_dir` (the directory a module's object search path names),
    and, where the winner's spec differs from `spec` (the export's workgroup_size), that spec
    as `output_dir`/spec.mlir; the paths written."""
    out = Path(output_dir)
    with files.scratch_dir(out, "tune-apply") as build_dir:
        obj, tuned_spec = build(source, target, spec=spec, include_dirs=include_dirs, defines=defines, options=options or {}, out_dir=build_dir)
        written = [_place(obj, out / obj.relative_to(build_dir / "objects"))]
        if tuned_spec.read_bytes() != Path(spec).read_bytes():
            written.append(_place(tuned_spec, out / "spec.mlir"))
    return written


def _place(built: Path, target_path: Path) -> Path:
    target_path.parent.mkdir(parents=True, exist_ok=True)
    with files.atomic_output(target_path) as tmp:
        shutil.copyfile(built, tmp)
    return target_path


# The spec's default block size, for the messages: the variants that keep it compile with the spec as given.
DEFAULT_WORKGROUP_SIZE = spec_module.GPU_WORKGROUP_SIZE
