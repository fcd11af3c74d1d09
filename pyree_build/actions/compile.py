"""MLIR -> .vmfb with iree-compile: a pipeline of short steps over one record of the compile.

resolve inputs -> specs -> preprocess -> parameters -> target flags -> substitutions -> backend checks ->
run iree-compile (through the cache) -> post-checks. What a target adds (its flags, where it
looks for objects, its checks before and after, its error explanations) is asked of its
backend (pyree_build.backends); nothing here names a target.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pyree_build import backends
from pyree_build.actions import parameters, releases
from pyree_build.actions.specs import pipeline_files, spec_flags
from pyree_build.actions.specs import preprocess as run_preprocess
from pyree_build.backends.base import Backend, CompileJob
from pyree_build.cache.local import cached_action
from pyree_build.core import echo, formats, lazy, processes, readers, toolchain
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.files import scratch_dir, text_or_empty
from pyree_build.core.inputs import Inputs, compile_inputs, referenced_objects, resolve_object
from pyree_build.core.outputs import check_outputs
from pyree_build.core.records import field, record

# Substitution (and its dataclasses, ~8 ms) loads only for a compile that substitutes.
executables = lazy.module("pyree_build.actions.executables")

PathLike = str | os.PathLike[str]

_NOT_FOUND_OBJECT = re.compile(r'object file not found.*?#hal\.executable\.object<\{path = "([^"]+)"')


def target_flags(target: str, **options: Any) -> list[str]:
    """The iree-compile flags that select `target`, given its options by dest (`sm=80`)."""
    return backends.get(target).target_flags(options)


@record
class CompileRequest:
    """What the caller asked for, besides the source, output and target options."""

    target: str
    object_search_paths: Sequence[PathLike]
    flags: Sequence[str]
    depfile: PathLike | None
    substitutions: Sequence[str]
    substitute_from: PathLike | None
    transform_spec: PathLike | None
    pdl_spec: PathLike | None
    expect_imports: Sequence[str]
    preprocess: str | None
    link_bitcode: Sequence[PathLike]


@record
class CompileState:
    """One compile as it goes through the steps: each step reads what earlier ones filled in."""

    request: CompileRequest
    backend: Backend
    job: CompileJob
    pipeline: str | None = None
    spec_flags: list[str] = field(default_factory=list)
    parameter_flags: list[str] = field(default_factory=list)
    argv_tail: list[str] = field(default_factory=list)
    substituted: list[Path] = field(default_factory=list)
    reads: Inputs | None = None


def _outputs_inputs(src: Path, search: Sequence[Path], substitutions: Sequence[str], substitute_from: PathLike | None) -> list[Path]:
    """Every file a compile may read, so that none of them is taken as its output."""
    found = [src, parameters.archive_for(src)]
    found += [o for obj in referenced_objects(src.read_text(encoding="utf-8", errors="replace")) if (o := resolve_object(obj, search)[0])]
    found += [Path(item.partition("=")[2]) for item in substitutions if item.partition("=")[2]]
    if substitute_from is not None and Path(substitute_from).is_dir():
        found += [p for p in Path(substitute_from).iterdir() if p.is_file()]
    return found


def resolve_inputs(source: PathLike, output: PathLike, request: CompileRequest, backend: Backend, options: Mapping[str, Any]) -> CompileState:
    """Step 1: the source, the output (checked against every input), search paths and bitcode."""
    src = require_file(source, "MLIR source")
    search = [Path(p).resolve() for p in request.object_search_paths]
    (out,) = check_outputs([output], _outputs_inputs(src, search, request.substitutions, request.substitute_from), depfile=request.depfile)
    toolchain.iree_compile()  # a missing compiler is named before anything else is checked
    for s in search:
        if not s.is_dir():
            raise PyreeError("object search path is not a directory", file=s, fix="pass an existing directory to --object-search-path")
    text = src.read_text(encoding="utf-8", errors="replace")
    job = CompileJob(src, text, out, dict(options), search, [])
    job.search_paths = backend.search_paths(job)
    job.link_bitcode = [require_file(b, "bitcode").resolve() for b in request.link_bitcode]
    return CompileState(request, backend, job)


def add_specs(state: CompileState) -> None:
    """Step 2: transform / PDL specs as IREE flags; their files are inputs of the compile."""
    state.spec_flags, spec_files = spec_flags(transform_spec=state.request.transform_spec, pdl_spec=state.request.pdl_spec)
    state.job.spec_files = [*state.job.spec_files, *spec_files]


def add_preprocess(state: CompileState) -> None:
    """Step 3: an iree-opt pipeline run on the source first; the files it names are inputs."""
    if state.request.preprocess is None:
        return
    state.pipeline, pipeline_inputs = pipeline_files(state.request.preprocess)
    state.job.spec_files = [*state.job.spec_files, *pipeline_inputs]


def add_parameters(state: CompileState) -> None:
    """Step 4: the weights a program keeps in an archive beside it (an import's
    MODEL_params.irpa), imported back into the module: the archive is named by a flag, so it
    is keyed by content and listed in the depfile (see parameters.py)."""
    state.parameter_flags = parameters.import_flags(state.job.source, state.job.text, state.request.flags)


def add_target_flags(state: CompileState) -> None:
    """Step 5: the target's flags, where objects and bitcode are found, specs, parameters, then the caller's flags."""
    job = state.job
    state.argv_tail = [
        *state.backend.target_flags(job.options),
        *(f"--iree-hal-executable-object-search-path={s}" for s in job.search_paths),
        *([f"--iree-link-bitcode={','.join(map(str, job.link_bitcode))}"] if job.link_bitcode else []),
        *state.spec_flags,
        *state.parameter_flags,
        *state.request.flags,
    ]


def add_substitutions(state: CompileState) -> None:
    """Step 6: executables replaced by edited sources or objects (see executables.py)."""
    request = state.request
    if not request.substitutions and request.substitute_from is None:
        return
    sub_flags, state.substituted = executables.substitution_flags(
        state.job.source, target=request.target, substitutions=request.substitutions, substitute_from=request.substitute_from,
        sm=state.job.options.get("sm"), flags=[*state.spec_flags, *state.parameter_flags, *request.flags],
    )  # fmt: skip
    state.argv_tail += sub_flags


def check_before(state: CompileState) -> None:
    """Step 7: the backend's checks of the program, then every file iree-compile will read
    (objects it references, files named by flags) and where each name resolved: keyed by
    content, listed in the depfile."""
    state.backend.before_compile(state.job)
    for flag, path, what in readers.special_files_named(state.argv_tail):
        raise PyreeError(
            f"{flag} names {what}, not a regular file: iree-compile would wait on it for ever (a FIFO) or never finish reading it",
            file=path,
            fix="name a regular file",
        )
    state.reads = compile_inputs(state.job.source, state.argv_tail)


def _inputs(state: CompileState) -> list[Path]:
    assert state.reads is not None
    return [state.job.source, *state.reads.files, *state.job.link_bitcode, *state.substituted, *state.job.spec_files]


def run_compiler(state: CompileState) -> list[str]:
    """Step 8: iree-compile through the cache, the depfile renamed with the module; returns the files it read."""
    assert state.reads is not None
    key = [*state.argv_tail, *state.reads.resolution]
    if state.pipeline is not None:
        key.append(f"preprocess={state.pipeline}")
    tools_used = [toolchain.iree_compile(), *([toolchain.iree_opt()] if state.pipeline is not None else [])]
    return cached_action(
        "compile", key=key, inputs=_inputs(state), outputs=[state.job.output],
        build=functools.partial(_build, state), tools_used=tools_used, uncacheable=state.reads.uncacheable,
        check=lambda paths: formats.require_vmfb(paths[0]), depfile=state.request.depfile,
    )  # fmt: skip


def _build(state: CompileState, private: list[Path]) -> list[str]:
    """The build of a cache miss: preprocess into scratch if asked, compile into `private`."""
    (tmp,) = private
    job = state.job
    with contextlib.ExitStack() as stack:
        compile_src = job.source
        if state.pipeline is not None:
            compile_src = stack.enter_context(scratch_dir(job.output.parent, job.output.name)) / f"{job.source.stem}.preprocessed.mlir"
            run_preprocess(job.source, state.pipeline, compile_src)
        _compile_into(state, compile_src, tmp)
    return [str(p) for p in _inputs(state)]


def _compile_into(state: CompileState, compile_src: Path, tmp: Path) -> None:
    """iree-compile itself, then the backend's checks of what it produced (binaries dumped into
    scratch when it wants them: scratch stays out of the cache key)."""
    job, target = state.job, state.request.target
    with echo.Stopwatch(f"iree-compile {job.source.name} -> {job.output.name} ({target})"), contextlib.ExitStack() as stack:
        dump = stack.enter_context(scratch_dir(job.output.parent, job.output.name)) if state.backend.wants_binaries(job) else None
        processes.spawn(
            toolchain.iree_compile().command(compile_src, *state.argv_tail, *([f"--iree-hal-dump-executable-binaries-to={dump}"] if dump else []), "-o", tmp),
            what=f"iree-compile ({target})",
            file=job.source,
            explain=functools.partial(explain_failure, state),
            fix=compile_fix(job.source),
        )
        if state.parameter_flags:
            parameters.require_self_contained(tmp, job.source, job.text)
        state.backend.after_compile(job, dump)


# The importer's mark on the function of an imported ONNX model (torch.onnx_meta.opset_version = ...).
_ONNX_META = b"torch.onnx_meta."


def compile_fix(source: Path) -> str:
    """What to do when iree-compile fails on `source`: a program written by hand is fixed at the
    location shown; one imported from ONNX was written by the importer, not by the user."""
    with contextlib.suppress(OSError), open(source, "rb") as f:
        if _ONNX_META in f.read(1 << 16):
            return (
                "the program was imported from an ONNX model (no MLIR of yours): the location shown names the ONNX node the failing op "
                "came from; this IREE release cannot compile that op for this target. Re-import at another opset "
                "(pyree-build import --opset-version N), replace the node with ops IREE supports, or report the model to IREE"
            )
    return "fix the MLIR at the location shown; objects are looked up in the current directory and each --object-search-path"


def post_checks(state: CompileState) -> Path:
    """Step 9: the imports the module must call (a spec that matched nothing)."""
    out = state.job.output
    if state.request.expect_imports:
        try:
            state.backend.require_imports(out, state.request.expect_imports)
        except PyreeError as err:
            out.unlink(missing_ok=True)  # a module that lacks the call must not look built
            placed = _placed_by_spec(state, [n for n in state.request.expect_imports if repr(n) in err.what])
            if placed:
                raise PyreeError(
                    err.what + f": the spec placed the call{'s' if len(placed) > 1 else ''} to {', '.join(map(repr, placed))}, "
                    "and IREE removed it while compiling",
                    file=err.file, details=err.details,
                    fix="the replaced ops' result is not needed at run time (e.g. it only computes sizes the program knows "
                    "already), so nothing of them runs and there is nothing to replace: choose another group",
                ) from None  # fmt: skip
            raise
    return out


def _placed_by_spec(state: CompileState, missing: list[str]) -> list[str]:
    """Which of the `missing` imports a transform or PDL spec did put into the program: the
    program after preprocessing (where specs apply) declares them. An import declared there
    but absent from the module was removed later, as dead code; one never declared, a
    matcher that found nothing."""
    if not state.job.spec_files or not missing:
        return []
    with scratch_dir(state.job.output.parent, state.job.output.name) as scratch:
        after = scratch / "preprocessed.mlir"
        try:
            processes.spawn(toolchain.iree_compile().command(state.job.source, *state.argv_tail, "--compile-to=preprocessing", "-o", after),
                            what="iree-compile (to the specs' phase)", file=state.job.source)  # fmt: skip
            text = after.read_text(errors="replace")
        except (PyreeError, OSError):
            return []
    return [name for name in missing if re.search(rf"func\.func private @{re.escape(name)}\(", text)]


def explain_failure(state: CompileState, compiler_output: str) -> str | None:
    """The backend's explanation of an iree-compile failure, else a file written for another
    IREE release, else which objects were missing."""
    texts = {state.job.source.name: state.job.text} | {f.name: text_or_empty(f) for f in state.job.spec_files}
    hint = state.backend.explain(state.job, compiler_output) or releases.explain(texts, toolchain.iree_compile().version, compiler_output)
    if hint:
        return hint
    if "failed to serialize executable" in compiler_output or "object file not found" in compiler_output:
        return _missing_objects_message(state, compiler_output)
    return None


def _missing_objects_message(state: CompileState, compiler_output: str) -> str | None:
    """Name each missing object and every place it was looked for (iree-compile names neither)."""
    search = state.job.search_paths
    named = _NOT_FOUND_OBJECT.findall(compiler_output)
    candidates = named or referenced_objects(state.job.source.read_text(encoding="utf-8", errors="replace"))
    lines = []
    for obj in dict.fromkeys(candidates):
        found, tried = resolve_object(obj, search)
        if found is None:
            hint = state.backend.missing_object_hint(obj, search)
            lines.append(f"object '{obj}' not found; tried:\n" + "\n".join(f"  {t}" for t in tried) + hint)
    if not lines:
        return None
    said = [line for line in compiler_output.splitlines() if "error:" in line.lower()]
    return "\n".join(lines) + "\n(iree-compile said:)\n" + "\n".join(said)


def compile(  # noqa: A001 - mirrors the CLI verb
    source: PathLike,
    output: PathLike,
    *,
    target: str = "llvm-cpu",
    object_search_paths: Sequence[PathLike] = (),
    flags: Sequence[str] = (),
    cpu: str = "generic",
    sm: str | int | None = None,
    depfile: PathLike | None = None,
    substitutions: Sequence[str] = (),
    substitute_from: PathLike | None = None,
    transform_spec: PathLike | None = None,
    pdl_spec: PathLike | None = None,
    expect_imports: Sequence[str] = (),
    preprocess: str | None = None,
    vulkan_target: str | None = None,
    gfx: str | int | None = None,
    link_bitcode: Sequence[PathLike] = (),
    target_options: Mapping[str, Any] | None = None,
) -> Path:
    """Compile an MLIR program to a .vmfb for `target`.

    `transform_spec` / `pdl_spec` rewrite the program before IREE lowers it (IREE's
    preprocessing specs); each spec is an input of the compile (cache key and depfile).
    `expect_imports`: import names the module must call (a spec that matched nothing is
    caught here); otherwise the output is removed and a PyreeError names the missing ones.
    `preprocess`: an iree-opt pass pipeline run on the source first (into a private
    temporary), for rewrites that must see the input dialects (tosa, torch).

    `vulkan_target` (vulkan; default `auto`: this machine's device) and `gfx` (hip) pick
    the GPU; `link_bitcode` files (LLVM bitcode, e.g. from `pyree-build bitcode`) are
    linked into the generated GPU code, so it can call their functions.
    `target_options`: option values for the target's backend by option dest, for options
    of backends that are not built in (a key the backend does not declare is refused).

    `substitutions` ("NAME=FILE") and `substitute_from` (a directory) replace executables:
    a .mlir/.mlirbc file as source, anything else as object (see executables.py).

    A program whose globals name parameters (`import` keeps an ONNX model's large weights in
    MODEL_params.irpa beside MODEL.mlir) gets every one of them imported back from that archive,
    so the module needs no archive to run; the archive is an input of the compile (an edited one
    rebuilds), and a missing one is a PyreeError. `flags` that import parameters themselves
    (--iree-parameter-import...) replace this.
    """
    options = {"cpu": cpu, "sm": sm, "vulkan_target": vulkan_target, "gfx": gfx, **(target_options or {})}
    backend = backends.with_options(target, target_options or {})
    request = CompileRequest(
        target, object_search_paths, flags, depfile, substitutions, substitute_from, transform_spec, pdl_spec, expect_imports, preprocess, link_bitcode
    )
    state = resolve_inputs(source, output, request, backend, options)
    for step in (add_specs, add_preprocess, add_parameters, add_target_flags, add_substitutions, check_before):
        step(state)
    run_compiler(state)
    return post_checks(state)
