"""llvm-cpu: modules for the host CPU (local-sync, local-task), CPU plugins (system .so and
standalone FatELF .sos) and embedded objects linked into a module."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pyree_build.backends.base import Backend, CompileJob, InlineKernelSource, Option, ToolCheck, Verb, Workflow
from pyree_build.backends.options import C_OPTIONS, plugin_option
from pyree_build.core import lazy, toolchain

# Loaded on first use: declaring the backend (help, doctor, the registry) reads it not.
_loader = lazy.module("pyree_build.backends.llvm_cpu.loader")
_inline = lazy.module("pyree_build.backends.llvm_cpu.inline")
_imports = lazy.module("pyree_build.backends.llvm_cpu.imports")

_SOURCES_PLUGIN = "pyree_build.backends.llvm_cpu.plugins"
_FATELF = "pyree_build.backends.llvm_cpu.fatelf"
_FATELF_FILE = Option(("input",), {"metavar": "FATELF", "help": "the FatELF file to read"})


class LlvmCpuBackend(Backend):
    name = "llvm-cpu"
    description = "the host CPU: modules, CPU plugins (system .so, standalone FatELF .sos), embedded objects"
    devices = ("local-sync", "local-task")
    dumps = True
    # iree-compile 3.13 crashes (null inner module) on object substitution for llvm-cpu.
    substitutes_objects = False
    compile_options = (Option(("--cpu",), {"default": "generic", "help": "llvm-cpu target CPU: generic (portable, default) or host"}),)
    verbs = (
        Verb(
            "plugin",
            "C sources -> executable plugin (system .so, or standalone ELF / FatELF .sos)",
            f"{_SOURCES_PLUGIN}:plugin",
            (
                Option(("sources",), {"nargs": "+", "metavar": "SRC"}),
                Option(("-o", "--output"), {"required": True, "help": "output: .so (system or one arch), .sos (FatELF of several arches)"}),
                Option(("--kind",), {"choices": ("system", "standalone"), "default": "system"}),
                Option(("--arch",), {"dest": "archs", "action": "append", "default": [], "help": "standalone: x86_64, aarch64, riscv64 (repeatable)"}),
                Option(
                    ("--cpu",),
                    {
                        "choices": ("baseline", "host"),
                        "default": "baseline",
                        "help": "system: baseline (portable to any CPU of this arch, default) or host (this CPU only; keyed by it in the cache)",
                    },
                ),
                *C_OPTIONS,
            ),
            description=(
                "Compile C sources into an IREE executable plugin. A system plugin is a shared library "
                "for this host that the runtime opens with dlopen; a standalone plugin is a freestanding "
                "ELF per arch, linked by iree-lld and packed into a FatELF (.sos) when several arches are "
                "asked for. Each result is checked (machine, export, undefined symbols) before use. "
                "Freestanding code may #include <math.h>: the functions it calls (expf, sqrtf, tanhf, powf, ...) "
                "are linked in from pyree_build's math library, built once per arch and cached."
            ),
            examples=(
                "pyree-build plugin --kind system system_plugin.c -o build/system_plugin.so\n"
                "pyree-build plugin --kind standalone --arch x86_64 --arch aarch64 standalone_plugin.c -o build/plugin.sos"
            ),
        ),
        Verb(
            "objects",
            "C source -> one freestanding object per arch, for linking into a module",
            f"{_SOURCES_PLUGIN}:objects",
            (
                Option(("source",), {"metavar": "SRC"}),
                Option(("-o", "--output-dir"), {"required": True, "help": "writes DIR/<stem>_<arch>.o"}),
                Option(("--arch",), {"dest": "archs", "action": "append", "default": [], "required": True, "help": "x86_64, aarch64, riscv64 (repeatable)"}),
                Option(("--allow-undefined",), {"action": "append", "default": [], "metavar": "NAME", "help": "a symbol the program itself provides"}),
                *C_OPTIONS,
            ),
            description=(
                "Compile one C source into a freestanding object per arch, written as DIR/<stem>_<arch>.o, "
                "for iree-compile to link into a module through #hal.executable.objects. Undefined symbols "
                "are refused unless the program provides them (--allow-undefined). The <math.h> functions the "
                "source calls (expf, sqrtf, ...) are linked into the object itself, since IREE links no library."
            ),
            examples="pyree-build objects functions.c --arch x86_64 --arch aarch64 -o build/objects",
        ),
        Verb(
            "fatelf",
            "FatELF containers: join, split, list, select (like iree-fatelf)",
            actions=(
                Verb(
                    "join",
                    "pack ELFs into one FatELF",
                    f"{_FATELF}:join_files",
                    (Option(("inputs",), {"nargs": "+", "metavar": "ELF"}), Option(("-o", "--output"), {"required": True})),
                    description="Pack ELFs (one per architecture) into one FatELF file.",
                    examples="pyree-build fatelf join a_x86_64.so a_aarch64.so a_riscv64.so -o a.sos",
                ),
                Verb(
                    "split",
                    "write each ELF of a FatELF to DIR/<stem>_<arch>.so",
                    f"{_FATELF}:split",
                    (Option(("path",), {"metavar": "FATELF", "help": "the FatELF file to read"}), Option(("-o", "--output-dir"), {"required": True})),
                    description="Write each ELF of a FatELF to DIR/<stem>_<arch>.so, byte-identical to what was joined.",
                    examples="pyree-build fatelf split a.sos -o parts/",
                ),
                Verb(
                    "list",
                    "print each record: arch, class, byte order, offset, size",
                    f"{_FATELF}:listing",
                    (_FATELF_FILE,),
                    description="Print one line per record of a FatELF: arch, class, byte order, offset and size.",
                    examples="pyree-build fatelf list a.sos",
                ),
                Verb(
                    "select",
                    "extract the ELF for this host (or --arch)",
                    f"{_FATELF}:select_file",
                    (
                        _FATELF_FILE,
                        Option(("--arch",), {"help": "x86_64, aarch64 or riscv64 (default: this host)"}),
                        Option(("-o", "--output"), {"required": True}),
                    ),
                    description="Extract the ELF a FatELF holds for this host (or for --arch) into its own file.",
                    examples="pyree-build fatelf select a.sos -o host.so\npyree-build fatelf select a.sos --arch aarch64 -o a_aarch64.so",
                ),
            ),
            description=(
                "Read and write FatELF containers (as iree-fatelf does): one file holding an ELF per "
                "architecture, which IREE's runtime opens as a standalone plugin."
            ),
            examples="pyree-build fatelf join a_x86_64.so a_aarch64.so -o a.sos\npyree-build fatelf list a.sos",
        ),
        Verb(
            "imports",
            "list the imports each executable of a module calls, and which --plugin resolves each",
            "pyree_build.backends.llvm_cpu.imports:listing",
            (
                Option(("module",), {"metavar": "MODULE.vmfb"}),
                plugin_option("ask this plugin's resolve (repeatable; later ones are asked first, as at run time)"),
            ),
            description=(
                "List, per executable, the imports a module calls (read from its embedded ELFs); with "
                "--plugin, ask each plugin's resolve, in a child process and in the runtime's order (last "
                "registered first), which one provides each import. An import no plugin resolves is an error."
            ),
            examples="pyree-build imports build/mlp.vmfb\npyree-build imports build/mlp.vmfb --plugin build/matmul_relu_plugin.so",
        ),
    )
    tools = (
        ToolCheck("zig cc", lambda: toolchain.c_compiler("zig"), True, "default C compiler (every arch)", toolchain.INSTALL_ZIG),
        ToolCheck("clang", lambda: toolchain.c_compiler("clang"), False, "optional C compiler (--cc clang)", toolchain.INSTALL_CLANG),
        ToolCheck("gcc", lambda: toolchain.c_compiler("gcc"), False, "optional C compiler for system plugins (--cc gcc)", toolchain.INSTALL_GCC),
    )
    workflows = (
        Workflow("system plugin", build=("zig cc|clang|gcc", "iree-compile"), run=("iree-run-module",)),
        Workflow("standalone plugin (FatELF)", build=("zig cc|clang", "iree-lld", "iree-compile"), run=("iree-run-module",)),
        Workflow("embedded objects", build=("zig cc|clang", "iree-compile"), run=("iree-run-module",)),
    )

    def target_flags(self, options: Mapping[str, Any]) -> list[str]:
        return [
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            f"--iree-llvmcpu-target-cpu={options.get('cpu') or 'generic'}",
        ]

    def before_compile(self, job: CompileJob) -> None:
        _loader.warn_without_bareptr(job.source, job.text, job.spec_files)

    def require_imports(self, module: Path, names: Sequence[str]) -> None:
        _imports.require_imports(module, names, what="compiled module")

    def missing_object_hint(self, name: str, search_paths: Sequence[Path]) -> str:
        return _loader.arch_spelling_hint(name, search_paths)

    def probe(self, device: str) -> tuple[bool, str]:
        # "host" is doctor's name for the CPU; the local devices need no check before a run.
        if device == "host":
            return _loader.host_status()
        return super().probe(device)

    def explain_run(self, run_output: str) -> str | None:
        return _loader.explain_loader(run_output)

    inline_suffixes = (".c",)

    def build_inline_objects(self, kernel: InlineKernelSource) -> list[Path]:
        search: list[Path] = _inline.build_objects(kernel)
        return search

    def build_inline_plugins(self, kernel: InlineKernelSource, module: Path) -> list[Path]:
        built: list[Path] = _inline.build_plugin(kernel, module)
        return built


BACKEND = LlvmCpuBackend()
