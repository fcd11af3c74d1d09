"""C sources -> CPU plugins (system .so, standalone ELF / FatELF .sos) and embedded objects.

Every compiler flag pyree_build uses for CPU code lives in this module.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections.abc import Sequence
from pathlib import Path

from pyree_build.backends.llvm_cpu import cpus, libm
from pyree_build.backends.llvm_cpu.elf import (
    ELF_MACHINES,
    check_plugin_elf,
    explain_undefined,
    host_arch,
    normalize_arch,
    probe_plugin,
    read_elf,
)
from pyree_build.cache.local import cached_action
from pyree_build.core import args, echo, formats, lazy, processes, toolchain
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.files import (
    Reads,
    parse_depfile,
    scratch_dir,
)
from pyree_build.core.inputs import Inputs, assembler_reads, header_lookups
from pyree_build.core.outputs import check_outputs, included_files
from pyree_build.core.records import record

fatelf = lazy.module("pyree_build.backends.llvm_cpu.fatelf")  # standalone plugins only

PathLike = str | os.PathLike[str]

SYSTEM_CFLAGS = ("-std=c17", "-O2", "-fPIC")
# IREE's embedded ELF loader resolves no imports and expects position-independent,
# self-contained code: no libc, no stack protector (it would call __stack_chk_fail). There
# is no errno either (the math library never sets one): without -fno-math-errno, sqrtf of
# <math.h> stays a call, and a loop calling it does not vectorize.
FREESTANDING_CFLAGS = (
    "-std=c17",
    "-O3",
    "-fPIC",
    "-ffreestanding",
    "-fno-builtin",
    "-fno-math-errno",
    "-fno-stack-protector",
    "-fvisibility=hidden",
    "-fdata-sections",
    "-ffunction-sections",
)
STANDALONE_LDFLAGS = (
    "-flavor", "gnu",
    "--build-id=none",
    "-nostdlib",
    "-static",
    "-shared",
    "--no-allow-shlib-undefined",
    "--gc-sections",
    "-z", "now",
    "-z", "relro",
    "--discard-all",
    "--hash-style=sysv",
    "--strip-debug",
)  # fmt: skip


@record(frozen=True)
class CompileOptions:
    cc: str = "zig"
    include_dirs: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()
    # Freestanding code has no libc headers: pyree_build's <math.h> is searched last, so a
    # math.h of the user's own still wins.
    freestanding: bool = False

    def search_path(self) -> list[Path]:
        """The -I directories, in the order the compiler searches them."""
        last = [libm.HEADER_DIR] if self.freestanding else []
        return [toolchain.include_dir(), *(Path(d).resolve() for d in self.include_dirs), *last]

    def lookups(self, sources: Sequence[Path]) -> Inputs:
        """How every header name of `sources` resolves on this search path (see header_lookups)."""
        return header_lookups(sources, self.search_path())

    def flags(self) -> list[str]:
        return [*(a for d in self.search_path() for a in ("-I", str(d))), *(f"-D{d}" for d in self.defines)]


def _freestanding_target(cc: toolchain.Tool, arch: str) -> list[str]:
    if cc.name == "zig cc":
        return ["-target", f"{arch}-freestanding-none"]
    if cc.name == "clang":
        return [f"--target={arch}-unknown-none-elf"]
    raise PyreeError(
        f"{cc.name} cannot cross-compile freestanding code for {arch}",
        fix="use --cc zig (the default, from the ziglang wheel) or --cc clang",
    )


def _check_plugin(path: Path, arch_list: Sequence[str], *, single: bool, standalone: bool) -> None:
    """The plugin is what its build makes: one ELF of the arch, or a FatELF of exactly the arches."""
    if single:
        check_plugin_elf(path, arch=arch_list[0], standalone=standalone)
        return
    held = sorted(r.arch for r in fatelf.read(path))
    if held != sorted(arch_list):
        raise PyreeError(f"a FatELF of {', '.join(held)}, not of {', '.join(sorted(arch_list))}", file=path, fix="rebuild it")


def _check_objects(arch_list: Sequence[str], paths: Sequence[Path]) -> None:
    for path, arch in zip(paths, arch_list):
        formats.require_elf(path, machine=fatelf.machine_for_arch(arch), elf_type="ET_REL")


def _check_sources(sources: Sequence[PathLike] | PathLike) -> list[Path]:
    listed = args.paths(sources, "C source")  # one str is one path, never its characters
    if not listed:
        raise PyreeError("no C sources given", fix="pass at least one .c file")
    return [require_file(s, "C source") for s in listed]


def _compile(cc: toolchain.Tool, source: Path, obj: Path, flags: Sequence[str]) -> Reads:
    """Compile one source; return the files it read (source + headers) from the compiler's
    depfile, and what its assembly may read besides (_assembler_reads)."""
    dep = obj.with_suffix(".d")
    # Run from "/" with absolute paths: the working directory is recorded in the debug
    # info, and a fixed one keeps outputs byte-identical across build directories.
    try:
        processes.spawn(
            cc.command(*flags, "-MD", "-MF", dep.resolve(), "-c", source.resolve(), "-o", obj.resolve()),
            cwd="/",
            what=f"compiling {source.name} with {cc.name}",
            file=source,
            fix="fix the error at the file:line shown above",
            explain=_explain_freestanding if "-ffreestanding" in flags else None,
        )
        include_dirs = [flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag == "-I"]
        # Assembly that is not preprocessed (`.s`) gets no depfile: it read itself (and what _assembler_reads finds).
        listed = [str(source.resolve())] if source.suffix == ".s" and not dep.exists() else parse_depfile(dep, named=[source.resolve(), *include_dirs])
    finally:  # the compiler's depfile sits beside the object (in the output directory for `objects`): gone, however it ends
        dep.unlink(missing_ok=True)
    return Reads.of([listed, _assembler_reads(cc, source, flags)])


def _assembler_reads(cc: toolchain.Tool, source: Path, flags: Sequence[str]) -> Reads:
    """What the assembler may read that the depfile leaves out (`.incbin`, `.include`: clang's
    -MD lists neither), found in the source as preprocessed with the compile's own flags (a
    macro cannot hide a directive there; an assembly file `.s` is read as it is): the files
    those lines name, and why the step is then not cached."""
    if source.suffix == ".s":
        text = source.read_text(encoding="utf-8", errors="replace")
    else:
        text = processes.spawn(
            cc.command(*flags, "-E", "-P", source.resolve()), cwd="/", what=f"preprocessing {source.name} with {cc.name}", file=source
        ).stdout
    why, named = assembler_reads(text)
    reads = Reads(p for p in (os.path.join("/", n) for n in named) if os.path.isfile(p))  # the compile ran in "/"
    reads.unlisted = f"{source}: {why}" if why else None
    return reads


# <math.h> is not here: pyree_build ships one for freestanding code, with a library behind it (libm.py).
_HOSTED_HEADER = re.compile(r"'((?:stdio|stdlib|string|pthread|unistd|time|assert|errno|malloc|fcntl)\.h)' file not found")


def _explain_freestanding(text: str) -> str | None:
    """A freestanding build has no libc: say so where a libc header is missing."""
    m = _HOSTED_HEADER.search(text)
    if m is None:
        return None
    return text + (
        f"\nhint: <{m.group(1)}> is part of libc, and standalone plugins and embedded objects are freestanding: "
        "IREE's own ELF loader maps them and links no libraries, so of libc only the math functions are there "
        "(pyree_build's <math.h>, linked in where called). Build a system plugin instead (`--kind system`, CMake "
        "SYSTEM), which may use libc, or remove the include and the calls (the headers there: <stddef.h>, <stdint.h>, "
        "<stdbool.h>, <float.h>, <limits.h>, <stdarg.h> and <math.h>)"
    )


CPUS = ("baseline", "host")


def system_cpu_flags(cc: toolchain.Tool, cpu: str) -> list[str]:
    """Which CPU a system plugin's code may use. zig's clang targets the CPU it runs on
    unless told otherwise, so baseline is said explicitly; host is opt-in (and the cache
    then keys the build by this CPU, see cache.host_cpu)."""
    if cpu not in CPUS:
        raise PyreeError(f"unknown CPU '{cpu}'", fix="use --cpu baseline (portable, default) or --cpu host")
    if cc.name == "zig cc":
        return [f"-mcpu={'native' if cpu == 'host' else 'baseline'}"]
    if cpu == "host":
        return ["-march=native"]
    return {"x86_64": ["-march=x86-64"], "aarch64": ["-march=armv8-a"], "riscv64": ["-march=rv64gc"]}.get(host_arch(), [])


def system_plugin(
    sources: Sequence[PathLike],
    output: PathLike,
    *,
    cc: str = "zig",
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
    depfile: PathLike | None = None,
    cpu: str = "baseline",
    jobs: int | None = None,
    depends_also: Sequence[PathLike] = (),
) -> Path:
    """Build a system plugin: an ordinary shared library loaded with dlopen by the runtime.

    `cpu` is baseline (any CPU of this arch) or host (this CPU's features). `depends_also`: more
    files the depfile lists (what chose the defines, such as a tune's result)."""
    srcs = _check_sources(sources)
    (out,) = check_outputs([output], [*srcs, *included_files(srcs, include_dirs)], depfile=depfile)
    compiler = toolchain.c_compiler(cc)
    opts = CompileOptions(cc, tuple(include_dirs), tuple(defines))
    cflags = [*SYSTEM_CFLAGS, *system_cpu_flags(compiler, cpu), *opts.flags()]
    job = _SystemBuild(srcs, out, compiler, cflags, jobs)
    headers = opts.lookups(srcs)
    cached_action(
        "system plugin",
        key=cflags,
        inputs=srcs,
        outputs=[out],
        build=job.build,
        tools_used=[compiler],
        headers=headers,
        check=lambda paths: _check_plugin(paths[0], [host_arch()], single=True, standalone=False),
        depfile=depfile,
        depends_also=depends_also,
    )
    cpus.remember_plugin_cpu(out, cpu)  # run, bench and verify note a module built for another CPU
    return out


@record(frozen=True)
class _SystemBuild:
    """One `system_plugin` call, planned: what cached_action's build step needs."""

    srcs: list[Path]
    out: Path
    compiler: toolchain.Tool
    cflags: list[str]
    jobs: int | None

    def build(self, private: list[Path]) -> Reads:
        """Compile every source, link the library into `private`, and check and probe it; the files read."""
        (tmp,) = private
        out, compiler = self.out, self.compiler
        with scratch_dir(out.parent, out.name) as build:
            objs = [build / f"{i}_{src.stem}.o" for i, src in enumerate(self.srcs)]
            with echo.Stopwatch(f"compile {len(self.srcs)} source(s) with {compiler.name}"), processes.thread_pool(self.jobs) as pool:
                inputs = Reads.of(pool.map(_compile, itertools.repeat(compiler), self.srcs, objs, itertools.repeat(self.cflags)))
            with echo.Stopwatch(f"link {out.name}"):
                processes.spawn(compiler.command("-shared", *objs, "-o", tmp), what=f"linking {out.name}", file=out)
                try:
                    check_plugin_elf(tmp, arch=host_arch())
                except PyreeError as err:
                    err.file = str(out)  # the temporary name is gone by the time the user reads this
                    raise
                probe_plugin(tmp, label=out)
        return inputs


def _standalone_elf(
    compiler: toolchain.Tool, lld: toolchain.Tool, srcs: list[Path], arch: str, opts: CompileOptions, build: Path, out: Path, final: Path
) -> Reads:
    arch_dir = echo.make_dir(build / arch)
    objs = [arch_dir / f"{i}_{src.stem}.o" for i, src in enumerate(srcs)]
    flags = [*_freestanding_target(compiler, arch), *FREESTANDING_CFLAGS, *opts.flags()]
    inputs = Reads.of(_compile(compiler, src, obj, flags) for src, obj in zip(srcs, objs))
    label = f"{final} ({arch})"
    libs, lib_deps = libm.libraries_for(objs, arch, arch_dir)
    inputs += lib_deps
    processes.spawn(lld.command(*STANDALONE_LDFLAGS, *objs, *libs, "-o", out), what=f"linking the {arch} plugin with iree-lld", file=label)
    try:
        check_plugin_elf(out, arch=arch, standalone=True)
    except PyreeError as err:
        err.file = label  # the scratch file is gone by the time the user reads this
        raise
    return inputs


def standalone_plugin(
    sources: Sequence[PathLike],
    output: PathLike,
    *,
    archs: Sequence[str],
    cc: str = "zig",
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
    depfile: PathLike | None = None,
    jobs: int | None = None,
    depends_also: Sequence[PathLike] = (),
) -> Path:
    """Build freestanding plugin ELFs, one per arch, linked by iree-lld; pack them as FatELF.

    With one arch and an output not ending in .sos, the single ELF is written as is.
    """
    srcs = _check_sources(sources)
    arch_list = list(dict.fromkeys(normalize_arch(a) for a in archs)) or [host_arch()]
    (out,) = check_outputs([output], [*srcs, *included_files(srcs, include_dirs)], depfile=depfile)
    compiler = toolchain.c_compiler(cc)
    lld = toolchain.iree_lld()
    opts = CompileOptions(cc, tuple(include_dirs), tuple(defines), freestanding=True)
    single = len(arch_list) == 1 and out.suffix != ".sos"
    job = _StandaloneBuild(srcs, out, compiler, lld, arch_list, opts, single, jobs)
    headers = opts.lookups(srcs)
    key = [*(normalize_arch(a) for a in arch_list), *FREESTANDING_CFLAGS, *STANDALONE_LDFLAGS, *opts.flags(), libm.key_part()]
    cached_action(
        "standalone plugin",
        key=key,
        inputs=srcs,
        outputs=[out],
        build=job.build,
        tools_used=[compiler, lld],
        headers=headers,
        check=lambda paths: _check_plugin(paths[0], [normalize_arch(a) for a in arch_list], single=single, standalone=True),
        depfile=depfile,
        depends_also=depends_also,
    )
    cpus.remember_plugin_cpu(out, "baseline")
    return out


@record(frozen=True)
class _StandaloneBuild:
    """One `standalone_plugin` call, planned: what cached_action's build step needs."""

    srcs: list[Path]
    out: Path
    compiler: toolchain.Tool
    lld: toolchain.Tool
    arch_list: list[str]
    opts: CompileOptions
    single: bool
    jobs: int | None

    def build(self, private: list[Path]) -> Reads:
        """Build one ELF per arch, in parallel, and write it (or their FatELF) to `private`; the files read."""
        (tmp,) = private
        out, arch_list = self.out, self.arch_list
        with scratch_dir(out.parent, out.name) as build:
            elfs = {arch: build / f"{out.stem}_{arch}.so" for arch in arch_list}
            parallel = " in parallel" if len(arch_list) > 1 else ""
            with echo.Stopwatch(f"compile + link {', '.join(arch_list)}{parallel}"), processes.thread_pool(self.jobs) as pool:
                futures = [pool.submit(_standalone_elf, self.compiler, self.lld, self.srcs, a, self.opts, build, elfs[a], out) for a in arch_list]
                inputs = Reads.of(f.result() for f in futures)
            if self.single:
                echo.echo_command(echo.shell_line(["cp", elfs[arch_list[0]], tmp]))
                tmp.write_bytes(elfs[arch_list[0]].read_bytes())
            else:
                count = f"{len(arch_list)} ELF" + ("s" if len(arch_list) > 1 else "")
                echo.echo_command(echo.shell_line(
                    echo.python_line("-m", "pyree_build", "fatelf", "join", *(elfs[a] for a in arch_list), "-o", tmp, "-q")
                ))  # fmt: skip
                with echo.Stopwatch(f"pack {count} into {out.name}"):
                    tmp.write_bytes(fatelf.pack([elfs[a] for a in arch_list]))
        return inputs


def plugin(
    sources: Sequence[PathLike],
    output: PathLike,
    *,
    kind: str = "system",
    archs: Sequence[str] = (),
    cc: str = "zig",
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
    depfile: PathLike | None = None,
    jobs: int | None = None,
    cpu: str = "baseline",
    depends_also: Sequence[PathLike] = (),
) -> Path:
    """Build a plugin of `kind` 'system' (.so for this host) or 'standalone' (freestanding ELF/.sos).

    `cpu`: system plugins only; baseline (default) or host. `depends_also`: more files the
    depfile lists (what chose the defines, such as a tune's result)."""
    if kind == "system":
        if archs and any(normalize_arch(a) != host_arch() for a in archs):
            raise PyreeError(
                "a system plugin is built for this host only",
                fix="drop --arch, or use --kind standalone to build for other architectures",
            )
        return system_plugin(sources, output, cc=cc, include_dirs=include_dirs, defines=defines, depfile=depfile, cpu=cpu, jobs=jobs,
                             depends_also=depends_also)  # fmt: skip
    if kind == "standalone":
        if cpu != "baseline":
            raise PyreeError(
                "--cpu host applies to system plugins only",
                fix="drop --cpu: standalone plugins are built for each arch's baseline CPU, to run on any CPU of it",
            )
        return standalone_plugin(sources, output, archs=archs, cc=cc, include_dirs=include_dirs, defines=defines, depfile=depfile, jobs=jobs,
                                 depends_also=depends_also)  # fmt: skip
    raise PyreeError(f"unknown plugin kind '{kind}'", fix="use --kind system or --kind standalone")


def objects(
    source: PathLike,
    output_dir: PathLike,
    *,
    archs: Sequence[str],
    cc: str = "zig",
    include_dirs: Sequence[str] = (),
    defines: Sequence[str] = (),
    allow_undefined: Sequence[str] = (),
    depfile: PathLike | None = None,
    jobs: int | None = None,
) -> list[Path]:
    """Compile one C source to a freestanding object per arch, for IREE to link into a module.

    Writes `<output_dir>/<stem>_<arch>.o` with each arch spelled as given, so `--arch arm_64`
    makes the `functions_arm_64.o` that IREE's MLIR names (it calls aarch64 `arm_64`).
    Undefined symbols are rejected unless listed in `allow_undefined` (functions the
    program itself provides).
    """
    src = _check_sources([source])[0]
    out_dir = args.path(output_dir, "output directory")
    arch_list = list(dict.fromkeys(archs))  # spellings; each is checked and mapped below
    for spelling in arch_list:
        normalize_arch(spelling)
    if not arch_list:
        raise PyreeError("no --arch given", fix="pass --arch x86_64 --arch aarch64 (and/or riscv64)")
    compiler = toolchain.c_compiler(cc)
    opts = CompileOptions(cc, tuple(include_dirs), tuple(defines), freestanding=True)
    outs = {arch: out_dir / f"{src.stem}_{arch}.o" for arch in arch_list}
    check_outputs(outs.values(), [src, *included_files([src], include_dirs)], depfile=depfile, output_dirs=[out_dir])
    lld = toolchain.iree_lld()
    job = _ObjectsBuild(src, compiler, lld, opts, outs, allow_undefined, arch_list, jobs)
    headers = opts.lookups([src])
    key = [*(normalize_arch(a) for a in arch_list), *FREESTANDING_CFLAGS, *opts.flags(), *(f"allow={a}" for a in allow_undefined), libm.key_part()]
    outputs = [outs[a] for a in arch_list]
    cached_action("objects", key=key, inputs=[src], outputs=outputs, build=job.build, tools_used=[compiler, lld], headers=headers,
                  check=functools.partial(_check_objects, arch_list), depfile=depfile)  # fmt: skip
    return [outs[a] for a in arch_list]


@record(frozen=True)
class _ObjectsBuild:
    """One `objects` call, planned: what cached_action's build step needs."""

    src: Path
    compiler: toolchain.Tool
    lld: toolchain.Tool  # links the math library into an object that calls it
    opts: CompileOptions
    outs: dict[str, Path]  # by arch as spelled
    allow_undefined: Sequence[str]
    arch_list: list[str]
    jobs: int | None

    def build(self, private: list[Path]) -> Reads:
        """Compile every arch, in parallel, into `private` (in arch order); the files read."""
        with echo.Stopwatch(f"compile {self.src.name} for {', '.join(self.arch_list)}"), processes.thread_pool(self.jobs) as pool:
            return Reads.of(pool.map(self.compile_one, self.arch_list, private))

    def compile_one(self, spelling: str, obj: Path) -> Reads:
        """Compile for one arch and check the object's machine and undefined symbols; the files read."""
        src, compiler = self.src, self.compiler
        arch = normalize_arch(spelling)
        flags = [*_freestanding_target(compiler, arch), *FREESTANDING_CFLAGS, *self.opts.flags()]
        deps = _compile(compiler, src, obj, flags)
        info = read_elf(obj)
        if info.machine != ELF_MACHINES[arch]:
            raise PyreeError(f"object is {info.machine}, expected {ELF_MACHINES[arch]}", file=self.outs[spelling])
        if libm.needed([obj], self.allow_undefined):
            deps += self.link_math(obj, arch, self.outs[spelling])
            info = read_elf(obj)
        unexpected = [s for s in info.undefined if s not in self.allow_undefined]
        if unexpected:
            raise PyreeError(
                f"object for {arch} has undefined symbols: {', '.join(unexpected)}",
                file=src,
                details=explain_undefined(tuple(unexpected), what="an object linked into a module"),
                fix="define them in the source, or pass --allow-undefined NAME for functions the program provides",
            )
        return deps

    def link_math(self, obj: Path, arch: str, final: Path) -> list[str]:
        """Make `obj` carry the math functions it calls (IREE links no library into a module); the files read."""
        with scratch_dir(final.parent, final.name) as scratch:
            libs, deps = libm.libraries_for([obj], arch, scratch, provided=self.allow_undefined)
            for lib in libs:
                libm.link_into_object(self.lld, obj, lib, label=str(final))
        return deps
