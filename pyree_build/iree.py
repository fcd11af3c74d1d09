"""MLIR -> .vmfb with iree-compile, and modules run with iree-run-module.

Every iree-compile / iree-run-module flag pyree_build chooses lives here.
"""
from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from . import checks, tools
from .cache import cached_action, remove_stale, write_depfile
from .errors import PyreeError, require_file
from .inputs import compile_inputs, referenced_objects, resolve_object

if TYPE_CHECKING:
    import numpy as np

PathLike = str | os.PathLike[str]

TARGETS = ("llvm-cpu", "cuda")
DEVICES = ("local-sync", "local-task", "cuda")
DEFAULT_CUDA_SM = "80"
# Exit code ctest reads as "skipped" (SKIP_RETURN_CODE), used when a test asks for a GPU
# that this machine does not have.
SKIP_EXIT_CODE = 77


def target_flags(target: str, *, cpu: str = "generic", sm: str | int | None = None) -> list[str]:
    """The iree-compile flags that select a target. `generic` CPU keeps modules portable."""
    if target == "llvm-cpu":
        return [
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            f"--iree-llvmcpu-target-cpu={cpu}",
        ]
    if target == "cuda":
        from .cuda import normalize_sm

        sm_text = normalize_sm(sm or DEFAULT_CUDA_SM)
        return ["--iree-hal-target-device=cuda", f"--iree-cuda-target=sm_{sm_text}"]
    raise PyreeError(f"unknown target '{target}'", fix=f"use one of: {', '.join(TARGETS)}")




_NOT_FOUND_OBJECT = re.compile(r'object file not found.*?#hal\.executable\.object<\{path = "([^"]+)"')


def _missing_objects_message(source: Path, search_paths: Sequence[PathLike], compiler_output: str) -> str | None:
    """Name each missing object and every place it was looked for (iree-compile names neither)."""
    named = _NOT_FOUND_OBJECT.findall(compiler_output)
    candidates = named or referenced_objects(source.read_text(encoding="utf-8", errors="replace"))
    lines = []
    for obj in dict.fromkeys(candidates):
        found, tried = resolve_object(obj, search_paths)
        if found is None:
            lines.append(f"object '{obj}' not found; tried:\n" + "\n".join(f"  {t}" for t in tried))
    if not lines:
        return None
    said = [line for line in compiler_output.splitlines() if "error:" in line.lower()]
    return "\n".join(lines) + "\n(iree-compile said:)\n" + "\n".join(said)


def _error_lines(compiler_output: str) -> str:
    return "\n".join(line for line in compiler_output.splitlines() if "error:" in line.lower())


def _explain_cuda_target(source: Path, sm: str | int | None, compiler_output: str) -> str | None:
    """iree-compile's cuda errors name neither the sm nor what to do about it."""
    sm_text = f"sm_{str(sm or DEFAULT_CUDA_SM).removeprefix('sm_')}"
    if "missing GPU target" in compiler_output:
        return (
            f"iree-compile {tools.iree_compile().version} has no GPU description for {sm_text}, so it cannot target it.\n"
            "PTX for an older sm runs on newer GPUs (the driver compiles it when loading), so compile for one "
            "it knows: --sm 80 also serves sm_90 (H100/H200).\n"
            "(iree-compile said:)\n" + _error_lines(compiler_output)
        )
    if "no objects defined for external variant" in compiler_output:
        keyed = sorted(set(re.findall(r'arch\s*=\s*"(sm_\d+)"', source.read_text(encoding="utf-8", errors="replace"))))
        return (
            f"no #hal.executable.objects entry is keyed for {sm_text}, the target of this compile "
            f"(keys in the program: {', '.join(keyed) or 'none readable'}).\n"
            f"Compile with --sm set to one of those, or add a key for {sm_text}: `pyree-build cuda-target --sm "
            f"{sm_text.removeprefix('sm_')}` prints it.\n(iree-compile said:)\n" + _error_lines(compiler_output)
        )
    return None


_VARIANT_TARGET = re.compile(r"hal\.executable\.variant public @\w+ target\((<.*?>)\) \{\s*$", re.MULTILINE)


def cuda_target_attr(sm: str | int) -> str:
    """The `#hal.executable.target` that iree-compile uses for an sm, to key objects with.

    Read from the installed compiler (a tiny program compiled with its sources dumped),
    so it always matches what that compiler will look up.
    """
    import tempfile

    from .cuda import normalize_sm

    sm_text = normalize_sm(sm)
    program = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  %0 = arith.addf %a, %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n"
    with tempfile.TemporaryDirectory(prefix="pyree-cuda-target.") as tmp:
        src = Path(tmp) / "probe.mlir"
        src.write_text(program)
        dump = Path(tmp) / "dump"
        tools.spawn(
            tools.iree_compile().command(
                src, *target_flags("cuda", sm=sm_text), f"--iree-hal-dump-executable-sources-to={dump}",
                "--compile-to=executable-sources", "-o", Path(tmp) / "out.mlir",
            ),  # fmt: skip
            what=f"asking iree-compile for the sm_{sm_text} target",
            explain=lambda text: _explain_cuda_target(src, sm_text, text),
        )
        for dumped in sorted(dump.glob("*.mlir")):
            m = _VARIANT_TARGET.search(dumped.read_text())
            if m and "target_info" in m.group(1):
                return f"#hal.executable.target{m.group(1)}"
            if m:  # only the bare backend: the compiler knows no GPU of this sm
                raise PyreeError(
                    f"iree-compile {tools.iree_compile().version} has no GPU description for sm_{sm_text}",
                    fix="use an sm it knows (e.g. 80; PTX for sm_80 also runs on sm_90 GPUs)",
                )
    raise PyreeError(f"iree-compile dumped no cuda variant for sm_{sm_text}", fix="run with -v to see the command")


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
) -> Path:
    """Compile an MLIR program to a .vmfb for `target`.

    `substitutions` ("NAME=FILE") and `substitute_from` (a directory) replace executables:
    a .mlir/.mlirbc file as source, anything else as object (see executables.py).
    """
    src = require_file(source, "MLIR source")
    out = Path(output)
    remove_stale(out)
    compiler = tools.iree_compile()
    search = [Path(p).resolve() for p in object_search_paths]
    for s in search:
        if not s.is_dir():
            raise PyreeError("object search path is not a directory", file=s, fix="pass an existing directory to --object-search-path")
    argv_tail = [*target_flags(target, cpu=cpu, sm=sm), *(f"--iree-hal-executable-object-search-path={s}" for s in search), *flags]
    substituted: list[Path] = []
    if substitutions or substitute_from is not None:
        from .executables import substitution_flags

        sub_flags, substituted = substitution_flags(
            src, target=target, substitutions=substitutions, substitute_from=substitute_from, sm=sm, flags=flags
        )
        argv_tail += sub_flags

    def explain(output_text: str) -> str | None:
        if target == "cuda":
            cuda_hint = _explain_cuda_target(src, sm, output_text)
            if cuda_hint:
                return cuda_hint
        if "failed to serialize executable" in output_text or "object file not found" in output_text:
            return _missing_objects_message(src, search, output_text)
        return None

    # Every file iree-compile will read (objects the MLIR references, specs and other files
    # named by flags) and where each name resolved: keyed by content, listed in the depfile.
    reads = compile_inputs(src, argv_tail)

    def build_it(private: list[Path]) -> list[str]:
        (tmp,) = private
        with tools.Stopwatch(f"iree-compile {src.name} -> {out.name} ({target})"):
            tools.spawn(
                compiler.command(src, *argv_tail, "-o", tmp),
                what=f"iree-compile ({target})",
                file=src,
                explain=explain,
                fix="fix the MLIR at the location shown; objects are looked up in the current directory and each --object-search-path",
            )
        return [str(src), *map(str, reads.files), *map(str, substituted)]

    deps = cached_action(
        "compile", key=[*argv_tail, *reads.resolution], inputs=[src, *reads.files, *substituted], outputs=[out],
        build=build_it, tools_used=[compiler], uncacheable=reads.uncacheable,
    )  # fmt: skip
    if depfile:
        write_depfile(depfile, out, deps)
    return out


@functools.lru_cache(maxsize=None)
def cuda_status() -> tuple[bool, str]:
    """(usable, reason): a CUDA GPU is usable when the runtime can enumerate a device on it."""
    try:
        runner = tools.iree_run_module()
    except PyreeError as exc:
        return False, exc.what
    result = tools.spawn(runner.command("--list_devices=cuda"), what="listing CUDA devices", check=False, timeout=60)
    text = (result.stdout + result.stderr).strip()
    if result.returncode == 0 and "cuda://" in text:
        devices = [line.strip() for line in text.splitlines() if line.strip().startswith("cuda://")]
        return True, f"{len(devices)} device(s): {', '.join(devices)}"
    if "libcuda" in text or "driver library" in text:
        return False, "no CUDA driver (libcuda.so) on this machine"
    last = text.splitlines()[-1] if text else f"exit code {result.returncode}"
    return False, f"no usable CUDA device ({last})"


@dataclass
class RunResult:
    module: Path
    function: str
    stdout: str
    seconds: float
    outputs: list[np.ndarray] = field(default_factory=list)


EMBEDDED_PREFIX = "embedded:"


def plugin_flag(plugin: PathLike) -> str:
    """The --executable_plugin value that makes the runtime use the right loader.

    The runtime picks its own ELF loader only for a `.sos` name or an `embedded:` prefix
    and dlopen otherwise; a standalone plugin (FatELF, or an ELF with no libraries or
    imports) under another name gets the prefix, so users need not remember the rule.
    """
    text = os.fspath(plugin)
    explicit = text.startswith(EMBEDDED_PREFIX)
    # Absolute, or the runtime's dlopen would search the library path instead of the cwd.
    path = require_file(text.removeprefix(EMBEDDED_PREFIX), "plugin").resolve()
    if explicit or path.suffix == ".sos":
        return (EMBEDDED_PREFIX if explicit else "") + str(path)
    from .elfcheck import is_standalone_elf

    with path.open("rb") as f:
        head = f.read(4)
    if head == b"\xfa\x70\x0e\x1f" or is_standalone_elf(path):
        return EMBEDDED_PREFIX + str(path)
    return str(path)


class DeviceUnavailable(PyreeError):
    """The requested device is not present; ctest reads the exit code as 'skipped'."""


def _explain_run_failure(text: str) -> str | None:
    if "no executable loader registered" in text and "embedded-elf" in text:
        # The runtime's wording when an executable's imports could not all be resolved.
        return text + (
            "\nhint: the module's executables call imports that no plugin provided; pass the plugin that "
            "exports them with --plugin PATH (plugins given later are searched first)"
        )
    if "UNSUPPORTED_PTX_VERSION" in text or "unsupported PTX version" in text.lower():
        from . import cuda

        release = cuda.driver_release()
        limit = cuda.isa_for_cuda_release(*release) if release else None
        reads = f"this driver (CUDA {release[0]}.{release[1]}) reads PTX ISA up to {limit[0]}.{limit[1]}" if release and limit else "this driver reads an older PTX ISA"
        return text + (
            f"\nhint: a PTX object in the module was written for a newer PTX ISA than {reads}. Rebuild the PTX "
            "on this machine (`pyree-build ptx` picks the driver's ISA by default) or with --ptx-isa "
            + (f"{limit[0]}.{limit[1]}" if limit else "MAJOR.MINOR")
            + ", then recompile the module"
        )
    return None


def require_device(device: str, *, skip_unavailable: bool = False) -> None:
    """Stop before running on a CUDA device that is not usable: a clear error, or with
    `skip_unavailable` the exit code ctest reads as 'skipped' (SKIP_RETURN_CODE)."""
    if device.split(":", 1)[0] != "cuda":
        return
    usable, reason = cuda_status()
    if not usable:
        raise DeviceUnavailable(
            f"skipped: {reason}" if skip_unavailable else f"device cuda is not usable: {reason}",
            fix="run on a machine with an NVIDIA GPU and driver; `pyree-build doctor` shows what is found",
            exit_code=SKIP_EXIT_CODE if skip_unavailable else 1,
        )


def run(
    module: PathLike,
    function: str,
    *,
    inputs: Sequence[str] = (),
    plugins: Sequence[PathLike] = (),
    device: str = "local-sync",
    expect: Sequence[str] = (),
    check_file: PathLike | None = None,
    flags: Sequence[str] = (),
    skip_unavailable: bool = False,
) -> RunResult:
    """Run `function` of `module` with iree-run-module; check its output if asked."""
    mod = require_file(module, "module")
    plugin_flags = [plugin_flag(p) for p in plugins]
    checks.parse_inputs(inputs)
    if device not in DEVICES:
        raise PyreeError(f"unknown device '{device}'", fix=f"use one of: {', '.join(DEVICES)}")
    require_device(device, skip_unavailable=skip_unavailable)
    runner = tools.iree_run_module()
    argv = runner.command(
        f"--module={mod}",
        f"--function={function}",
        f"--device={device}",
        *(f"--executable_plugin={p}" for p in plugin_flags),
        *(f"--input={i}" for i in inputs),
        *flags,
    )
    start = time.perf_counter()
    result = tools.spawn(argv, what=f"running {function} on {device}", file=mod, explain=_explain_run_failure)
    seconds = time.perf_counter() - start
    run_result = RunResult(mod, function, result.stdout, seconds, checks.parse_outputs(result.stdout))
    if expect:
        checks.check_expected(result.stdout, expect, source=str(mod))
    if check_file:
        checks.check_with_filecheck(result.stdout, check_file, source=str(mod))
    return run_result
