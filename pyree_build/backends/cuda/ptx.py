""".cu sources -> one PTX per sm, with NVRTC (in-process, from PyPI) or nvcc.

Every CUDA compiler option pyree_build uses lives in this module, and so does the
PTX ISA policy: a PTX file carries an ISA version (`.version 9.5`), and a driver or a
ptxas older than the compiler that wrote it refuses the whole file. The PTX we write
is therefore marked with the newest ISA that every CUDA component on this machine
that will read it accepts (see `choose_ptx_isa`).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path

from pyree_build.cache.local import cached_action
from pyree_build.core import args, echo, formats, lazy, processes, toolchain
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.files import (
    parse_depfile,
    scratch_dir,
)
from pyree_build.core.inputs import Inputs, c_includes, header_lookups
from pyree_build.core.outputs import check_outputs, included_files
from pyree_build.core.records import record

# cuda-bindings, from PyPI (`pip install "pyree_build[cuda]"`): loaded when NVRTC or the driver is first asked.
cuda_driver = lazy.module("cuda.bindings.driver")
nvrtc = lazy.module("cuda.bindings.nvrtc")

PathLike = str | os.PathLike[str]

COMPILERS = ("nvrtc", "nvcc")

# The lowest PTX ISA that can describe code for an sm (PTX ISA docs, "Target ISA notes").
# Lowering a file's `.version` below this is refused: the driver would reject it.
MIN_ISA_FOR_SM = {
    60: (5, 0), 61: (5, 0), 62: (5, 0), 70: (6, 0), 72: (6, 1), 75: (6, 3), 80: (7, 0), 86: (7, 1), 87: (7, 4),
    88: (9, 0), 89: (7, 8), 90: (7, 8), 100: (8, 6), 101: (8, 6), 103: (8, 8), 110: (9, 0), 120: (8, 7), 121: (8, 8),
}  # fmt: skip

_VERSION_LINE = re.compile(rb"^\.version\s+(\d+)\.(\d+)\s*$", re.MULTILINE)
_TARGET_LINE = re.compile(rb"^\.target\s+(\w+)", re.MULTILINE)
_ENTRY = re.compile(rb"^\.(?:visible|weak)\s+\.entry\s+([\w$]+)\s*\(", re.MULTILINE)


def normalize_sm(sm: str | int) -> int:
    """'80', 'sm_80', 'compute_80' and 80 all mean 80."""
    text = str(sm).strip().lower()
    for prefix in ("sm_", "compute_"):
        text = text.removeprefix(prefix)
    if not text.isdigit():
        raise PyreeError(f"'{sm}' is not an sm", fix="give the compute capability as a number: --sm 80 (or sm_80)")
    return int(text)


def isa_for_cuda_release(major: int, minor: int) -> tuple[int, int]:
    """The newest PTX ISA a CUDA release (driver or toolkit) reads.

    CUDA 11.x reads ISA 7.x and 13.x reads 9.x, minor for minor; 12.x is 8.x with one
    release (12.6) that added no ISA, so 12.6 reads 8.5 and 12.8 reads 8.7.
    """
    if major >= 13:
        return (9 + (major - 13), minor)
    if major == 12:
        return (8, minor if minor <= 5 else minor - 1)
    if major == 11:
        return (7, minor)
    if major == 10:
        return (6, {0: 4, 1: 5, 2: 5}.get(minor, 5))
    return (6, 0)


def isa_of(ptx: bytes) -> tuple[int, int] | None:
    m = _VERSION_LINE.search(ptx)
    return (int(m.group(1)), int(m.group(2))) if m else None


def set_ptx_isa(ptx: bytes, isa: tuple[int, int]) -> bytes:
    return _VERSION_LINE.sub(f".version {isa[0]}.{isa[1]}".encode(), ptx, count=1)


def parse_isa(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text)
    if not m:
        raise PyreeError(f"'{text}' is not a PTX ISA version", fix="write it as MAJOR.MINOR, e.g. --ptx-isa 8.5, or use auto")
    return (int(m.group(1)), int(m.group(2)))


@functools.lru_cache(maxsize=1)
def driver_release() -> tuple[int, int] | None:
    """The CUDA release the installed driver supports, or None when no driver loads."""
    try:
        (err,) = cuda_driver.cuInit(0)
        if int(err) != 0:
            return None
        err, version = cuda_driver.cuDriverGetVersion()
    except Exception:  # no cuda-bindings (ImportError, here at first use), or libcuda.so missing: cuda-bindings raises on first use
        return None
    if int(err) != 0:
        return None
    return (version // 1000, (version % 1000) // 10)


def _release_of(tool: toolchain.Tool) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", tool.version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def choose_ptx_isa(requested: str, *, verify_with: toolchain.Tool | None = None, driver: tuple[int, int] | None = None) -> tuple[tuple[int, int] | None, str]:
    """The ISA ceiling to write, and why. `requested` is 'auto', 'native' or 'MAJOR.MINOR'.

    auto: the newest ISA that the driver here (if any) and `verify_with` (the ptxas of
    --verify, or the one found here) accept; with neither, the compiler's own (None: leave
    the PTX as written).
    """
    if requested == "native":
        return None, "as the compiler wrote it (--ptx-isa native)"
    if requested != "auto":
        return parse_isa(requested), f"--ptx-isa {requested}"
    limits: list[tuple[tuple[int, int], str]] = []
    if driver is not None:
        limits.append((isa_for_cuda_release(*driver), f"the CUDA {driver[0]}.{driver[1]} driver here"))
    if verify_with is not None and (release := _release_of(verify_with)) is not None:
        limits.append((isa_for_cuda_release(*release), f"ptxas {verify_with.version}"))
    if not limits:
        return None, "as the compiler wrote it (no driver or ptxas here to limit it)"
    return min(limits)


@record(frozen=True)
class PtxResult:
    sm: int
    path: Path
    isa: tuple[int, int] | None
    entries: tuple[str, ...]


def _supported_sms_nvrtc() -> list[int]:
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    if int(err) != 0:
        raise PyreeError(f"NVRTC could not list its supported architectures ({err})", fix=toolchain.INSTALL_NVRTC)
    return sorted(int(a) for a in archs)


def _supported_sms_nvcc(nvcc: toolchain.Tool) -> list[int]:
    result = processes.spawn(nvcc.command("--list-gpu-arch"), what="asking nvcc for its architectures")
    return sorted({int(m) for m in re.findall(r"compute_(\d+)", result.stdout)})


def _check_sms(sms: list[int], supported: list[int], compiler_label: str) -> None:
    unsupported = [s for s in sms if s not in supported]
    if unsupported:
        names = ", ".join(f"sm_{s}" for s in unsupported)
        raise PyreeError(
            f"{names} {'is' if len(unsupported) == 1 else 'are'} not supported by {compiler_label}",
            details=f"supported: sm_{supported[0]} to sm_{supported[-1]} ({', '.join(map(str, supported))})",
            fix="choose an sm from that range, or another compiler (--compiler nvrtc|nvcc) that supports it",
        )


def _nvrtc_compile(source: Path, text: bytes, sm: int, options: list[str]) -> bytes:
    # The program is named by its path, so every diagnostic reads `path(line): error: ...`.
    err, prog = nvrtc.nvrtcCreateProgram(text, str(source).encode(), 0, [], [])
    if int(err) != 0:
        raise PyreeError(f"NVRTC could not create a program ({err})", file=source)
    try:
        opts = [f"--gpu-architecture=compute_{sm}", *options]
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        # NVRTC writes into the buffer it is given: a bytearray of our own. `b" " * n` is, for
        # n == 1 (an empty log), CPython's shared one-byte b" ": NVRTC's NUL went into it, and
        # every b" " of the process read b"\x00" from then on.
        _, log_size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = bytearray(log_size)
        nvrtc.nvrtcGetProgramLog(prog, log)
        log_text = bytes(log).rstrip(b"\x00 ").decode(errors="replace")
        if int(status) != 0:
            raise PyreeError(
                f"NVRTC could not compile it for sm_{sm}",
                file=source,
                details=log_text or str(status),
                fix="fix the error at the file(line) shown above",
            )
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = bytearray(size)
        nvrtc.nvrtcGetPTX(prog, ptx)
        return bytes(ptx).rstrip(b"\x00")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


# NVRTC runs in-process; under -v this one-liner (same library, same options) stands for it.
_NVRTC_LINE = (
    "import sys; from cuda.bindings import nvrtc; src, out, *opts = sys.argv[1:]; "
    "_, p = nvrtc.nvrtcCreateProgram(open(src, 'rb').read(), src.encode(), 0, [], []); "
    "(s,) = nvrtc.nvrtcCompileProgram(p, len(opts), [o.encode() for o in opts]); "
    "_, n = nvrtc.nvrtcGetPTXSize(p); b = bytearray(n); nvrtc.nvrtcGetPTX(p, b); "
    "sys.exit(f'nvrtc failed: {s}') if int(s) else open(out, 'wb').write(b.rstrip(bytes(1)))"
)


def _write_step(path: Path, data: bytes, line: str) -> Path:
    """Write bytes made in-process, printing (-v) the shell line that makes the same file."""
    echo.echo_command(line)
    path.write_bytes(data)
    return path


def _nvcc_compile(nvcc: toolchain.Tool, source: Path, sm: int, options: list[str], build: Path) -> tuple[bytes, list[str]]:
    out = build / f"sm_{sm}.ptx"
    dep = build / f"sm_{sm}.d"
    processes.spawn(
        nvcc.command("-ptx", f"-arch=sm_{sm}", *options, "-MD", "-MF", dep, source, "-o", out),
        what=f"compiling {source.name} for sm_{sm} with nvcc",
        file=source,
        fix="fix the error at the file(line) shown above",
    )
    return out.read_bytes(), parse_depfile(dep) if dep.exists() else [str(source)]


def _finish(ptx: bytes, sm: int, source: Path, isa_limit: tuple[int, int] | None, isa_reason: str) -> tuple[bytes, tuple[int, int] | None, tuple[str, ...]]:
    """Apply the ISA ceiling and check the PTX is for this sm and has kernels."""
    target = _TARGET_LINE.search(ptx)
    if target is None or target.group(1).decode() != f"sm_{sm}":
        found = target.group(1).decode() if target else "no .target line"
        raise PyreeError(f"the compiler wrote PTX for {found}, not sm_{sm}", file=source, fix="report this; it is a compiler bug")
    isa = isa_of(ptx)
    if isa_limit is not None and isa is not None and isa > isa_limit:
        needed = MIN_ISA_FOR_SM.get(sm)
        if needed is not None and isa_limit < needed:
            raise PyreeError(
                f"sm_{sm} needs PTX ISA {needed[0]}.{needed[1]} or newer, but the limit is {isa_limit[0]}.{isa_limit[1]} ({isa_reason})",
                file=source,
                fix="update the NVIDIA driver (or ptxas), or compile for an older sm",
            )
        ptx = set_ptx_isa(ptx, isa_limit)
        isa = isa_limit
    entries = tuple(m.decode() for m in _ENTRY.findall(ptx))
    if not entries:
        raise PyreeError(
            "the PTX has no kernel entry points",
            file=source,
            fix='declare each kernel as extern "C" __global__ so MLIR can name it in hal.executable.export',
        )
    return ptx, isa, entries


def _verify(ptxas: toolchain.Tool, ptx_file: Path, sm: int, source: Path, build: Path) -> None:
    processes.spawn(
        ptxas.command(f"-arch=sm_{sm}", ptx_file, "-o", build / f"verify_sm_{sm}.cubin"),
        what=f"assembling the sm_{sm} PTX with ptxas",
        file=source,
        fix="the PTX does not assemble: fix the kernel, or pass --ptx-isa to match this ptxas",
    )


def ptx(
    source: PathLike,
    sms: Sequence[str | int],
    output_dir: PathLike,
    *,
    compiler: str = "nvrtc",
    verify: bool = False,
    ptx_isa: str = "auto",
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
    depfile: PathLike | None = None,
    jobs: int | None = None,
) -> list[Path]:
    """Compile one .cu to `<output_dir>/<stem>_sm_<N>.ptx` per sm; all are written or none."""
    src = require_file(source, "CUDA source")
    sm_list = list(dict.fromkeys(normalize_sm(s) for s in sms))
    if not sm_list:
        raise PyreeError("no sm given", fix="pass at least one --sm, e.g. --sm 80")
    if compiler not in COMPILERS:
        raise PyreeError(f"unknown CUDA compiler '{compiler}'", fix="use --compiler nvrtc (default) or --compiler nvcc")
    out_dir = args.path(output_dir, "output directory")
    outputs = {sm: out_dir / f"{src.stem}_sm_{sm}.ptx" for sm in sm_list}
    check_outputs(outputs.values(), [src, *included_files([src], include_dirs)], depfile=depfile, output_dirs=[out_dir])
    job = _plan(src, sm_list, out_dir, compiler=compiler, verify=verify, ptx_isa=ptx_isa, include_dirs=include_dirs, defines=defines, jobs=jobs)
    headers, ptxas_tool = job.headers, job.ptxas
    key = [compiler, *map(str, sm_list), *job.options, f"isa={job.isa_limit}", f"verify={bool(ptxas_tool)}"]
    cached_action(
        "ptx", key=key, inputs=[src], outputs=[outputs[sm] for sm in sm_list],
        build=job.build, tools_used=[job.tool, *([ptxas_tool] if ptxas_tool else [])], headers=headers,
        check=functools.partial(_check_ptx, sm_list), depfile=depfile,
    )  # fmt: skip
    return [outputs[sm] for sm in sm_list]


def _check_ptx(sm_list: Sequence[int], paths: Sequence[Path]) -> None:
    """Each file is PTX text for its sm, with kernels (what a remote entry must hold)."""
    for sm, path in zip(sm_list, paths):
        formats.require_text(path, b".version", "PTX")
        found = read_ptx(path)
        if found.sm != sm or not found.entries:
            raise PyreeError(f"PTX for sm_{found.sm} with {len(found.entries)} kernels, not sm_{sm} with kernels", file=path, fix="rebuild it")


def _ptxas_here() -> toolchain.Tool | None:
    try:
        return toolchain.ptxas()
    except PyreeError:
        return None


def _plan(
    src: Path, sm_list: list[int], out_dir: Path, *, compiler: str, verify: bool, ptx_isa: str,
    include_dirs: Sequence[str], defines: Sequence[str], jobs: int | None,
) -> _PtxJob:  # fmt: skip
    """Find the tools, check the sms, fix the ISA ceiling and the compiler's options."""
    incs = [Path(d).resolve() for d in include_dirs]
    ptxas_tool = toolchain.ptxas() if verify else None
    # Without --verify, a ptxas found here still reads this PTX later (doctor lists it): limit to it too.
    isa_limit, isa_reason = choose_ptx_isa(ptx_isa, verify_with=ptxas_tool or _ptxas_here(), driver=driver_release())
    if compiler == "nvrtc":
        tool = toolchain.nvrtc()
        _check_sms(sm_list, _supported_sms_nvrtc(), f"NVRTC {tool.version}")
        options = [f"--include-path={src.parent.resolve()}", *(f"--include-path={d}" for d in incs), *(f"--define-macro={d}" for d in defines)]
    else:
        tool = toolchain.nvcc()
        _check_sms(sm_list, _supported_sms_nvcc(tool), f"nvcc {tool.version}")
        options = [*(f"-I{d}" for d in incs), *(f"-D{d}" for d in defines)]
    text = src.read_bytes()
    # NVRTC writes no dependency list: its headers are found before it runs.
    # nvcc's depfile names what it found; how every name resolved (found or not) is keyed for both.
    headers = c_includes(src, [src.parent.resolve(), *incs]) if compiler == "nvrtc" else header_lookups([src], [src.parent.resolve(), *incs])
    return _PtxJob(src, text, sm_list, out_dir, compiler, tool, options, headers, isa_limit, isa_reason, ptxas_tool, jobs)


@record(frozen=True)
class _PtxJob:
    """One `ptx` call, planned: what cached_action's build step needs to make every sm's PTX."""

    src: Path
    text: bytes
    sm_list: list[int]
    out_dir: Path
    compiler: str
    tool: toolchain.Tool
    options: list[str]
    headers: Inputs
    isa_limit: tuple[int, int] | None
    isa_reason: str
    ptxas: toolchain.Tool | None
    jobs: int | None

    def build(self, private: list[Path]) -> list[str]:
        """Compile every sm in a scratch directory, then write them to `private` (in sm order); the dependencies."""
        with scratch_dir(self.out_dir, self.src.name) as build:
            label = f"{self.tool.name} {self.src.name} -> sm {', '.join(map(str, self.sm_list))}"
            with echo.Stopwatch(label + (" + ptxas" if self.ptxas is not None else "")), processes.thread_pool(self.jobs) as pool:
                results = dict(zip(self.sm_list, pool.map(functools.partial(self.compile_one, build), self.sm_list)))
            for sm, tmp in zip(self.sm_list, private):  # renamed into place once all are written
                _write_step(tmp, results[sm][0], echo.shell_line(["cp", results[sm][3], tmp]))
        isas = {r[2] for r in results.values() if r[2] is not None}
        if isas:
            echo.log_step(f"  PTX ISA {', '.join(f'{a}.{b}' for a, b in sorted(isas))}: {self.isa_reason}")
        return list(dict.fromkeys(d for r in results.values() for d in r[1]))

    def compile_one(self, build: Path, sm: int) -> tuple[bytes, list[str], tuple[int, int] | None, Path]:
        """One sm: (the final PTX, its dependencies, its ISA, the file it is in)."""
        src, options = self.src, self.options
        sm_dir = echo.make_dir(build / f"sm_{sm}")
        if self.compiler == "nvrtc":
            raw, deps = _nvrtc_compile(src, self.text, sm, options), [str(h) for h in self.headers.files]
            raw_file = _write_step(sm_dir / "nvrtc.ptx", raw, echo.shell_line(echo.python_line(
                "-c", _NVRTC_LINE, src, sm_dir / "nvrtc.ptx", f"--gpu-architecture=compute_{sm}", *options)))  # fmt: skip
        else:
            raw, deps = _nvcc_compile(self.tool, src, sm, options, sm_dir)
            raw_file = sm_dir / f"sm_{sm}.ptx"
        data, isa, _ = _finish(raw, sm, src, self.isa_limit, self.isa_reason)
        final = sm_dir / "final.ptx"
        if data == raw:
            _write_step(final, data, echo.shell_line(["cp", raw_file, final]))
        else:  # the ISA ceiling rewrote the .version line
            version = f".version {isa[0]}.{isa[1]}" if isa else ""
            sed: list[str | os.PathLike[str]] = ["sed", "-E", rf"0,/^\.version[[:space:]]+[0-9]+\.[0-9]+[[:space:]]*$/s//{version}/", raw_file]
            _write_step(final, data, echo.shell_line(sed, stdout=final))
        if self.ptxas is not None:
            _verify(self.ptxas, final, sm, src, sm_dir)
        return data, deps, isa, final


def read_ptx(path: PathLike) -> PtxResult:
    """What a PTX file declares: its sm, ISA and kernel entries (for checks and tests)."""
    data = Path(path).read_bytes()
    target = _TARGET_LINE.search(data)
    sm = normalize_sm(target.group(1).decode()) if target else -1
    return PtxResult(sm, Path(path), isa_of(data), tuple(m.decode() for m in _ENTRY.findall(data)))
