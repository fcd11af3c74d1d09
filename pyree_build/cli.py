"""`pyree-build <verb>`: parses arguments, calls one backend function, prints, sets the exit code."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from . import __version__, tools
from .errors import PyreeError


def _common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("-v", "--verbose", action="store_true", help="print every tool command, ready to paste into a shell")
    group.add_argument("-q", "--quiet", action="store_true", help="print only errors")


def _c_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cc", default="zig", choices=tools.C_COMPILERS, help="C compiler (default: zig, the ziglang wheel's clang)")
    parser.add_argument("-I", dest="include_dirs", action="append", default=[], metavar="DIR", help="add an include directory")
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME[=VALUE]", help="define a macro")
    parser.add_argument("--depfile", help="also write a Make/Ninja depfile listing every input (for CMake's DEPFILE)")
    parser.add_argument("-j", "--jobs", type=int, default=None, help="parallel jobs (default: the number of cores)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pyree-build",
        description="Build and run IREE custom dispatches (CPU plugins, FatELF, CUDA PTX, embedded objects) with pip-installed tools.",
    )
    parser.add_argument("--version", action="version", version=f"pyree_build {__version__}")
    parser.add_argument("--cmake-dir", action="store_true", help="print the directory holding pyree_buildConfig.cmake and exit")
    parser.add_argument("--include-dir", action="store_true", help="print the directory holding iree/hal/local/executable_plugin.h and exit")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")

    p = sub.add_parser("plugin", help="C sources -> executable plugin (system .so, or standalone ELF / FatELF .sos)")
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("-o", "--output", required=True, help="output: .so (system or one arch), .sos (FatELF of several arches)")
    p.add_argument("--kind", choices=("system", "standalone"), default="system")
    p.add_argument("--arch", dest="archs", action="append", default=[], help="standalone: x86_64, aarch64, riscv64 (repeatable)")
    p.add_argument(
        "--cpu", choices=("baseline", "host"), default="baseline",
        help="system: baseline (portable to any CPU of this arch, default) or host (this CPU only; keyed by it in the cache)",
    )  # fmt: skip
    _c_options(p)
    _common(p)

    p = sub.add_parser("objects", help="C source -> one freestanding object per arch, for linking into a module")
    p.add_argument("source", metavar="SRC")
    p.add_argument("-o", "--output-dir", required=True, help="writes DIR/<stem>_<arch>.o")
    p.add_argument("--arch", dest="archs", action="append", default=[], required=True, help="x86_64, aarch64, riscv64 (repeatable)")
    p.add_argument("--allow-undefined", action="append", default=[], metavar="NAME", help="a symbol the program itself provides")
    _c_options(p)
    _common(p)

    p = sub.add_parser("fatelf", help="FatELF containers: join, split, list, select (like iree-fatelf)")
    fsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    fj = fsub.add_parser("join", help="pack ELFs into one FatELF")
    fj.add_argument("inputs", nargs="+", metavar="ELF")
    fj.add_argument("-o", "--output", required=True)
    fs = fsub.add_parser("split", help="write each ELF of a FatELF to DIR/<stem>_<arch>.so")
    fs.add_argument("input", metavar="FATELF")
    fs.add_argument("-o", "--output-dir", required=True)
    fl = fsub.add_parser("list", help="print each record: arch, class, byte order, offset, size")
    fl.add_argument("input", metavar="FATELF")
    fe = fsub.add_parser("select", help="extract the ELF for this host (or --arch)")
    fe.add_argument("input", metavar="FATELF")
    fe.add_argument("--arch", help="x86_64, aarch64 or riscv64 (default: this host)")
    fe.add_argument("-o", "--output", required=True)
    for q in (fj, fs, fl, fe):
        _common(q)

    p = sub.add_parser("ptx", help=".cu -> one PTX per sm (NVRTC by default, or nvcc)")
    p.add_argument("source", metavar="SRC.cu")
    p.add_argument("--sm", dest="sms", action="append", required=True, help="e.g. 80 or sm_80 (repeatable)")
    p.add_argument("--compiler", choices=("nvrtc", "nvcc"), default="nvrtc")
    p.add_argument("--verify", action="store_true", help="assemble each PTX with ptxas for its sm")
    p.add_argument(
        "--ptx-isa", default="auto", metavar="auto|native|X.Y",
        help="PTX ISA version to mark the PTX with; auto (default): the newest the driver here and ptxas accept",
    )  # fmt: skip
    p.add_argument("-o", "--output-dir", required=True, help="writes DIR/<stem>_sm_<N>.ptx")
    p.add_argument("-I", dest="include_dirs", action="append", default=[], metavar="DIR")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME[=VALUE]")
    p.add_argument("--depfile")
    p.add_argument("-j", "--jobs", type=int, default=None)
    _common(p)

    p = sub.add_parser("dump", help="write a program's executable sources, binaries and benchmarks, and an index")
    p.add_argument("source", metavar="IN.mlir")
    p.add_argument("-o", "--output-dir", required=True, metavar="DIR")
    p.add_argument("--target", choices=("llvm-cpu", "cuda"), default="llvm-cpu")
    p.add_argument("--sm", default=None, help="cuda target sm (default 80)")
    _common(p)

    p = sub.add_parser("bench", help="microbenchmark a module with iree-benchmark-module; --compare A B for a ratio")
    p.add_argument("modules", nargs="+", metavar="MODULE.vmfb")
    p.add_argument("--compare", action="store_true", help="measure two modules interleaved and print the ratio B/A")
    p.add_argument("--function", default=None, help="the function to time (default: every function, as for dumped benchmarks)")
    p.add_argument("--input", dest="inputs", action="append", default=[], metavar="SPEC")
    p.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="PATH")
    p.add_argument("--device", default="local-sync")
    p.add_argument("--repetitions", type=int, default=5, help="repetitions per measurement (default 5)")
    p.add_argument("--rounds", type=int, default=5, help="--compare: alternations of A and B (default 5)")
    p.add_argument("--skip-unavailable", action="store_true", help="exit 77 (ctest: skipped) when the device is not present")
    _common(p)

    p = sub.add_parser("cuda-target", help="print the #hal.executable.target that keys an sm's objects in MLIR")
    p.add_argument("--sm", required=True, help="e.g. 80")
    _common(p)

    p = sub.add_parser("compile", help="MLIR -> .vmfb with iree-compile (extra iree-compile flags after --)")
    p.add_argument("source", metavar="IN.mlir")
    p.add_argument("-o", "--output", required=True, metavar="OUT.vmfb")
    p.add_argument("--target", choices=("llvm-cpu", "cuda"), default="llvm-cpu")
    p.add_argument("--cpu", default="generic", help="llvm-cpu target CPU: generic (portable, default) or host")
    p.add_argument("--sm", default=None, help="cuda target sm (default 80)")
    p.add_argument("--object-search-path", dest="object_search_paths", action="append", default=[], metavar="DIR")
    p.add_argument(
        "--substitute", dest="substitutions", action="append", default=[], metavar="NAME=FILE",
        help="replace executable NAME: a .mlir/.mlirbc file as its source, any other file as its object (repeatable)",
    )  # fmt: skip
    p.add_argument("--substitute-from", metavar="DIR", help="substitute every executable named by a file in DIR (as dump writes them)")
    p.add_argument("--depfile")
    _common(p)

    p = sub.add_parser("run", help="run a module function with iree-run-module and check its output")
    p.add_argument("module", metavar="MODULE.vmfb")
    p.add_argument("--function", required=True)
    p.add_argument("--input", dest="inputs", action="append", default=[], metavar="SPEC", help='e.g. "8xf32=2" (repeatable)')
    p.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="PATH", help="--executable_plugin (repeatable; later ones are tried first)")
    p.add_argument("--device", default="local-sync", choices=("local-sync", "local-task", "cuda"))
    p.add_argument("--expect", action="append", default=[], metavar="TEXT", help="text that must appear in the output (repeatable)")
    p.add_argument("--check-file", help="FileCheck file whose CHECK lines the output must match")
    p.add_argument("--skip-unavailable", action="store_true", help="exit 77 (ctest: skipped) when the device is not present")
    _common(p)

    p = sub.add_parser("samples", help="build every sample with CMake, run ctest, print a table (the main job)")
    p.add_argument("--build-dir", default="build/samples", help="CMake build directory (default: build/samples)")
    p.add_argument("-R", "--tests-regex", default=None, help="only run tests matching this regex")
    _common(p)

    p = sub.add_parser("new", help="write a downstream CMake project (plugin, MLIR, CMakeLists.txt, README) that builds as written")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("--name", help="CMake project name (default: the directory name)")
    p.add_argument("--force", action="store_true", help="write into a non-empty directory")
    _common(p)

    p = sub.add_parser("cache", help="the build cache: info or clear (location: $PYREE_BUILD_CACHE)")
    p.add_argument("action", choices=("info", "clear"))
    _common(p)

    p = sub.add_parser("doctor", help="show every tool found, its version, and whether a CUDA GPU is usable")
    _common(p)
    return parser


def _cmd_plugin(a: argparse.Namespace) -> None:
    from . import cpu

    out = cpu.plugin(
        a.sources, a.output, kind=a.kind, archs=a.archs, cc=a.cc, include_dirs=a.include_dirs,
        defines=a.defines, depfile=a.depfile, jobs=a.jobs, cpu=a.cpu,
    )  # fmt: skip
    tools.log_step(f"wrote {out}")


def _cmd_objects(a: argparse.Namespace) -> None:
    from . import cpu

    outs = cpu.objects(
        a.source, a.output_dir, archs=a.archs, cc=a.cc, include_dirs=a.include_dirs, defines=a.defines,
        allow_undefined=a.allow_undefined, depfile=a.depfile, jobs=a.jobs,
    )  # fmt: skip
    for out in outs:
        tools.log_step(f"wrote {out}")


def _cmd_fatelf(a: argparse.Namespace) -> None:
    from . import fatelf

    if a.action == "join":
        tools.log_step(f"wrote {fatelf.write(a.output, a.inputs)}")
    elif a.action == "split":
        for out in fatelf.split(a.input, a.output_dir):
            tools.log_step(f"wrote {out}")
    elif a.action == "list":
        print(fatelf.describe(fatelf.read(a.input)))
    elif a.action == "select":
        from .cache import atomic_output
        from .elfcheck import normalize_arch

        kwargs = {}
        if a.arch:
            kwargs["machine"] = fatelf.machine_for_arch(normalize_arch(a.arch))
        data = fatelf.select(a.input, **kwargs)
        with atomic_output(a.output) as tmp:
            tmp.write_bytes(data)
        tools.log_step(f"wrote {a.output}")


def _cmd_ptx(a: argparse.Namespace) -> None:
    from . import cuda

    outs = cuda.ptx(
        a.source, a.sms, a.output_dir, compiler=a.compiler, verify=a.verify, ptx_isa=a.ptx_isa, include_dirs=a.include_dirs,
        defines=a.defines, depfile=a.depfile, jobs=a.jobs,
    )  # fmt: skip
    for out in outs:
        tools.log_step(f"wrote {out}")


def _cmd_dump(a: argparse.Namespace) -> None:
    from . import executables

    index = executables.dump(a.source, a.output_dir, target=a.target, sm=a.sm)
    print(executables.describe(index, a.output_dir))
    tools.log_step(f"wrote {Path(a.output_dir) / 'index.json'}")


def _cmd_bench(a: argparse.Namespace) -> None:
    from . import bench

    common = dict(
        function=a.function, inputs=a.inputs, plugins=a.plugins, device=a.device, repetitions=a.repetitions,
        skip_unavailable=a.skip_unavailable,
    )  # fmt: skip
    if a.compare:
        if len(a.modules) != 2:
            raise PyreeError(f"--compare takes two modules, got {len(a.modules)}", fix="pyree-build bench --compare A.vmfb B.vmfb ...")
        print(bench.compare(a.modules[0], a.modules[1], rounds=a.rounds, **common).render())
        return
    if len(a.modules) != 1:
        raise PyreeError(f"bench takes one module, got {len(a.modules)}", fix="pass one module, or --compare A.vmfb B.vmfb")
    print(bench.bench(a.modules[0], **common).render())


def _cmd_cuda_target(a: argparse.Namespace) -> None:
    from . import iree

    print(iree.cuda_target_attr(a.sm))


def _cmd_compile(a: argparse.Namespace) -> None:
    from . import iree

    out = iree.compile(
        a.source, a.output, target=a.target, cpu=a.cpu, sm=a.sm, object_search_paths=a.object_search_paths,
        flags=a.extra, depfile=a.depfile, substitutions=a.substitutions, substitute_from=a.substitute_from,
    )  # fmt: skip
    tools.log_step(f"wrote {out}")


def _cmd_run(a: argparse.Namespace) -> None:
    from . import iree

    result = iree.run(
        a.module, a.function, inputs=a.inputs, plugins=a.plugins, device=a.device, expect=a.expect,
        check_file=a.check_file, skip_unavailable=a.skip_unavailable,
    )  # fmt: skip
    sys.stdout.write(result.stdout)
    if a.expect or a.check_file:
        tools.log_step(f"output check passed ({result.seconds:.2f} s)")


def _cmd_samples(a: argparse.Namespace) -> int:
    from . import sample_runner

    return sample_runner.main_job(Path(a.build_dir), tests_regex=a.tests_regex)


def _cmd_new(a: argparse.Namespace) -> None:
    from .scaffold import new_project

    out = new_project(a.directory, name=a.name, force=a.force)
    tools.log_step(f"wrote {out}: CMakeLists.txt, plugin.c, program.mlir, README.md, pyproject.toml")
    tools.log_step(f'next: cmake -G Ninja -S {out} -B {out}/build -Dpyree_build_DIR="$(pyree-build --cmake-dir)"')


def _cmd_cache(a: argparse.Namespace) -> None:
    from . import cache

    if a.action == "clear":
        removed, left = cache.cache_clear()
        print(f"removed {removed} entries")
        if left:
            print(f"left {len(left)} files the cache did not write, e.g. {left[0]}")
        return
    info = cache.cache_info()
    if info["root"] is None:
        print(f"cache: off ({cache.CACHE_ENV}=off)")
    else:
        print(f"cache: {info['root']}\nentries: {info['entries']}\nsize: {int(info['bytes']) / 1e6:.1f} MB")
        if not info["marked"]:
            print(f"note: not a pyree_build cache yet (no {cache._TAG}); the first cached build marks a new or empty directory")


def _cmd_doctor(a: argparse.Namespace) -> int:
    from . import doctor

    return doctor.report()


COMMANDS: dict[str, Callable[[argparse.Namespace], int | None]] = {
    "plugin": _cmd_plugin,
    "objects": _cmd_objects,
    "fatelf": _cmd_fatelf,
    "ptx": _cmd_ptx,
    "dump": _cmd_dump,
    "bench": _cmd_bench,
    "cuda-target": _cmd_cuda_target,
    "compile": _cmd_compile,
    "run": _cmd_run,
    "samples": _cmd_samples,
    "new": _cmd_new,
    "cache": _cmd_cache,
    "doctor": _cmd_doctor,
}


def cmake_dir() -> Path:
    """Where pyree_buildConfig.cmake is: installed into the package, or the source tree's cmake/."""
    here = Path(__file__).parent
    for candidate in (here / "share" / "cmake" / "pyree_build", here.parent / "cmake"):
        if (candidate / "pyree_buildConfig.cmake").is_file():
            return candidate
    raise PyreeError("pyree_buildConfig.cmake is not installed", file=here, fix="reinstall with `pip install .` from the pyree_build checkout")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, extra = args[:cut], args[cut + 1 :]
    parser = build_parser()
    ns = parser.parse_args(args)
    ns.extra = extra
    try:
        if ns.cmake_dir:
            print(cmake_dir())
            return 0
        if ns.include_dir:
            print(tools.include_dir())
            return 0
        if not ns.verb:
            parser.print_help()
            return 2
        if extra and ns.verb != "compile":
            parser.error("arguments after -- are passed to iree-compile, so only `compile` takes them")
        tools.set_verbosity(2 if ns.verbose else 0 if ns.quiet else 1)
        code = COMMANDS[ns.verb](ns)
        return int(code or 0)
    except PyreeError as err:
        print(err.render(), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
