"""cuda's side of compile and run: the flags and `#hal.executable.target` of an sm, what
iree-compile's and the driver's errors mean, and whether a CUDA GPU is usable here."""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

from pyree_build.backends.cuda import DEFAULT_SM
from pyree_build.backends.cuda.ptx import driver_release, isa_for_cuda_release, normalize_sm
from pyree_build.backends.runtime import listed_devices
from pyree_build.core import processes, toolchain
from pyree_build.core.errors import PyreeError

_VARIANT_TARGET = re.compile(r"hal\.executable\.variant public @\w+ target\((<.*?>)\) \{\s*$", re.MULTILINE)
# A cuda target attribute as written in a program: `#hal.executable.target<"cuda", "FORMAT", {...}>`.
_CUDA_TARGET = re.compile(r'#hal\.executable\.target<\s*"cuda"\s*,\s*"[^"]*"\s*(?:,\s*\{(?P<config>.*?)\})?\s*>', re.DOTALL)
_BARE_ARCH = re.compile(r'target_arch\s*=\s*"(sm_\d+)"')
_PROBE_PROGRAM = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  %0 = arith.addf %a, %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n"


def target_flags(sm: str | int | None) -> list[str]:
    """The iree-compile flags that select cuda for an sm (default 80)."""
    return ["--iree-hal-target-device=cuda", f"--iree-cuda-target=sm_{normalize_sm(sm or DEFAULT_SM)}"]


def _error_lines(compiler_output: str) -> str:
    return "\n".join(line for line in compiler_output.splitlines() if "error:" in line.lower())


def _older_keys(text: str) -> list[str]:
    """The sms keyed by a cuda target written the way IREE releases before 3.x wrote it
    (`{target_arch = "sm_80"}`, no `iree_codegen.target_info`), which 3.13 cannot match."""
    found = []
    for m in _CUDA_TARGET.finditer(text):
        config = m["config"] or ""
        if "iree_codegen.target_info" not in config:
            found += _BARE_ARCH.findall(config)
    return sorted(set(found))


def _older_key_message(source: Path, sm_text: str, older: list[str], compiler_output: str) -> str:
    return (
        f'{source.name} keys objects for {", ".join(older)} with `#hal.executable.target<"cuda", ..., {{target_arch = ...}}>`: '
        f"the form of earlier IREE releases. iree-compile {toolchain.iree_compile().version} matches objects to a target by "
        "its whole GPU description (`iree_codegen.target_info = #iree_gpu.target<...>`), so that key matches nothing.\n"
        f"Replace each such attribute with what `pyree-build cuda-target --sm {sm_text.removeprefix('sm_')}` prints "
        "(one per sm).\n(iree-compile said:)\n" + _error_lines(compiler_output)
    )


def explain_cuda_target(source: Path, sm: str | int | None, compiler_output: str) -> str | None:
    """iree-compile's cuda errors name neither the sm nor what to do about it."""
    sm_text = f"sm_{str(sm or DEFAULT_SM).removeprefix('sm_')}"
    if "missing GPU target" in compiler_output or "no objects defined for external variant" in compiler_output:
        older = _older_keys(source.read_text(encoding="utf-8", errors="replace"))
        if older:
            return _older_key_message(source, sm_text, older, compiler_output)
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


def _dumped_target(dump: Path, sm_text: int) -> str | None:
    for dumped in sorted(dump.glob("*.mlir")):
        m = _VARIANT_TARGET.search(dumped.read_text())
        if m and "target_info" in m.group(1):
            return f"#hal.executable.target{m.group(1)}"
        if m:  # only the bare backend: the compiler knows no GPU of this sm
            raise PyreeError(
                f"iree-compile {toolchain.iree_compile().version} has no GPU description for sm_{sm_text}",
                fix="use an sm it knows (e.g. 80; PTX for sm_80 also runs on sm_90 GPUs)",
            )
    return None


def cuda_target_attr(sm: str | int) -> str:
    """The `#hal.executable.target` that iree-compile uses for an sm, to key objects with.

    Read from the installed compiler (a tiny program compiled with its sources dumped),
    so it always matches what that compiler will look up.
    """
    sm_text = normalize_sm(sm)
    with tempfile.TemporaryDirectory(prefix="pyree-cuda-target.") as tmp:
        src = Path(tmp) / "probe.mlir"
        src.write_text(_PROBE_PROGRAM)
        dump = Path(tmp) / "dump"
        processes.spawn(
            toolchain.iree_compile().command(
                src,
                *target_flags(sm_text),
                f"--iree-hal-dump-executable-sources-to={dump}",
                "--compile-to=executable-sources",
                "-o",
                Path(tmp) / "out.mlir",
            ),  # fmt: skip
            what=f"asking iree-compile for the sm_{sm_text} target",
            explain=functools.partial(explain_cuda_target, src, sm_text),
        )
        found = _dumped_target(dump, sm_text)
        if found:
            return found
    raise PyreeError(f"iree-compile dumped no cuda variant for sm_{sm_text}", fix="run with -v to see the command")


@functools.cache
def cuda_status() -> tuple[bool, str]:
    """(usable, reason): a CUDA GPU is usable when the runtime can enumerate a device on it."""
    try:
        devices, text = listed_devices("cuda")
    except PyreeError as exc:
        return False, exc.what
    if devices:
        return True, f"{len(devices)} device(s): {', '.join(devices)}"
    if "libcuda" in text or "driver library" in text:
        return False, "no CUDA driver (libcuda.so) on this machine"
    return False, f"no usable CUDA device ({text.splitlines()[-1]})"


def explain_ptx_version(text: str) -> str | None:
    """The driver refused a PTX object written for a newer ISA than it reads: say which it reads."""
    if "UNSUPPORTED_PTX_VERSION" not in text and "unsupported PTX version" not in text.lower():
        return None
    release = driver_release()
    limit = isa_for_cuda_release(*release) if release else None
    reads = (
        f"this driver (CUDA {release[0]}.{release[1]}) reads PTX ISA up to {limit[0]}.{limit[1]}" if release and limit else "this driver reads an older PTX ISA"
    )
    return text + (
        f"\nhint: a PTX object in the module was written for a newer PTX ISA than {reads}. Rebuild the PTX "
        "on this machine (`pyree-build ptx` picks the driver's ISA by default) or with --ptx-isa "
        + (f"{limit[0]}.{limit[1]}" if limit else "MAJOR.MINOR")
        + ", then recompile the module"
    )
