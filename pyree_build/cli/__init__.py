"""`pyree-build <verb>`: parses arguments, calls one backend function, prints, sets the exit code."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Callable, Sequence

from pyree_build.core import echo, processes, toolchain
from pyree_build.core.errors import PyreeError
from pyree_build.core.package import PACKAGE_DIR, __version__

SKIP_EXIT_CODE = 77  # iree.SKIP_EXIT_CODE, without importing iree.py for every verb


def _common(parser: argparse.ArgumentParser) -> None:
    """Kept so verb blocks read alike: `_finish` gives every parser the common options."""


def _add_common_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """-v, -q, -j N on the top-level parser and on every verb, so they go before or after it.

    The verbs' copies default to SUPPRESS: left out after the verb, they keep what was given
    before it instead of resetting it.
    """
    keep = {} if top else {"default": argparse.SUPPRESS}
    group = parser.add_argument_group("common options")
    options = (
        (("-v", "--verbose"), dict(action="store_true", help="print every tool command, ready to paste into a shell")),
        (("-q", "--quiet"), dict(action="store_true", help="print only errors (no step lines, no program output or table)")),
        (("-j", "--jobs"), dict(type=_jobs, metavar="N", help="parallel jobs for independent steps (default: the number of cores)")),
    )
    for flags, kwargs in options:
        if not any(f in parser._option_string_actions for f in flags):
            group.add_argument(*flags, **kwargs, **({"default": False if kwargs.get("action") else None} if top else keep))


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples' line breaks, shows each option's default, and the usage tail main() parses."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if action.option_strings and default not in (None, False, [], argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return super()._fill_text(text, width, indent)
        return argparse.HelpFormatter._fill_text(self, text, width, indent)

    def _format_usage(self, usage, actions, groups, prefix) -> str:  # type: ignore[no-untyped-def]
        from pyree_build.cli.help_text import USAGE_TAIL

        text = super()._format_usage(usage, actions, groups, prefix)
        tail = USAGE_TAIL.get(self._prog.split(" ", 1)[1] if " " in self._prog else "")
        return text.rstrip("\n") + f" {tail}\n\n" if tail else text


def _parsers(parser: argparse.ArgumentParser, name: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    """Every parser: the top level (""), each verb, and nested verbs ("fatelf join")."""
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb, sub in action.choices.items():
                found += _parsers(sub, f"{name} {verb}".strip())
    return found


def _finish(parser: argparse.ArgumentParser) -> None:
    """Give every parser the common options, its description, examples and option help."""
    from pyree_build.cli.help_text import VERBS, option_help

    for name, p in _parsers(parser):
        _add_common_options(p, top=not name)
        p.formatter_class = _HelpFormatter
        description, examples = VERBS.get(name, ("", ""))
        p.description = description or p.description
        if examples:
            p.epilog = "examples:\n" + "\n".join("  " + line for line in examples.splitlines())
        for action in p._actions:
            if not action.help and action.dest not in ("help", "version"):
                action.help = option_help(name, action.dest)


def _jobs(text: str) -> int:
    """-j N: a whole number of at least 1 (argparse reports anything else as a usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number of jobs") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} jobs: must be at least 1 (or leave -j out to use every core)")
    return value


def _source_options(parser: argparse.ArgumentParser) -> None:
    """-I, -D and --depfile, which mean the same to every verb that compiles a source."""
    parser.add_argument("-I", dest="include_dirs", action="append", default=[], metavar="DIR", help="add an include directory (repeatable)")
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME[=VALUE]", help="define a macro (repeatable)")
    parser.add_argument("--depfile", help="also write a Make/Ninja depfile listing every input (for CMake's DEPFILE)")


def _c_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cc", default="zig", choices=toolchain.C_COMPILERS, help="C compiler (default: zig, the ziglang wheel's clang)")
    _source_options(parser)


def _spec_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transform-spec", metavar="SPEC.mlir", help="transform-dialect spec applied before lowering (IREE's --iree-preprocessing-transform-spec-filename)")
    parser.add_argument("--pdl-spec", metavar="SPEC.mlir", help="PDL patterns applied before lowering (IREE's --iree-preprocessing-pdl-spec-filename)")


def _timeout_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout", type=float, default=None, metavar="SECONDS",
        help="stop the run after this long and say why it may hang (default: 300, iree.DEFAULT_RUN_TIMEOUT_S)",
    )  # fmt: skip


def _timeout(a: argparse.Namespace) -> float:
    from pyree_build.actions.iree import DEFAULT_RUN_TIMEOUT_S

    return DEFAULT_RUN_TIMEOUT_S if a.timeout is None else a.timeout


class _Unbuilt:
    """Stands in for a verb's parser that this command line does not name: takes its options
    and sub-verbs, builds nothing (building all ~20 parsers costs ~10 ms per command)."""

    def __getattr__(self, name: str) -> Callable[..., _Unbuilt]:
        return lambda *args, **kwargs: self


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The command-line parser; with `verb`, only that verb's parser is built under the top level
    ("": none); the top level's --help and its list of verbs need them all: build_parser()."""
    parser = argparse.ArgumentParser(
        prog="pyree-build",
        description="Build and run IREE custom dispatches (CPU plugins, FatELF, CUDA PTX, embedded objects) with pip-installed tools.",
    )
    parser.add_argument("--version", action="version", version=f"pyree_build {__version__}")
    parser.add_argument("--cmake-dir", action="store_true", help="print the directory holding pyree_buildConfig.cmake and exit")
    parser.add_argument("--include-dir", action="store_true", help="print the directory holding iree/hal/local/executable_plugin.h and exit")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")

    def add(name: str, **kwargs: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, **kwargs) if verb is None or name == verb else _Unbuilt()  # type: ignore[return-value]

    p = add("plugin", help="C sources -> executable plugin (system .so, or standalone ELF / FatELF .sos)")
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

    p = add("objects", help="C source -> one freestanding object per arch, for linking into a module")
    p.add_argument("source", metavar="SRC")
    p.add_argument("-o", "--output-dir", required=True, help="writes DIR/<stem>_<arch>.o")
    p.add_argument("--arch", dest="archs", action="append", default=[], required=True, help="x86_64, aarch64, riscv64 (repeatable)")
    p.add_argument("--allow-undefined", action="append", default=[], metavar="NAME", help="a symbol the program itself provides")
    _c_options(p)
    _common(p)

    p = add("fatelf", help="FatELF containers: join, split, list, select (like iree-fatelf)")
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

    p = add("ptx", help=".cu -> one PTX per sm (NVRTC by default, or nvcc)")
    p.add_argument("source", metavar="SRC.cu")
    p.add_argument("--sm", dest="sms", action="append", required=True, help="e.g. 80 or sm_80 (repeatable)")
    p.add_argument("--compiler", choices=("nvrtc", "nvcc"), default="nvrtc")
    p.add_argument("--verify", action="store_true", help="assemble each PTX with ptxas for its sm")
    p.add_argument(
        "--ptx-isa", default="auto", metavar="auto|native|X.Y",
        help="PTX ISA version to mark the PTX with; auto (default): the newest the driver here and ptxas accept",
    )  # fmt: skip
    p.add_argument("-o", "--output-dir", required=True, help="writes DIR/<stem>_sm_<N>.ptx")
    _source_options(p)
    _common(p)

    p = add("dump", help="write a program's executable sources, binaries and benchmarks, and an index (extra iree-compile flags after --)")
    p.add_argument("source", metavar="IN.mlir")
    p.add_argument("-o", "--output-dir", required=True, metavar="DIR")
    p.add_argument("--target", choices=("llvm-cpu", "cuda"), default="llvm-cpu")
    p.add_argument("--sm", default=None, help="cuda target sm (default 80)")
    p.add_argument("--object-search-path", dest="object_search_paths", action="append", default=[], metavar="DIR")
    _spec_options(p)
    p.add_argument("--force", action="store_true", help="overwrite dumped files edited since the last dump, and other files in the way")
    _common(p)

    p = add("bench", help="microbenchmark a module with iree-benchmark-module; --compare A B for a ratio")
    p.add_argument("modules", nargs="+", metavar="MODULE.vmfb")
    p.add_argument("--compare", action="store_true", help="measure two modules interleaved and print the ratio B/A")
    p.add_argument("--function", default=None, help="the function to time (default: every function, as for dumped benchmarks)")
    p.add_argument("--input", dest="inputs", action="append", default=[], metavar="SPEC")
    p.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="PATH")
    p.add_argument("--device", default="local-sync")
    p.add_argument("--repetitions", type=int, default=5, help="repetitions per measurement (default 5)")
    p.add_argument("--rounds", type=int, default=5, help="--compare: alternations of A and B (default 5)")
    p.add_argument("--skip-unavailable", action="store_true", help="exit 77 (ctest: skipped) when the device is not present")
    _timeout_option(p)
    _common(p)

    p = add("cuda-target", help="print the #hal.executable.target that keys an sm's objects in MLIR")
    p.add_argument("--sm", required=True, help="e.g. 80")
    _common(p)

    p = add("spirv", help="GLSL compute shaders -> SPIR-V (.spv), validated with spirv-val")
    p.add_argument("sources", nargs="+", metavar="SHADER.glsl")
    p.add_argument("-o", "--output-dir", required=True, help="writes DIR/<stem>.spv")
    p.add_argument("--compiler", choices=("glslang", "glslc"), default="glslang", help="glslang (default; pip) or glslc (shaderc)")
    _source_options(p)
    _common(p)

    p = add("hsaco", help="HIP source -> one AMDGPU code object per gfx (zig clang + iree-lld, no ROCm)")
    p.add_argument("source", metavar="SRC.cu|SRC.hip")
    p.add_argument("--gfx", dest="gfxs", action="append", required=True, help="e.g. 942 or gfx942 (repeatable)")
    p.add_argument("-o", "--output-dir", required=True, help="writes DIR/gfx<N>/<stem>.co")
    _source_options(p)
    _common(p)

    p = add("bitcode", help="CUDA device code -> NVPTX LLVM bitcode per sm (zig clang, no CUDA SDK), for compile --link-bitcode")
    p.add_argument("source", metavar="SRC.cu")
    p.add_argument("--sm", dest="sms", action="append", required=True, help="e.g. 80 or sm_80 (repeatable)")
    p.add_argument("-o", "--output-dir", required=True, help="writes DIR/<stem>_sm_<N>.bc")
    _source_options(p)
    _common(p)

    p = add("code-objects", help="list the AMDGPU code objects a .vmfb embeds; --gfx N checks one is there")
    p.add_argument("module", metavar="MODULE.vmfb")
    p.add_argument("--gfx", dest="gfxs", action="append", default=[], help="fail unless a code object for this gfx is embedded (repeatable)")
    _common(p)

    p = add("compile", help="MLIR -> .vmfb with iree-compile (extra iree-compile flags after --)")
    p.add_argument("source", metavar="IN.mlir")
    p.add_argument("-o", "--output", required=True, metavar="OUT.vmfb")
    p.add_argument("--target", choices=("llvm-cpu", "cuda", "vulkan", "hip"), default="llvm-cpu")
    p.add_argument("--cpu", default="generic", help="llvm-cpu target CPU: generic (portable, default) or host")
    p.add_argument("--vulkan-target", default=None, help="vulkan: auto (default: the Vulkan device here), llvmpipe, ampere, rdna3, ...")
    p.add_argument("--gfx", default=None, help="hip target gfx (default 942)")
    p.add_argument("--link-bitcode", dest="link_bitcode", action="append", default=[], metavar="FILE.bc", help="LLVM bitcode to link into the generated GPU code (repeatable)")
    p.add_argument("--sm", default=None, help="cuda target sm (default 80)")
    p.add_argument("--object-search-path", dest="object_search_paths", action="append", default=[], metavar="DIR")
    p.add_argument(
        "--substitute", dest="substitutions", action="append", default=[], metavar="NAME=FILE",
        help="replace executable NAME: a .mlir/.mlirbc file as its source, any other file as its object (repeatable)",
    )  # fmt: skip
    p.add_argument("--substitute-from", metavar="DIR", help="substitute every executable named by a file in DIR (as dump writes them)")
    _spec_options(p)
    p.add_argument(
        "--expect-import", dest="expect_imports", action="append", default=[], metavar="NAME",
        help="fail (and write no module) unless the compiled module calls import NAME, e.g. the one a spec should have put there (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--preprocess", metavar="PIPELINE",
        help="run iree-opt --pass-pipeline=PIPELINE on the source first (input-level rewrites on tosa/torch, e.g. PDL patterns)",
    )  # fmt: skip
    p.add_argument("--depfile")
    _common(p)

    p = add("run", help="run a module function with iree-run-module and check its output")
    p.add_argument("module", metavar="MODULE.vmfb")
    p.add_argument("--function", required=True)
    p.add_argument("--input", dest="inputs", action="append", default=[], metavar="SPEC", help='e.g. "8xf32=2" (repeatable)')
    p.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="PATH", help="--executable_plugin (repeatable; later ones are tried first)")
    p.add_argument("--device", default="local-sync", choices=("local-sync", "local-task", "cuda", "vulkan", "hip"))
    p.add_argument(
        "--expect", action="append", default=[], metavar="TEXT",
        help="TEXT must appear within one output line, as a substring; runs of whitespace compare equal (repeatable)",
    )  # fmt: skip
    p.add_argument("--check-file", help="FileCheck file whose CHECK lines the output must match")
    p.add_argument(
        "--check-prefix", dest="check_prefixes", action="append", default=[], metavar="PREFIX",
        help="with --check-file: check lines with this prefix, e.g. CHECK-SYSTEM (repeatable; default CHECK)",
    )  # fmt: skip
    p.add_argument("--skip-unavailable", action="store_true", help="exit 77 (ctest: skipped) when the device is not present")
    _timeout_option(p)
    _common(p)

    p = add("imports", help="list the imports each executable of a module calls, and which --plugin resolves each")
    p.add_argument("module", metavar="MODULE.vmfb")
    p.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="PATH", help="ask this plugin's resolve (repeatable; later ones are asked first, as at run time)")
    _common(p)

    p = add("samples", help="build every sample with CMake, run ctest, print a table (the main job)")
    p.add_argument("--build-dir", default="build/samples", help="CMake build directory (default: build/samples)")
    p.add_argument("-R", "--tests-regex", default=None, help="only run tests matching this regex")
    _common(p)

    p = add("new", help="write a downstream CMake project (plugin, MLIR, CMakeLists.txt, README) that builds as written")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("--name", help="CMake project name (default: the directory name)")
    p.add_argument("--force", action="store_true", help="write into a non-empty directory")
    p.add_argument("--import", dest="import_name", metavar="NAME", help="generate the plugin and program for your own import NAME (with --args)")
    p.add_argument("--args", dest="import_args", metavar="KIND:TYPE,...", help='the import\'s buffers in call order, KIND in|out|inout, e.g. "in:f32,in:f32,out:f32"')
    _common(p)

    p = add("cache", help="the build cache: info or clear (location: $PYREE_BUILD_CACHE)")
    p.add_argument("action", choices=("info", "clear"))
    _common(p)

    p = add("doctor", help="show every tool found, its version, and whether a CUDA GPU is usable")
    _common(p)
    _finish(parser)
    return parser


def _cmd_plugin(a: argparse.Namespace) -> None:
    from pyree_build.backends.llvm_cpu import plugins as cpu

    out = cpu.plugin(
        a.sources, a.output, kind=a.kind, archs=a.archs, cc=a.cc, include_dirs=a.include_dirs,
        defines=a.defines, depfile=a.depfile, jobs=a.jobs, cpu=a.cpu,
    )  # fmt: skip
    echo.log_step(f"wrote {out}")


def _cmd_objects(a: argparse.Namespace) -> None:
    from pyree_build.backends.llvm_cpu import plugins as cpu

    outs = cpu.objects(
        a.source, a.output_dir, archs=a.archs, cc=a.cc, include_dirs=a.include_dirs, defines=a.defines,
        allow_undefined=a.allow_undefined, depfile=a.depfile, jobs=a.jobs,
    )  # fmt: skip
    for out in outs:
        echo.log_step(f"wrote {out}")


def _cmd_fatelf(a: argparse.Namespace) -> None:
    from pyree_build.backends.llvm_cpu import fatelf

    if a.action == "join":
        echo.log_step(f"wrote {fatelf.write(a.output, a.inputs)}")
    elif a.action == "split":
        for out in fatelf.split(a.input, a.output_dir):
            echo.log_step(f"wrote {out}")
    elif a.action == "list":
        print(fatelf.describe(fatelf.read(a.input)))
    elif a.action == "select":
        from pyree_build.backends.llvm_cpu.elf import normalize_arch
        from pyree_build.core.files import atomic_output
        from pyree_build.core.outputs import check_outputs

        check_outputs([a.output], [a.input])
        kwargs = {}
        if a.arch:
            kwargs["machine"] = fatelf.machine_for_arch(normalize_arch(a.arch))
        data = fatelf.select(a.input, **kwargs)
        with atomic_output(a.output) as tmp:
            tmp.write_bytes(data)
        echo.log_step(f"wrote {a.output}")


def _cmd_ptx(a: argparse.Namespace) -> None:
    from pyree_build.backends.cuda import ptx as cuda

    outs = cuda.ptx(
        a.source, a.sms, a.output_dir, compiler=a.compiler, verify=a.verify, ptx_isa=a.ptx_isa, include_dirs=a.include_dirs,
        defines=a.defines, depfile=a.depfile, jobs=a.jobs,
    )  # fmt: skip
    for out in outs:
        echo.log_step(f"wrote {out}")


def _cmd_dump(a: argparse.Namespace) -> None:
    from pyree_build.actions import executables

    index = executables.dump(
        a.source, a.output_dir, target=a.target, sm=a.sm, flags=a.extra, transform_spec=a.transform_spec, pdl_spec=a.pdl_spec,
        object_search_paths=a.object_search_paths, force=a.force,
    )  # fmt: skip
    print(executables.describe(index, a.output_dir))
    echo.log_step(f"wrote {Path(a.output_dir) / 'index.json'}")


def _cmd_bench(a: argparse.Namespace) -> None:
    from pyree_build.actions import bench

    common = dict(
        function=a.function, inputs=a.inputs, plugins=a.plugins, device=a.device, repetitions=a.repetitions,
        skip_unavailable=a.skip_unavailable, timeout=_timeout(a),
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
    from pyree_build.actions import iree

    print(iree.cuda_target_attr(a.sm))


def _cmd_spirv(a: argparse.Namespace) -> None:
    from pyree_build.backends.vulkan import spirv

    for out in spirv.spirv(a.sources, a.output_dir, compiler=a.compiler, include_dirs=a.include_dirs, defines=a.defines, depfile=a.depfile):
        echo.log_step(f"wrote {out}")


def _cmd_hsaco(a: argparse.Namespace) -> None:
    from pyree_build.backends.hip import hsaco as hip

    outs = hip.hsaco(a.source, a.gfxs, a.output_dir, include_dirs=a.include_dirs, defines=a.defines, depfile=a.depfile, jobs=a.jobs)
    for out in outs:
        echo.log_step(f"wrote {out}")


def _cmd_bitcode(a: argparse.Namespace) -> None:
    from pyree_build.backends.cuda import bitcode

    outs = bitcode.bitcode(a.source, a.sms, a.output_dir, include_dirs=a.include_dirs, defines=a.defines, depfile=a.depfile, jobs=a.jobs)
    for out in outs:
        echo.log_step(f"wrote {out}")


def _cmd_code_objects(a: argparse.Namespace) -> None:
    from pyree_build.backends.hip import hsaco as hip

    objects = hip.embedded_code_objects(a.module)
    print(hip.describe(objects))
    have = {o.gfx for o in objects}
    missing = [g for g in dict.fromkeys(hip.normalize_gfx(x) for x in a.gfxs) if g not in have]
    if missing:
        raise PyreeError(
            f"the module embeds no code object for {', '.join(missing)}",
            file=a.module,
            fix="compile it with --target hip --gfx N for that gfx, with the code objects from `pyree-build hsaco --gfx N`",
        )


def _cmd_compile(a: argparse.Namespace) -> None:
    from pyree_build.actions import iree

    out = iree.compile(
        a.source, a.output, target=a.target, cpu=a.cpu, sm=a.sm, object_search_paths=a.object_search_paths,
        flags=a.extra, depfile=a.depfile, substitutions=a.substitutions, substitute_from=a.substitute_from,
        transform_spec=a.transform_spec, pdl_spec=a.pdl_spec, expect_imports=a.expect_imports, preprocess=a.preprocess,
        vulkan_target=a.vulkan_target, gfx=a.gfx, link_bitcode=a.link_bitcode,
    )  # fmt: skip
    echo.log_step(f"wrote {out}")


def _cmd_run(a: argparse.Namespace) -> None:
    from pyree_build.actions import iree

    if a.check_prefixes and not a.check_file:
        raise PyreeError("--check-prefix selects lines of a --check-file, and none was given", fix="add --check-file FILE")
    result = iree.run(
        a.module, a.function, inputs=a.inputs, plugins=a.plugins, device=a.device, expect=a.expect,
        check_file=a.check_file, skip_unavailable=a.skip_unavailable, check_prefixes=a.check_prefixes, timeout=_timeout(a),
    )  # fmt: skip
    if not a.quiet:
        sys.stdout.write(result.stdout)
    if a.expect or a.check_file:
        echo.log_step(f"output check passed ({result.seconds:.2f} s)")


def _cmd_imports(a: argparse.Namespace) -> None:
    from pyree_build.backends.llvm_cpu import imports

    if a.plugins:
        found, resolution = imports.check_resolved(a.module, a.plugins)
        print(imports.describe(found, resolution))
    else:
        print(imports.describe(imports.module_imports(a.module)))


def _cmd_samples(a: argparse.Namespace) -> int:
    from pyree_build.actions import sample_runner

    return sample_runner.main_job(Path(a.build_dir), tests_regex=a.tests_regex, jobs=a.jobs)


def _cmd_new(a: argparse.Namespace) -> None:
    from pyree_build.actions.scaffold import new_project

    out = new_project(a.directory, name=a.name, force=a.force, import_name=a.import_name, import_args=a.import_args)
    echo.log_step(f"wrote {out}: CMakeLists.txt, plugin.c, program.mlir, README.md, pyproject.toml")
    echo.log_step(f'next: cmake -G Ninja -S {out} -B {out}/build -Dpyree_build_DIR="$(pyree-build --cmake-dir)"')


def _cmd_cache(a: argparse.Namespace) -> None:
    from pyree_build.cache import local as cache

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
    from pyree_build.actions import doctor

    return doctor.report()


COMMANDS: dict[str, Callable[[argparse.Namespace], int | None]] = {
    "plugin": _cmd_plugin,
    "objects": _cmd_objects,
    "fatelf": _cmd_fatelf,
    "ptx": _cmd_ptx,
    "dump": _cmd_dump,
    "bench": _cmd_bench,
    "cuda-target": _cmd_cuda_target,
    "spirv": _cmd_spirv,
    "hsaco": _cmd_hsaco,
    "bitcode": _cmd_bitcode,
    "code-objects": _cmd_code_objects,
    "compile": _cmd_compile,
    "run": _cmd_run,
    "imports": _cmd_imports,
    "samples": _cmd_samples,
    "new": _cmd_new,
    "cache": _cmd_cache,
    "doctor": _cmd_doctor,
}


def cmake_dir() -> Path:
    """Where pyree_buildConfig.cmake is: installed into the package, or the source tree's cmake/."""
    here = PACKAGE_DIR
    for candidate in (here / "share" / "cmake" / "pyree_build", here.parent / "cmake"):
        if (candidate / "pyree_buildConfig.cmake").is_file():
            return candidate
    raise PyreeError("pyree_buildConfig.cmake is not installed", file=here, fix="reinstall with `pip install .` from the pyree_build checkout")


def _verb_parser(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost parser the command line chose, so its error shows that verb's usage."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(ns, action.dest, None) or "")
            if chosen is not None:
                return _verb_parser(chosen, ns)
    return parser


def _named_verb(args: Sequence[str]) -> str | None:
    """The verb a command line names (its first word that is no option nor -j's value); "" when
    it names none (--version: no verb's parser is needed); None for help (every verb is listed)."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("-j", "--jobs"):
            skip = True
        elif arg in ("-h", "--help"):
            return None
        elif not arg.startswith("-"):
            return arg
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, extra = args[:cut], args[cut + 1 :]
    named = _named_verb(args)
    parser = build_parser(named)
    if named and not any(isinstance(a, argparse._SubParsersAction) and a.choices for a in parser._actions):
        parser = build_parser()  # not a verb: the full parser says which verbs there are
    ns, unknown = parser.parse_known_args(args)
    if unknown:
        _verb_parser(parser, ns).error(f"unrecognized arguments: {' '.join(unknown)}")
    ns.extra = extra
    try:
        if ns.cmake_dir:
            print(cmake_dir())
            return 0
        if ns.include_dir:
            print(toolchain.include_dir())
            return 0
        if not ns.verb:
            build_parser().print_help()
            return 2
        if extra and ns.verb not in ("compile", "dump"):
            parser.error("arguments after -- are passed to iree-compile, so only `compile` and `dump` take them")
        echo.set_verbosity(2 if ns.verbose else 0 if ns.quiet else 1)
        # SIGINT/SIGTERM end every tool started (its whole process group) and unwind, so
        # temporaries are removed; then the exit code says which signal stopped us.
        with processes.stop_on_signals():
            code = COMMANDS[ns.verb](ns)
        sys.stdout.flush()  # here, so a reader that went away is seen while it can be handled
        return int(code or 0)
    except PyreeError as err:
        text = err.render()
        if err.exit_code == SKIP_EXIT_CODE:
            text = text.removeprefix("error: ")  # a skip (ctest's SKIP_RETURN_CODE) is not an error
        print(text, file=sys.stderr)
        return err.exit_code
    except processes.Stopped as stop:
        print(f"stopped by {stop}: every tool pyree_build started was ended", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_went_away()


def _reader_went_away() -> int:
    """The reader of stdout stopped (`... | head`): stop quietly, as other command-line tools do."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the flush at exit does not fail again
    return 128 + signal.SIGPIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
