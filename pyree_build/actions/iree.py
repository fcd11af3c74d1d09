"""MLIR -> .vmfb with iree-compile, and modules run with iree-run-module.

Every iree-compile / iree-run-module flag pyree_build chooses lives here.
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from pyree_build.actions import checks
from pyree_build.core import echo, processes, toolchain
from pyree_build.core.errors import PyreeError, require_file

if TYPE_CHECKING:
    import numpy as np

PathLike = str | os.PathLike[str]

TARGETS = ("llvm-cpu", "cuda", "vulkan", "hip")
DEVICES = ("local-sync", "local-task", "cuda", "vulkan", "hip")
DEFAULT_CUDA_SM = "80"
DEFAULT_HIP_GFX = "942"
# --iree-vulkan-target names iree-compile 3.13 accepts (checked one by one); an unknown
# name crashes it with a stack dump, so names are checked here first. `auto` picks the
# target of the Vulkan device on this machine (see vulkan.py).
VULKAN_TARGETS = (
    "auto", "vp_android_baseline_2022", "llvmpipe", "valhall", "valhall4", "adreno", "pascal", "volta", "turing",
    "ampere", "ada", "a100", "rtx3090", "rtx4090", "sm_80", "sm_86", "sm_89", "rdna1", "rdna2", "rdna3", "cdna1",
    "cdna2", "cdna3", "gfx90a", "gfx942", "gfx1100", "mi300x", "rx7900xtx",
)  # fmt: skip
# Exit code ctest reads as "skipped" (SKIP_RETURN_CODE), used when a test asks for a GPU
# that this machine does not have.
SKIP_EXIT_CODE = 77


def target_flags(
    target: str, *, cpu: str = "generic", sm: str | int | None = None, vulkan_target: str | None = None, gfx: str | int | None = None
) -> list[str]:
    """The iree-compile flags that select a target. `generic` CPU keeps modules portable."""
    if target == "vulkan":
        from pyree_build.backends.vulkan.devices import resolve_target

        return ["--iree-hal-target-device=vulkan", f"--iree-vulkan-target={resolve_target(vulkan_target or 'auto')}"]
    if target == "hip":
        from pyree_build.backends.hip.hsaco import normalize_gfx

        return ["--iree-hal-target-device=hip", f"--iree-rocm-target={normalize_gfx(gfx or DEFAULT_HIP_GFX)}"]
    if target == "llvm-cpu":
        return [
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            f"--iree-llvmcpu-target-cpu={cpu}",
        ]
    if target == "cuda":
        from pyree_build.backends.cuda.ptx import normalize_sm

        sm_text = normalize_sm(sm or DEFAULT_CUDA_SM)
        return ["--iree-hal-target-device=cuda", f"--iree-cuda-target=sm_{sm_text}"]
    raise PyreeError(f"unknown target '{target}'", fix=f"use one of: {', '.join(TARGETS)}")




_NOT_FOUND_OBJECT = re.compile(r'object file not found.*?#hal\.executable\.object<\{path = "([^"]+)"')


def _missing_objects_message(source: Path, search_paths: Sequence[PathLike], compiler_output: str) -> str | None:
    """Name each missing object and every place it was looked for (iree-compile names neither)."""
    from pyree_build.core.inputs import (  # only compile needs these (run imports less)
        referenced_objects,
        resolve_object,
    )
    named = _NOT_FOUND_OBJECT.findall(compiler_output)
    candidates = named or referenced_objects(source.read_text(encoding="utf-8", errors="replace"))
    lines = []
    for obj in dict.fromkeys(candidates):
        found, tried = resolve_object(obj, search_paths)
        if found is None:
            lines.append(f"object '{obj}' not found; tried:\n" + "\n".join(f"  {t}" for t in tried) + _arch_spelling_hint(obj, search_paths))
    if not lines:
        return None
    said = [line for line in compiler_output.splitlines() if "error:" in line.lower()]
    return "\n".join(lines) + "\n(iree-compile said:)\n" + "\n".join(said)


def _arch_spelling_hint(obj: str, search_paths: Sequence[PathLike]) -> str:
    """IREE spells aarch64 `arm_64`: point at an object that exists under another spelling."""
    from pyree_build.backends.llvm_cpu.elf import ARCH_ALIASES
    from pyree_build.core.inputs import resolve_object

    stem, dot, suffix = obj.rpartition(".")
    for spelling, arch in ARCH_ALIASES.items():
        if not stem.endswith(f"_{spelling}"):
            continue
        for other in (s for s, a in ARCH_ALIASES.items() if a == arch and s != spelling):
            candidate = f"{stem[: -len(spelling)]}{other}{dot}{suffix}"
            if resolve_object(candidate, search_paths)[0] is not None:
                return (
                    f"\n  (found {candidate}: the same arch spelled '{other}'; build the objects with "
                    f"`--arch {spelling}` (CMake: ARCHS {spelling}) to get the name the program uses)"
                )
    return ""


def _error_lines(compiler_output: str) -> str:
    return "\n".join(line for line in compiler_output.splitlines() if "error:" in line.lower())


def _explain_cuda_target(source: Path, sm: str | int | None, compiler_output: str) -> str | None:
    """iree-compile's cuda errors name neither the sm nor what to do about it."""
    sm_text = f"sm_{str(sm or DEFAULT_CUDA_SM).removeprefix('sm_')}"
    if "missing GPU target" in compiler_output:
        return (
            f"iree-compile {toolchain.iree_compile().version} has no GPU description for {sm_text}, so it cannot target it.\n"
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

    from pyree_build.backends.cuda.ptx import normalize_sm

    sm_text = normalize_sm(sm)
    program = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  %0 = arith.addf %a, %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n"
    with tempfile.TemporaryDirectory(prefix="pyree-cuda-target.") as tmp:
        src = Path(tmp) / "probe.mlir"
        src.write_text(program)
        dump = Path(tmp) / "dump"
        processes.spawn(
            toolchain.iree_compile().command(
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
                    f"iree-compile {toolchain.iree_compile().version} has no GPU description for sm_{sm_text}",
                    fix="use an sm it knows (e.g. 80; PTX for sm_80 also runs on sm_90 GPUs)",
                )
    raise PyreeError(f"iree-compile dumped no cuda variant for sm_{sm_text}", fix="run with -v to see the command")


def _compile_inputs(src: Path, search: Sequence[Path], substitutions: Sequence[str], substitute_from: PathLike | None) -> list[Path]:
    """Every file a compile may read, so that none of them is taken as its output."""
    from pyree_build.core.inputs import referenced_objects, resolve_object
    found = [src]
    found += [o for obj in referenced_objects(src.read_text(encoding="utf-8", errors="replace")) if (o := resolve_object(obj, search)[0])]
    found += [Path(item.partition("=")[2]) for item in substitutions if item.partition("=")[2]]
    if substitute_from is not None and Path(substitute_from).is_dir():
        found += [p for p in Path(substitute_from).iterdir() if p.is_file()]
    return found


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

    `substitutions` ("NAME=FILE") and `substitute_from` (a directory) replace executables:
    a .mlir/.mlirbc file as source, anything else as object (see executables.py).
    """
    from pyree_build.cache.local import cached_action
    from pyree_build.core.files import remove_stale, scratch_dir, write_depfile
    from pyree_build.core.inputs import (
        compile_inputs,
        referenced_objects,
        resolve_object,
    )
    from pyree_build.core.outputs import check_outputs
    src = require_file(source, "MLIR source")
    search = [Path(p).resolve() for p in object_search_paths]
    (out,) = check_outputs([output], _compile_inputs(src, search, substitutions, substitute_from), depfile=depfile)
    remove_stale(out)
    compiler = toolchain.iree_compile()
    for s in search:
        if not s.is_dir():
            raise PyreeError("object search path is not a directory", file=s, fix="pass an existing directory to --object-search-path")
    if target == "hip":
        from pyree_build.backends.hip.hsaco import normalize_gfx

        # `pyree-build hsaco` writes DIR/gfx<N>/<stem>.co: search the target's own first.
        gfx_dir = normalize_gfx(gfx or DEFAULT_HIP_GFX)
        search = [*(s / gfx_dir for s in search if (s / gfx_dir).is_dir()), *search]
    bitcode = [require_file(b, "bitcode").resolve() for b in link_bitcode]
    from pyree_build.actions.specs import spec_flags

    specs_flags, spec_files = spec_flags(transform_spec=transform_spec, pdl_spec=pdl_spec)
    pipeline, pipeline_inputs = (None, [])
    if preprocess is not None:
        from pyree_build.actions.specs import pipeline_files

        pipeline, pipeline_inputs = pipeline_files(preprocess)
        spec_files = [*spec_files, *pipeline_inputs]
    argv_tail = [
        *target_flags(target, cpu=cpu, sm=sm, vulkan_target=vulkan_target, gfx=gfx),
        *(f"--iree-hal-executable-object-search-path={s}" for s in search),
        *([f"--iree-link-bitcode={','.join(map(str, bitcode))}"] if bitcode else []),
        *specs_flags,
        *flags,
    ]
    substituted: list[Path] = []
    if substitutions or substitute_from is not None:
        from pyree_build.actions.executables import substitution_flags

        sub_flags, substituted = substitution_flags(
            src, target=target, substitutions=substitutions, substitute_from=substitute_from, sm=sm, flags=[*specs_flags, *flags]
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

    text = src.read_text(encoding="utf-8", errors="replace")
    from pyree_build.backends.llvm_cpu.imports import declarations_without_bareptr

    for path, body in [(src, text), *((f, f.read_text(encoding="utf-8", errors="replace")) for f in spec_files)]:
        for name in declarations_without_bareptr(body):
            print(  # shown even with -q: the module would compile and then compute garbage
                f"warning: {path.name}: import @{name} takes memrefs but is not declared with `llvm.bareptr = true`: "
                "each memref is then passed as a whole descriptor, and C written for pointer + offset reads the wrong "
                "fields (wrong results or a crash); add `attributes {llvm.bareptr = true}` (docs/writing-an-import.md)",
                file=sys.stderr,
            )
    if target == "hip":
        from pyree_build.backends.hip.hsaco import check_module_objects

        objects = [found for obj in referenced_objects(text) if (found := resolve_object(obj, search)[0])]
        check_module_objects(objects, gfx_dir)  # iree-compile embeds an object for any gfx

    # Generated CUDA code that calls into bitcode compiles even when a call stays unresolved
    # (only the driver would fail): check its PTX at build time. The dump directory is
    # scratch, so it stays out of the cache key.
    check_ptx = target == "cuda" and bool(bitcode or "iree_codegen.ukernel" in text)
    # Every file iree-compile will read (objects the MLIR references, specs and other files
    # named by flags) and where each name resolved: keyed by content, listed in the depfile.
    reads = compile_inputs(src, argv_tail)
    tools_used = [compiler, *([toolchain.iree_opt()] if pipeline is not None else [])]

    def build_it(private: list[Path]) -> list[str]:
        (tmp,) = private
        with contextlib.ExitStack() as stack:
            compile_src = src
            if pipeline is not None:
                from pyree_build.actions.specs import preprocess as run_preprocess

                compile_src = stack.enter_context(scratch_dir(out.parent, out.name)) / f"{src.stem}.preprocessed.mlir"
                run_preprocess(src, pipeline, compile_src)
            compile_it(compile_src, tmp)
        return [str(src), *map(str, reads.files), *map(str, bitcode), *map(str, substituted), *map(str, spec_files)]

    def compile_it(compile_src: Path, tmp: Path) -> None:
        with echo.Stopwatch(f"iree-compile {src.name} -> {out.name} ({target})"), contextlib.ExitStack() as stack:
            dump = stack.enter_context(scratch_dir(out.parent, out.name)) if check_ptx else None
            processes.spawn(
                compiler.command(compile_src, *argv_tail, *([f"--iree-hal-dump-executable-binaries-to={dump}"] if dump else []), "-o", tmp),
                what=f"iree-compile ({target})",
                file=src,
                explain=explain,
                fix="fix the MLIR at the location shown; objects are looked up in the current directory and each --object-search-path",
            )
            if dump is not None:
                from pyree_build.backends.cuda.bitcode import check_cuda_module
                from pyree_build.backends.cuda.ptx import normalize_sm

                check_cuda_module(src, sorted(dump.glob("*.ptx")), normalize_sm(sm or DEFAULT_CUDA_SM), bitcode, dump)

    key = [*argv_tail, *reads.resolution]
    if pipeline is not None:
        key.append(f"preprocess={pipeline}")
    deps = cached_action(
        "compile", key=key, inputs=[src, *reads.files, *bitcode, *substituted, *spec_files], outputs=[out],
        build=build_it, tools_used=tools_used, uncacheable=reads.uncacheable,
    )  # fmt: skip
    if expect_imports:
        from pyree_build.backends.llvm_cpu.imports import require_imports

        try:
            require_imports(out, expect_imports, what="compiled module")
        except PyreeError:
            out.unlink(missing_ok=True)  # a module that lacks the call must not look built
            raise
    if depfile:
        write_depfile(depfile, out, deps)
    return out


def _listed_devices(driver: str) -> tuple[list[str], str]:
    """The `driver://` devices iree-run-module enumerates here, and what it said. A driver
    listed by the runtime is not enough: its library and a device must be present."""
    runner = toolchain.iree_run_module()
    result = processes.spawn(runner.command(f"--list_devices={driver}"), what=f"listing {driver} devices", check=False, timeout=60)
    text = (result.stdout + result.stderr).strip()
    devices = [line.strip() for line in text.splitlines() if line.strip().startswith(f"{driver}://")] if result.returncode == 0 else []
    return devices, text or f"exit code {result.returncode}"


@functools.lru_cache(maxsize=None)
def cuda_status() -> tuple[bool, str]:
    """(usable, reason): a CUDA GPU is usable when the runtime can enumerate a device on it."""
    try:
        devices, text = _listed_devices("cuda")
    except PyreeError as exc:
        return False, exc.what
    if devices:
        return True, f"{len(devices)} device(s): {', '.join(devices)}"
    if "libcuda" in text or "driver library" in text:
        return False, "no CUDA driver (libcuda.so) on this machine"
    return False, f"no usable CUDA device ({text.splitlines()[-1]})"


class RunResult:
    """A run's text and timing; `outputs` (the results as numpy arrays) are made when first
    read, so a run that only prints or checks text never imports numpy (~100 ms)."""

    def __init__(self, module: Path, function: str, stdout: str, seconds: float, outputs: list[np.ndarray] | Callable[[], list[np.ndarray]] | None = None) -> None:
        self.module = module
        self.function = function
        self.stdout = stdout
        self.seconds = seconds
        self._outputs = outputs if outputs is not None else []

    @property
    def outputs(self) -> list[np.ndarray]:
        if callable(self._outputs):
            self._outputs = self._outputs()
        return self._outputs

    def __repr__(self) -> str:
        return f"RunResult(module={self.module!r}, function={self.function!r}, seconds={self.seconds:.3f})"


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
    from pyree_build.backends.llvm_cpu.elf import is_standalone_elf

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
        from pyree_build.backends.cuda import ptx as cuda

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


@functools.lru_cache(maxsize=None)
def hip_status() -> tuple[bool, str]:
    """(usable, reason): an AMD GPU is usable when the runtime can enumerate a HIP device."""
    try:
        devices, _ = _listed_devices("hip")
    except PyreeError as exc:
        return False, exc.what
    if devices:
        return True, ", ".join(devices)
    return False, "no usable AMD GPU (HIP runtime libamdhip64.so or device absent)"


def vulkan_status() -> tuple[bool, str]:
    from pyree_build.backends.vulkan.devices import status

    return status()


# Driver -> (probe, what to do when it finds nothing usable).
_DEVICE_CHECKS = {
    "cuda": (cuda_status, "run on a machine with an NVIDIA GPU and driver; `pyree-build doctor` shows what is found"),
    "hip": (hip_status, "run on a machine with an AMD GPU and ROCm; `pyree-build doctor` shows what is found"),
    "vulkan": (
        vulkan_status,
        "install a Vulkan driver (CPU-only Debian: apt-get install mesa-vulkan-drivers); `pyree-build doctor` lists Vulkan devices",
    ),
}


def require_device(device: str, *, skip_unavailable: bool = False) -> None:
    """Stop before running on a GPU (or Vulkan) device that is not usable: a clear error, or
    with `skip_unavailable` the exit code ctest reads as 'skipped' (SKIP_RETURN_CODE)."""
    driver = device.split(":", 1)[0]
    if driver not in _DEVICE_CHECKS:
        return
    probe, fix = _DEVICE_CHECKS[driver]
    usable, reason = probe()
    if not usable:
        raise DeviceUnavailable(
            f"skipped: {reason}" if skip_unavailable else f"device {driver} is not usable: {reason}",
            fix=fix,
            exit_code=SKIP_EXIT_CODE if skip_unavailable else 1,
        )


# A bound on any one run or benchmark: generous, yet a plugin that loops (or waits on
# something that never comes) ends the run with a message instead of hanging CI forever.
DEFAULT_RUN_TIMEOUT_S = 300.0


def check_timeout(timeout: float | None) -> float | None:
    if timeout is not None and not timeout > 0:
        raise PyreeError(f"--timeout must be a positive number of seconds, got {timeout}", fix="pass e.g. --timeout 300")
    return timeout


def crash_hint(plugins: Sequence[PathLike], *, timed_out_too: bool = True) -> str:
    """What usually makes a run crash or hang, naming the plugins that were loaded."""
    if not plugins:
        return (
            "no plugin was loaded, so the module (or the runtime) itself failed; check that it was compiled for this "
            "device, and rerun with the same inputs under a debugger"
        )
    names = ", ".join(os.fspath(p) for p in plugins)
    return (
        f"plugin(s) loaded: {names}; a crash or hang here is most often in a plugin's import. Likely causes:\n"
        "- the import is declared in the MLIR without `llvm.bareptr = true`, so the plugin reads memref descriptors "
        "where it expects plain pointers\n"
        "- the plugin's argument struct does not match the func.call in the MLIR (operand order, count or sizes, "
        "and the hal.import.fields appended at its end)\n"
        "- the plugin was built for another ABI or architecture, or against another executable_plugin.h\n"
        + ("- an endless loop in an import, or an import waiting on something that never comes" if timed_out_too else "")
    )


_EXPORT_LINE = re.compile(r"^\s*\[\s*\d+\]\s+(?P<name>[^\s(]+)\((?P<args>.*)\) -> \((?P<results>.*)\)\s*$")
_DECLARED_RESULT = re.compile(r"%output\d+:\s*(?P<type>.+?)(?=,\s*%output\d+:|\)?\s*$)")
_NPY_TENSOR = re.compile(r"^tensor<(?:(?:\d+|\?)x)*(?P<type>f16|f32|f64|[su]?i(?:8|16|32|64))>$")


def function_results(module: Path, function: str) -> tuple[int, list[str]] | None:
    """(number of results, their declared types) of an exported function, read with
    iree-dump-module; None when it cannot tell (the run then reports its own error)."""
    try:
        dump = toolchain.iree_dump_module()
    except PyreeError:
        return None
    with echo.muted_commands():  # an inspection, not a step a pasted -v transcript needs
        listing = processes.spawn(dump.command("--output=metadata", module), what="reading the module's functions", check=False, timeout=60)
    if listing.returncode != 0:
        return None
    lines = listing.stdout.splitlines()
    for i, line in enumerate(lines):
        m = _EXPORT_LINE.match(line)
        if not m or m["name"] != function:
            continue
        count = len([r for r in m["results"].split(",") if r.strip()])
        declared: list[str] = []
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if "iree.abi.declaration:" in following and ") -> " in following:
            tail = following.rsplit(") -> ", 1)[1].strip()
            declared = [d["type"].strip() for d in _DECLARED_RESULT.finditer(tail)]
        return count, declared
    return None


def _format_value(value: object, float_type: bool) -> str:
    return "%G" % float(value) if float_type else "%d" % int(value)  # noqa: UP031 - C's %G, as the runtime prints


# .npy element codes this module reads without numpy: little-endian or single-byte ints and floats.
_NPY_CODES = {
    "<f2": ("e", "f16"), "<f4": ("f", "f32"), "<f8": ("d", "f64"),
    "|i1": ("b", "i8"), "<i2": ("h", "i16"), "<i4": ("i", "i32"), "<i8": ("q", "i64"),
    "|u1": ("B", "ui8"), "<u2": ("H", "ui16"), "<u4": ("I", "ui32"), "<u8": ("Q", "ui64"),
}  # fmt: skip
_NPY_HEADER = re.compile(r"^\{'descr': '(?P<descr>[<>|=][a-z]\d+)', 'fortran_order': False, 'shape': \((?P<shape>[\d, ]*)\), \}\s*$")


def _npy_text(index: int, data: bytes, declared: str) -> str | None:
    """format_result for a .npy file's bytes, without numpy: None when the file is not the plain
    C-order little-endian array iree-run-module writes (then numpy reads it)."""
    import struct

    if data[:6] != b"\x93NUMPY" or data[6] not in (1, 2, 3):
        return None
    size_len = 2 if data[6] == 1 else 4
    (header_len,) = struct.unpack_from("<H" if size_len == 2 else "<I", data, 8)
    start = 8 + size_len + header_len
    m = _NPY_HEADER.match(data[8 + size_len : start].decode("latin-1"))
    if not m or m["descr"] not in _NPY_CODES:
        return None
    code, own_type = _NPY_CODES[m["descr"]]
    shape = [int(d) for d in m["shape"].replace(" ", "").split(",") if d]
    count = 1
    for d in shape:
        count *= d
    if len(data) - start != count * struct.calcsize(code):
        return None
    values = struct.unpack_from(f"<{count}{code}", data, start)
    etype = _NPY_TENSOR.match(declared)["type"]  # type: ignore[index]
    if _NPY_CODES_OF_TYPE.get(etype) != m["descr"]:  # the declaration can differ (f64 demoted to f32)
        etype = own_type
    is_float = code in "efd"
    if not shape:
        return f"result[{index}]: hal.buffer_view\n{etype}={_format_value(values[0], is_float)}\n"

    def nested(offset: int, dims: list[int]) -> str:
        if len(dims) <= 1:
            return " ".join(_format_value(v, is_float) for v in values[offset : offset + (dims[0] if dims else 1)])
        step = count_of(dims[1:])
        return "".join(f"[{nested(offset + k * step, dims[1:])}]" for k in range(dims[0]))

    def count_of(dims: list[int]) -> int:
        n = 1
        for d in dims:
            n *= d
        return n

    body = "x".join(map(str, shape)) + f"x{etype}=" + nested(0, shape)
    return f"result[{index}]: hal.buffer_view\n{body}\n"


_NPY_CODES_OF_TYPE = {
    "f16": "<f2", "f32": "<f4", "f64": "<f8", "i8": "|i1", "si8": "|i1", "ui8": "|u1",
    "i16": "<i2", "si16": "<i2", "ui16": "<u2", "i32": "<i4", "si32": "<i4", "ui32": "<u4",
    "i64": "<i8", "si64": "<i8", "ui64": "<u8",
}  # fmt: skip


def _load_npy(data: bytes) -> np.ndarray:
    import io

    import numpy as np

    return np.load(io.BytesIO(data))


def format_result(index: int, array: np.ndarray, declared: str) -> str:
    """A result as iree-run-module prints it (`result[0]: hal.buffer_view` then `4xf32=1 2 3 4`),
    every element shown: the text that --expect and --check-file see."""
    import numpy as np

    etype = _NPY_TENSOR.match(declared)["type"]  # type: ignore[index]
    if checks.numpy_dtype(etype) != array.dtype.type:  # the declaration can differ (f64 demoted to f32)
        kind = {"f": "f", "i": "i", "u": "ui", "b": "i"}[array.dtype.kind]
        etype = f"{kind}{array.dtype.itemsize * 8}"
    is_float = bool(np.issubdtype(array.dtype, np.floating))

    def nested(a: np.ndarray) -> str:
        if a.ndim <= 1:
            return " ".join(_format_value(v, is_float) for v in a.reshape(-1))
        return "".join(f"[{nested(sub)}]" for sub in a)

    if array.ndim == 0:
        body = f"{etype}={_format_value(array.item(), is_float)}"
    else:
        body = "x".join(map(str, array.shape)) + f"x{etype}=" + nested(array)
    return f"result[{index}]: hal.buffer_view\n{body}\n"


# iree-run-module elides results longer than this (1024 by default) with "...".
_NO_ELISION = f"--output_max_element_count={1 << 30}"


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
    check_prefixes: Sequence[str] = (),
    timeout: float | None = DEFAULT_RUN_TIMEOUT_S,
) -> RunResult:
    """Run `function` of `module` with iree-run-module; check its output if asked.

    Results come back whole, of any size: tensors through one `.npy` file each (exact
    values), printed as iree-run-module prints them; other results as its text, never
    elided. A run that exits without producing the function's results (a plugin that
    called exit()) is an error, as is one killed by a signal or by `timeout` seconds.
    """
    import tempfile

    mod = require_file(module, "module")
    plugin_flags = [plugin_flag(p) for p in plugins]
    checks.parse_inputs(inputs)
    check_timeout(timeout)
    if plugins:
        from pyree_build.backends.llvm_cpu.imports import check_resolved

        check_resolved(mod, plugins, ask_without_imports=False)  # names a missing import, where the runtime would not
    if device not in DEVICES:
        raise PyreeError(f"unknown device '{device}'", fix=f"use one of: {', '.join(DEVICES)}")
    require_device(device, skip_unavailable=skip_unavailable)
    runner = toolchain.iree_run_module()
    signature = function_results(mod, function)
    npy = signature is not None and len(signature[1]) == signature[0] and all(_NPY_TENSOR.match(t) for t in signature[1])
    with tempfile.TemporaryDirectory(prefix="pyree-run.") as tmp:
        files = [Path(tmp) / f"result{k}.npy" for k in range(signature[0])] if npy and signature else []
        argv = runner.command(
            f"--module={mod}",
            f"--function={function}",
            f"--device={device}",
            *(f"--executable_plugin={p}" for p in plugin_flags),
            *(f"--input={i}" for i in inputs),
            *(f"--output=@{f}" for f in files),
            *([] if npy else [_NO_ELISION]),
            *flags,
        )
        # Under -v, the command a user can paste: the same run, its results printed in full
        # by iree-run-module itself instead of written to this run's private .npy files.
        echo.echo_command(echo.shell_line([a for a in argv if not a.startswith("--output=@")] + ([] if not npy else [_NO_ELISION])))
        start = time.perf_counter()
        with echo.muted_commands():
            result = processes.spawn(
                argv, what=f"running {function} on {device}" + (f" with plugin(s) {', '.join(map(os.fspath, plugins))}" if plugins else ""),
                file=mod, explain=_explain_run_failure, timeout=timeout, crash_hint=crash_hint(plugins),
            )  # fmt: skip
        seconds = time.perf_counter() - start
        stdout = result.stdout
        produced = sum(f.is_file() for f in files) if npy else len(re.findall(r"^result\[\d+\]:", stdout, re.MULTILINE))
        if signature is not None and produced < signature[0]:
            raise PyreeError(
                f"iree-run-module exited 0 but produced {produced} of the {signature[0]} results of {function}",
                file=mod,
                details=(
                    "the process ended before the function returned: something called exit() "
                    + (f"(most likely a plugin: {', '.join(map(os.fspath, plugins))})" if plugins else "")
                    + "\noutput:\n" + (stdout + result.stderr).strip()
                ),
                fix="an import must return a status to the runtime, never end the process",
            )
        outputs: Callable[[], list[np.ndarray]]
        if npy and signature:
            raw = [f.read_bytes() for f in files]
            outputs = lambda: [_load_npy(data) for data in raw]  # noqa: E731
            for k, (data, declared) in enumerate(zip(raw, signature[1])):
                text = _npy_text(k, data, declared)
                stdout += text if text is not None else format_result(k, _load_npy(data), declared)
        else:
            text_out = stdout
            outputs = lambda: checks.parse_outputs(text_out)  # noqa: E731
    run_result = RunResult(mod, function, stdout, seconds, outputs)
    if expect:
        checks.check_expected(stdout, expect, source=str(mod))
    if check_file:
        checks.check_with_filecheck(stdout, check_file, source=str(mod), prefixes=check_prefixes)
    return run_result


def run_to_arrays(
    module: PathLike, function: str, inputs: Sequence[object] = (), *, plugins: Sequence[PathLike] = (), device: str = "local-sync"
) -> list[np.ndarray]:
    """Run with iree-run-module and return the results as numpy arrays; `inputs` may be
    arrays (passed through .npy files) or input spec strings.

    For devices whose results IREE's Python runtime cannot read back: on lavapipe it
    cannot import host memory (minImportedHostPointerAlignment 4096), the tool can.
    """
    import tempfile

    import numpy as np

    mod = require_file(module, "module")
    with tempfile.TemporaryDirectory(prefix="pyree-run.") as tmp:
        specs = []
        for i, value in enumerate(inputs):
            if isinstance(value, str):
                specs.append(value)
            else:
                path = Path(tmp) / f"input{i}.npy"
                np.save(path, np.asarray(value))
                specs.append(f"@{path}")
        return run(mod, function, inputs=specs, plugins=plugins, device=device).outputs
