"""`pb.load_inline`: a kernel and the program that calls it, given as strings, built and
loaded as a Python callable.

The strings are written into a directory named by their content (under the build cache),
so the same strings find the same files and every build step is a cache hit; other strings
never overwrite a plugin this process may have loaded. Each kernel file's suffix picks the
backend that builds it (`.c`: a CPU plugin, `.cu`: PTX, `.glsl`: SPIR-V, `.hip`: AMDGPU code
objects): objects a module embeds are built before iree-compile, plugins it loads after,
when its imports are known. A build error names the string and the line in it.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pyree_build import backends
from pyree_build.actions import inprocess, signature
from pyree_build.actions import run as run_action
from pyree_build.actions.compile import compile as compile_module
from pyree_build.backends.base import Backend, InlineKernelSource
from pyree_build.backends.llvm_cpu import elf
from pyree_build.cache import keys
from pyree_build.cache.local import work_dir
from pyree_build.core import args as argcheck
from pyree_build.core import files
from pyree_build.core.errors import PyreeError

PathLike = str | os.PathLike[str]
_PROGRAM = "program.mlir"
# Marks a directory as load_inline's: only such a directory (or an empty one) is written into,
# so a build_dir that holds the user's own files is refused, never overwritten.
_MARKER = ".pyree_build_inline"
_LABEL = r"(?P<label>mlir|c_source|args_call|files\['[^']+'\])"
# Where each compiler puts an error's line: clang and iree-compile (`NAME:12:5: error: ...`),
# glslang (`ERROR: NAME:12: ...`), NVRTC (`NAME(12): error: ...`).
_DIAGNOSTICS = [
    re.compile(rf"^{_LABEL}:(?P<line>\d+):(?:\d+:)?\s*error:\s*(?P<message>.*)$", re.MULTILINE),
    re.compile(rf"^ERROR:\s*{_LABEL}:(?P<line>\d+):\s*(?P<message>.*?)\s*$", re.MULTILINE),
    re.compile(rf"^{_LABEL}\((?P<line>\d+)\):\s*error:\s*(?P<message>.*)$", re.MULTILINE),
]


def _first_error(text: str) -> re.Match[str] | None:
    found = [m for pattern in _DIAGNOSTICS if (m := pattern.search(text))]
    return min(found, key=lambda m: m.start(), default=None)


class InlineKernel:
    """A function of a module built by `pb.load_inline`: call it with numpy arrays (or
    numbers, for scalar parameters); it returns the one result as an array, several as a
    tuple, none as None. `module`, `plugins` and `build_dir` are the files it runs.

    Built from a signature (`args=`), it also takes torch tensors and anything with
    `__dlpack__` (read without a copy on the CPU), checks each argument against the signature
    before the call, writes `inout` results back into the caller's arrays, and returns the
    `out` results as the first buffer argument's kind of array."""

    def __init__(self, module: Path, function: str, plugins: Sequence[Path], device: str, backend: Backend, sig: signature.Signature | None = None) -> None:
        self.module, self.function, self.plugins, self.device = module, function, tuple(plugins), device
        self.build_dir = (plugins[0] if plugins else module).parent
        self.signature = sig
        # IREE's Python runtime cannot read results back on every device (Vulkan on lavapipe).
        self._in_process = backend.runs_in_process
        self._bound: Callable[[Sequence[object]], list[np.ndarray]] | None = None

    def _run(self, inputs: Sequence[object]) -> list[np.ndarray]:
        """The module's results: in process through a function loaded once (the files, named by
        their content, never change), else through iree-run-module."""
        if not self._in_process:
            return run_action.run_to_arrays(self.module, self.function, list(inputs), plugins=list(self.plugins), device=self.device)
        if self._bound is None:
            self._bound = inprocess.bind(self.module, self.function, plugins=list(self.plugins), device=self.device)
        return self._bound(inputs)

    def __call__(self, *inputs: object) -> Any:
        if self.signature is None:
            results = self._run(inputs)
            if not results:
                return None
            return results[0] if len(results) == 1 else tuple(results)
        operands, _ = signature.bind(self.signature, inputs)
        results = self._run(operands)
        given = dict(zip((p.position for p in self.signature.operands), inputs))
        template = next((given[p.position] for p in self.signature.operands if p.is_buffer), None)
        returned = []
        for p, result in zip(self.signature.outputs, results):
            if p.kind == "inout":  # updated in place, as the signature says
                signature.as_array(given[p.position])[...] = result
            else:
                returned.append(signature.like(template, np.asarray(result)))
        if not returned:
            return None
        return returned[0] if len(returned) == 1 else tuple(returned)

    def __repr__(self) -> str:
        plugins = f", plugins={[str(p) for p in self.plugins]}" if self.plugins else ""
        return f"<pyree_build InlineKernel {self.function} of {self.module} on {self.device}{plugins}>"


def _backend_for(name: str, target: str | None) -> Backend:
    """The backend whose kernels have `name`'s suffix (and `target`, when one is given)."""
    suffix = Path(name).suffix
    owners = [b for b in backends.every() if suffix in b.inline_suffixes]
    if not owners:
        known = sorted({f"{s} ({b.name})" for b in backends.every() for s in b.inline_suffixes})
        raise PyreeError(f"no target builds kernel sources named {name!r}", fix=f"name the file with one of the suffixes {', '.join(known)}")
    if target is not None and all(b.name != target for b in owners):
        raise PyreeError(
            f"{name!r} is a kernel for {owners[0].name}, not for target {target!r}", fix=f"pass target={owners[0].name!r}, or a kernel for {target}"
        )
    return next(b for b in owners if target is None or b.name == target)


def _build_dir(texts: Mapping[str, str], settings: Mapping[str, Any], build_dir: PathLike | None) -> Path:
    """A directory named by everything that decides what is built in it, under `build_dir`
    when one is given (claimed as load_inline's first): other strings never rewrite the
    module or plugin a kernel already returned runs, in this process or another."""
    key = keys.key_of({"texts": texts, "settings": settings}, length=20)
    if build_dir is not None:
        _claim(Path(build_dir))
        return Path(build_dir) / key
    # Without a cache, a directory of this user's in the temporary directory (never shared).
    root = work_dir("inline") or Path(tempfile.gettempdir()) / f"pyree_build-inline-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    return root / key


def _relabeled(error: PyreeError, labels: Mapping[str, str], texts: Mapping[str, str], directory: str) -> PyreeError:
    """`error` with each written file's path replaced by the string it came from, and the
    first error located in a string shown as that string's line."""

    def named(text: str | None) -> str | None:
        if text is None:
            return None
        for path, label in labels.items():
            text = text.replace(path, label)
        return text.replace(directory, "")  # other files of the build (a generated entry) by name

    what, details, file = named(error.what) or error.what, named(error.details), named(error.file)
    found = _first_error(details or "") or _first_error(what)
    if found:  # the string and its line say where: no file of ours to name
        label, line = found["label"], int(found["line"])
        lines = texts[label].splitlines()
        source_line = lines[line - 1] if 0 < line <= len(lines) else ""
        shown = f"{line:>5} | {source_line}\n" if source_line and source_line not in (details or "") else ""
        what, details, file = f"{label} line {line}: {found['message']}", shown + (details or what), None
    return PyreeError(what, file=file, fix=error.fix, details=details, command=error.command, exit_code=error.exit_code)


def load_inline(
    *,
    function: str,
    mlir: str | None = None,
    args: str | None = None,
    tile: int | None = None,
    c_source: str | None = None,
    files: Mapping[str, str] | None = None,
    kind: str = "system",
    target: str | None = None,
    device: str | None = None,
    flags: Sequence[str] = (),
    include_dirs: Sequence[PathLike] = (),
    defines: Sequence[str] = (),
    target_options: Mapping[str, Any] | None = None,
    name: str | None = None,
    build_dir: PathLike | None = None,
) -> InlineKernel:
    """Build `mlir` and its kernels (`c_source`, and `files` by name), cached; return `function` as a callable.
    With `args=` instead of `mlir=`, `c_source` holds a plain C function of that signature
    (actions/signature.py) and the program around it is generated."""
    if args is not None:
        if mlir is not None:
            raise PyreeError("pass mlir= or args=, not both", fix="args= generates the program that calls a plain C function; mlir= is a program of your own")
        return _load_signature(
            args, function, tile=tile, c_source=c_source, files=files, kind=kind, target=target, device=device, flags=flags,
            include_dirs=include_dirs, defines=defines, target_options=target_options, name=name, build_dir=build_dir,
        )  # fmt: skip
    mlir = _own_program(mlir, tile)
    # Each name is joined to the build directory: a directory part or `..` would write outside it.
    stem = "kernel" if name is None else argcheck.file_name(name, "name")
    for file_name in files or {}:
        argcheck.file_name(file_name, f"the files key {file_name!r}")
    if c_source is not None and f"{stem}.c" in (files or {}):
        raise PyreeError(f"c_source and files[{stem + '.c'!r}] would be the same file", fix="pass that C once, or give load_inline another name=")
    sources = {**({f"{stem}.c": c_source} if c_source is not None else {}), **(files or {})}
    owners = {file_name: _backend_for(file_name, target) for file_name in sources}
    chosen = {b.name for b in owners.values()} | ({target} if target else set())
    if len(chosen) > 1:
        raise PyreeError(f"kernels for more than one target: {', '.join(sorted(chosen))}", fix="load each target's kernels with its own pb.load_inline")
    backend = backends.get(chosen.pop() if chosen else "llvm-cpu")
    run_device = device or backend.devices[0]
    settings: dict[str, Any] = {"kind": kind, "target": backend.name, "flags": list(flags), "name": stem}
    settings |= {"include_dirs": [os.path.abspath(d) for d in include_dirs], "defines": list(defines), "target_options": dict(target_options or {})}
    directory = _build_dir({_PROGRAM: mlir, **sources}, settings, build_dir)
    labels = {str(directory / _PROGRAM): "mlir"} | {
        str(directory / n): "c_source" if n == f"{stem}.c" and c_source is not None else f"files['{n}']" for n in sources
    }
    texts = {"mlir": mlir} | {labels[str(directory / n)]: t for n, t in sources.items()}
    try:
        module, plugins = _build(directory, mlir, sources, owners, backend, settings)
        run_action.require_device(run_device, module=module)
    except PyreeError as error:
        raise _relabeled(error, labels, texts, f"{directory}{os.sep}") from None
    return InlineKernel(module, function, plugins, run_device, backend)


def _own_program(mlir: str | None, tile: int | None) -> str:
    """The caller's program, when load_inline is not given a signature."""
    if mlir is None:
        raise PyreeError(
            "load_inline needs the program: args= (the C function's signature) or mlir=",
            fix='pass args="in:f32[n], in:f32[n], out:f32[n]" for a plain C function, or mlir= with a program that calls your import',
        )
    if tile is not None:
        raise PyreeError("tile= splits the program generated from args=; mlir= programs dispatch themselves", fix="leave tile= out, or pass args=")
    return mlir


def _claim(directory: Path) -> None:
    """Make `directory` load_inline's, or refuse it when it holds files of someone else's."""
    marker = directory / _MARKER
    if marker.is_file():
        return
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise PyreeError(
            "build_dir is not empty and was not made by pb.load_inline: its files could be overwritten",
            file=directory,
            fix="pass a new or empty directory as build_dir, or leave build_dir out (a directory under the cache)",
        )
    files.prepare_output_dir(directory)
    marker.write_text("written by pyree_build's pb.load_inline\n")


def _write(directory: Path, texts: Mapping[str, str]) -> list[Path]:
    """The strings as files in `directory`; only what changed is written."""
    _claim(directory)
    paths = [directory / file_name for file_name in texts]
    files.settle([p for p, text in zip(paths, texts.values()) if files.write_text_if_changed(p, text)])
    return paths


def _build(
    directory: Path, mlir: str, sources: Mapping[str, str], owners: Mapping[str, Backend], backend: Backend, settings: Mapping[str, Any]
) -> tuple[Path, list[Path]]:
    program, *source_paths = _write(directory, {_PROGRAM: mlir, **sources})
    kernels = [
        InlineKernelSource(
            source=path,
            program=mlir,
            build_dir=directory,
            kind=settings["kind"],
            include_dirs=[Path(d) for d in settings["include_dirs"]],
            defines=list(settings["defines"]),
            options=settings["target_options"],
        )
        for path in source_paths
    ]
    search_paths = [p for k in kernels for p in owners[k.source.name].build_inline_objects(k)]
    module = compile_module(
        program,
        directory / f"{settings['name']}.vmfb",
        target=backend.name,
        object_search_paths=search_paths,
        flags=settings["flags"],
        target_options=settings["target_options"] or None,
    )
    plugins = [p for k in kernels for p in owners[k.source.name].build_inline_plugins(k, module)]
    return module, plugins


def _signature_backend(sig: signature.Signature, c_source: str | None, files: Mapping[str, str] | None, kind: str, target: str | None) -> tuple[Backend, str]:
    """The backend that builds a signature's C function, and that C, once the arguments are known to fit."""
    if c_source is None:
        raise PyreeError(f"args= describes a C function, but no c_source= defines {sig.function}", fix=f"pass c_source= with the C of {sig.function}")
    if kind not in ("system", "standalone", "embedded"):
        raise PyreeError(
            f"unknown plugin kind {kind!r}",
            fix="pass kind='system' (a .so for this host), kind='standalone' (a freestanding FatELF) or kind='embedded' (objects linked into the module)",
        )
    backend = backends.get(target or "llvm-cpu")
    if backend.name != "llvm-cpu":
        raise PyreeError(f"args= with c_source= builds a CPU plugin, not a {backend.name} kernel", fix="leave target= out (llvm-cpu)")
    return backend, c_source


def _load_signature(
    args_text: str,
    function: str,
    *,
    tile: int | None,
    c_source: str | None,
    files: Mapping[str, str] | None,
    kind: str,
    target: str | None,
    device: str | None,
    flags: Sequence[str],
    include_dirs: Sequence[PathLike],
    defines: Sequence[str],
    target_options: Mapping[str, Any] | None,
    name: str | None,
    build_dir: PathLike | None,
) -> InlineKernel:
    """The args= form: the program is generated from the signature alone and built in a
    directory of its own, so an edited function builds only a new plugin (each edit in a
    directory named by its content, loaded beside the earlier ones). kind='embedded' links the
    function into the module instead, so there each edit compiles the module again."""
    sig = signature.parse(args_text, function, tile=tile)
    if files:
        return _load_shader(sig, files, c_source=c_source, target=target, device=device, flags=flags, build_dir=build_dir)
    backend, c_source = _signature_backend(sig, c_source, files, kind, target)
    stem = "kernel" if name is None else argcheck.file_name(name, "name")
    run_device = device or backend.devices[0]
    embedded = kind == "embedded"
    program = signature.program(sig, objects=f"{stem}_call" if embedded else None, arch=elf.host_arch())
    all_flags = [*flags, *sig.compile_flags]
    program_settings = {"target": backend.name, "flags": all_flags, "target_options": dict(target_options or {}), "name": stem}
    program_dir = _build_dir({_PROGRAM: program}, program_settings, build_dir)
    kernel_files = {f"{stem}.c": c_source, f"{stem}_call.c": signature.adapter(sig, f"{stem}.c", static=embedded)}
    kernel_settings = {"kind": kind, "include_dirs": [os.path.abspath(d) for d in include_dirs], "defines": list(defines), "program": program_dir.name}
    kernel_dir = _build_dir(kernel_files, kernel_settings, build_dir)
    if embedded:  # the module holds the function: it is built beside the function's objects
        program_dir = kernel_dir
    labels = {str(program_dir / _PROGRAM): "mlir", str(kernel_dir / f"{stem}.c"): "c_source", str(kernel_dir / f"{stem}_call.c"): "args_call"}
    texts = {"mlir": program, "c_source": c_source, "args_call": kernel_files[f"{stem}_call.c"]}
    try:
        _, call_source = _write(kernel_dir, kernel_files)
        kernel = InlineKernelSource(
            source=call_source, program=program, build_dir=kernel_dir, kind=kind,
            include_dirs=[Path(d) for d in kernel_settings["include_dirs"]], defines=list(defines), options=dict(target_options or {}),
        )  # fmt: skip
        search_paths = backend.build_inline_objects(kernel) if embedded else []
        (program_path,) = _write(program_dir, {_PROGRAM: program})
        module = compile_module(
            program_path, program_dir / f"{stem}.vmfb", target=backend.name, object_search_paths=search_paths, flags=all_flags,
            target_options=target_options or None,
        )  # fmt: skip
        plugins = backend.build_inline_plugins(kernel, module)
        run_action.require_device(run_device, module=module)
    except PyreeError as error:
        raise _signature_error(_relabeled(error, labels, texts, f"{kernel_dir}{os.sep}"), sig) from None
    return InlineKernel(module, function, plugins, run_device, backend, sig)


def _signature_error(error: PyreeError, sig: signature.Signature) -> PyreeError:
    """A compiler's error in the generated call says how the function must be declared."""
    if "args_call" not in error.what:
        return error
    sizes = ", ".join(f"size_t {s}" for s in sig.sizes) or "(none)"
    fix = f"{sig.function} must take the buffers and scalars in args= order ({sig.text()}), then the sizes {sizes}; define it in c_source"
    return PyreeError(error.what, details=error.details, command=error.command, exit_code=error.exit_code, fix=fix)


def _load_shader(
    sig: signature.Signature, files: Mapping[str, str], *, c_source: str | None, target: str | None, device: str | None,
    flags: Sequence[str], build_dir: PathLike | None,
) -> InlineKernel:  # fmt: skip
    """args= with one compute shader (`files={"k.glsl": ...}`): the program that dispatches it
    one invocation per element of the first output is generated, then built as an mlir= one."""
    shaders = [name for name in files if _backend_for(name, target).name == "vulkan"]
    if c_source is not None or len(files) != 1 or not shaders:
        raise PyreeError(
            f"args= takes one C function (c_source=) or one compute shader (files={{'NAME.glsl': ...}}), not {', '.join(sorted(files)) or 'none'}"
            + (" and c_source" if c_source is not None else ""),
            fix="pass one kernel; for several, write the program yourself (mlir=)",
        )
    (name,) = shaders
    argcheck.file_name(name, f"the files key {name!r}")
    try:
        program = signature.shader_program(sig, f"{Path(name).stem}.spv", signature.local_size(files[name]))
    except PyreeError as error:
        raise PyreeError(error.what, file=None, fix=error.fix, details=f"in files[{name!r}]") from None
    built = load_inline(mlir=program, function=sig.function, files=dict(files), target="vulkan", device=device, flags=flags, build_dir=build_dir)
    return InlineKernel(built.module, sig.function, built.plugins, built.device, backends.get("vulkan"), sig)
