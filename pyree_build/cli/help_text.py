"""What `pyree-build <verb> --help` teaches: a description and examples per verb, and the help
of options whose definition in cli.py carries none.

Kept apart from cli.py so that a verb's parsing and its prose change independently; cli.py
attaches both to every parser in one loop. A verb (or option) missing here is caught by
tests/test_help.py.
"""
from __future__ import annotations

# verb (nested verbs as "fatelf join") -> (description paragraph, examples)
VERBS: dict[str, tuple[str, str]] = {
    "": (
        "Build and run IREE custom dispatches (CPU plugins, FatELF, CUDA PTX, embedded objects, "
        "executable substitution) with pip-installed tools. Every verb takes the common options "
        "-v, -q and -j N, before or after the verb.",
        "pyree-build samples                 # build and test every sample (the main job)\n"
        "pyree-build plugin --help           # each verb documents itself\n"
        "pyree-build -v compile example.mlir -o build/example.vmfb",
    ),
    "plugin": (
        "Compile C sources into an IREE executable plugin. A system plugin is a shared library "
        "for this host that the runtime opens with dlopen; a standalone plugin is a freestanding "
        "ELF per arch, linked by iree-lld and packed into a FatELF (.sos) when several arches are "
        "asked for. Each result is checked (machine, export, undefined symbols) before use.",
        "pyree-build plugin --kind system system_plugin.c -o build/system_plugin.so\n"
        "pyree-build plugin --kind standalone --arch x86_64 --arch aarch64 standalone_plugin.c -o build/plugin.sos",
    ),
    "objects": (
        "Compile one C source into a freestanding object per arch, written as DIR/<stem>_<arch>.o, "
        "for iree-compile to link into a module through #hal.executable.objects. Undefined symbols "
        "are refused unless the program provides them (--allow-undefined).",
        "pyree-build objects functions.c --arch x86_64 --arch aarch64 -o build/objects",
    ),
    "fatelf": (
        "Read and write FatELF containers (as iree-fatelf does): one file holding an ELF per "
        "architecture, which IREE's runtime opens as a standalone plugin.",
        "pyree-build fatelf join a_x86_64.so a_aarch64.so -o a.sos\n"
        "pyree-build fatelf list a.sos",
    ),
    "fatelf join": (
        "Pack ELFs (one per architecture) into one FatELF file.",
        "pyree-build fatelf join a_x86_64.so a_aarch64.so a_riscv64.so -o a.sos",
    ),
    "fatelf split": (
        "Write each ELF of a FatELF to DIR/<stem>_<arch>.so, byte-identical to what was joined.",
        "pyree-build fatelf split a.sos -o parts/",
    ),
    "fatelf list": (
        "Print one line per record of a FatELF: arch, class, byte order, offset and size.",
        "pyree-build fatelf list a.sos",
    ),
    "fatelf select": (
        "Extract the ELF a FatELF holds for this host (or for --arch) into its own file.",
        "pyree-build fatelf select a.sos -o host.so\n"
        "pyree-build fatelf select a.sos --arch aarch64 -o a_aarch64.so",
    ),
    "ptx": (
        "Compile a CUDA .cu file into one PTX file per sm, written as DIR/<stem>_sm_<N>.ptx, with "
        "NVRTC from PyPI (no CUDA SDK needed) or nvcc. All outputs are written or none.",
        "pyree-build ptx kernels.cu --sm 75 --sm 80 -o build/ptx\n"
        "pyree-build ptx kernels.cu --sm 80 --ptx-isa 9.0 -o build/ptx",
    ),
    "dump": (
        "Compile a program only far enough to write each of its executables: the source "
        "(module_<name>.mlir), binaries and benchmark programs, plus an index (index.json). "
        "An edited source can be substituted back with `compile --substitute`.",
        "pyree-build dump program.mlir -o dumped/",
    ),
    "spirv": (
        "Compile GLSL compute shaders into SPIR-V, one DIR/<stem>.spv per shader, with glslang "
        "(from PyPI, the default) or glslc, and validate each with spirv-val. A module references "
        "them from #hal.executable.objects and finds them on an object search path.",
        "pyree-build spirv simple_mul.glsl simple_mul_inplace.glsl -o build/spirv",
    ),
    "hsaco": (
        "Compile a HIP source into an AMDGPU code object per gfx (DIR/gfx<N>/<stem>.co) with zig's "
        "clang and iree-lld, no ROCm needed; each object's ELF flags are checked against its gfx, "
        "since iree-compile embeds an object of any gfx without a word.",
        "pyree-build hsaco kernels.cu --gfx 942 --gfx 1100 -o build/hsaco",
    ),
    "bitcode": (
        "Compile CUDA device code into NVPTX LLVM bitcode per sm (DIR/<stem>_sm_<N>.bc) with zig's "
        "clang and no CUDA SDK, for `compile --link-bitcode`: kernels IREE generates can then call "
        "its __device__ functions.",
        "pyree-build bitcode ukernel.cu --sm 80 -o build/bitcode",
    ),
    "code-objects": (
        "List the AMDGPU code objects a .vmfb embeds, with the gfx each was built for; with --gfx, "
        "fail unless one for that gfx is there.",
        "pyree-build code-objects build/hip_example.vmfb --gfx 942",
    ),
    "imports": (
        "List, per executable, the imports a module calls (read from its embedded ELFs); with "
        "--plugin, ask each plugin's resolve, in a child process and in the runtime's order (last "
        "registered first), which one provides each import. An import no plugin resolves is an error.",
        "pyree-build imports build/mlp.vmfb\n"
        "pyree-build imports build/mlp.vmfb --plugin build/matmul_relu_plugin.so",
    ),
    "bench": (
        "Time a module's function with iree-benchmark-module and print mean and median; with "
        "--compare, time two modules alternately and print the ratio of their medians B/A.",
        "pyree-build bench build/example.vmfb --function mixed_invocation --input 8xf32=2 --input 8xf32=4 --plugin build/plugin.so\n"
        "pyree-build bench --compare build/original.vmfb build/edited.vmfb --function main --input 4x4xf32=1 --input 4x4xf32=2",
    ),
    "cuda-target": (
        "Print the #hal.executable.target attribute that iree-compile uses for an sm; paste it as "
        "the key of that sm's PTX in #hal.executable.objects.",
        "pyree-build cuda-target --sm 80",
    ),
    "compile": (
        "Compile an MLIR program into a .vmfb module with iree-compile, finding the objects it "
        "references on the object search paths, optionally substituting executables. Flags after "
        "-- are passed to iree-compile unchanged.",
        "pyree-build compile example.mlir -o build/example.vmfb --target llvm-cpu\n"
        "pyree-build compile example.mlir -o build/example.vmfb -- --mlir-print-ir-after-failure",
    ),
    "run": (
        "Run one function of a module with iree-run-module, loading plugins, and check its output "
        "against --expect texts or a FileCheck file. A failed check exits non-zero and shows "
        "expected against actual.",
        'pyree-build run build/example.vmfb --function mixed_invocation --input 8xf32=2 --input 8xf32=4 --plugin build/plugin.so --expect "8xf32=12"',
    ),
    "samples": (
        "The main job: configure samples/ with CMake and Ninja, build the target iree-sample-deps, "
        "run ctest and print one row per test (sample, test, result, time). CUDA tests are "
        "reported as skipped, with the reason, where no usable GPU is present.",
        "pyree-build samples\n"
        "pyree-build samples -R plugin -j 2",
    ),
    "new": (
        "Write a downstream project (a C plugin, an MLIR program, CMakeLists.txt, pyproject.toml "
        "and a README) that builds and passes its test as written, with CMake or as a wheel.",
        "pyree-build new my_project && cd my_project && cmake -G Ninja -S . -B build "
        '-Dpyree_build_DIR="$(pyree-build --cmake-dir)"',
    ),
    "cache": (
        "Show or clear the build cache, which stores every action's outputs keyed by its inputs, "
        "flags and tools. It lives in $PYREE_BUILD_CACHE (default ~/.cache/pyree_build); "
        "PYREE_BUILD_CACHE=off disables it.",
        "pyree-build cache info\n"
        "pyree-build cache clear",
    ),
    "doctor": (
        "Show pyree_build's version and Python, every tool found (version and path, or how to "
        "install it), whether the IREE wheels match the pinned release, and for each workflow "
        "whether it can be built and run on this machine.",
        "pyree-build doctor",
    ),
}

# Help for options defined without one in cli.py: (verb, dest) first, then ("*", dest).
OPTIONS: dict[tuple[str, str], str] = {
    ("", "verb"): "what to do; `pyree-build VERB --help` documents each",
    ("fatelf", "action"): "what to do with the FatELF",
    ("*", "include_dirs"): "add an include directory (repeatable)",
    ("*", "defines"): "define a macro (repeatable)",
    ("*", "depfile"): "also write a Make/Ninja depfile listing every input (for CMake's DEPFILE)",
    ("*", "output_dir"): "the output directory",
    ("*", "output"): "the output file",
    ("*", "source"): "the input file",
    ("*", "input"): "the FatELF file to read",
    ("plugin", "sources"): "C sources, compiled separately and linked into one plugin",
    ("plugin", "kind"): "system: a .so for this host (dlopen); standalone: freestanding ELF per arch (FatELF .sos for several)",
    ("objects", "source"): "the C source",
    ("fatelf join", "inputs"): "the ELFs to pack, one per architecture",
    ("fatelf join", "output"): "the FatELF file to write",
    ("fatelf select", "output"): "where to write the selected ELF",
    ("ptx", "source"): "the CUDA source",
    ("ptx", "compiler"): "nvrtc: the NVRTC library from PyPI, no CUDA SDK needed; nvcc: the CUDA toolkit's compiler",
    ("dump", "source"): "the MLIR program",
    ("dump", "target"): "the HAL target to compile the executables for",
    ("dump", "object_search_paths"): "a directory where referenced objects are looked for, as for compile (repeatable)",
    ("spirv", "sources"): "GLSL compute shaders (.glsl, .comp)",
    ("hsaco", "source"): "the HIP source",
    ("bitcode", "source"): "the CUDA source holding __device__ functions",
    ("code-objects", "module"): "the compiled module",
    ("imports", "module"): "the compiled module",
    ("bench", "modules"): "the module to time (two with --compare)",
    ("bench", "inputs"): 'an input of the function, e.g. "8xf32=2" or @file.npy (repeatable, in order)',
    ("bench", "plugins"): "an executable plugin the module needs (repeatable)",
    ("bench", "device"): "the HAL device: local-sync, local-task or cuda",
    ("compile", "source"): "the MLIR program",
    ("compile", "target"): "the HAL target backend",
    ("compile", "object_search_paths"): "a directory where referenced objects (.o, .ptx) are looked for (repeatable)",
    ("run", "module"): "the compiled module",
    ("run", "function"): "the function to run",
    ("run", "device"): "the HAL device: local-sync (one thread), local-task (a thread pool) or cuda",
    ("new", "directory"): "the project directory (created; must be empty unless --force)",
    ("cache", "action"): "info: where the cache is, its entries and size; clear: remove every entry",
}

# Text appended to a verb's usage line, for arguments main() takes before argparse sees them.
USAGE_TAIL: dict[str, str] = {"compile": "[-- IREE_FLAGS...]", "dump": "[-- IREE_FLAGS...]"}


def option_help(verb: str, dest: str) -> str | None:
    return OPTIONS.get((verb, dest)) or OPTIONS.get(("*", dest))
