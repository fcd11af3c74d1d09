"""The core verbs, declared as data (as the backends declare theirs): name, help, options,
description and examples. cli/parser.py turns these and the backends' verbs into argparse
parsers by one code path; cli/commands.py says what each core verb runs.

Values only the registry knows (the targets, the devices) are `Registered` choices, read
when a command line is checked or help is shown, so a command that names a built-in target
never scans the installed packages for others.

Long (~700 lines) because it is data: one declaration per verb and option, with its help and
examples, read top to bottom like the CLI reference it generates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from pyree_build import backends
from pyree_build.backends.base import Option, Verb
from pyree_build.backends.options import C_OPTIONS, plugin_option


class Registered:
    """argparse `choices` read from the backend registry: a value is looked for among the
    built-in backends first, and among installed ones only when it is not there; listing
    (help, a usage error) reads them all."""

    def __init__(self, listing: Callable[[bool], list[str]]) -> None:
        self._listing = listing

    def __contains__(self, value: object) -> bool:
        return value in self._listing(False) or value in self._listing(True)

    def __iter__(self) -> Iterator[str]:
        return iter(self._listing(True))


def _backends(external: bool) -> list[backends.Backend]:
    return backends.every() if external else backends.builtin()


TARGETS = Registered(lambda external: backends.names(external=external))
DUMP_TARGETS = Registered(lambda external: [b.name for b in _backends(external) if b.dumps])
DEVICES = Registered(lambda external: backends.devices(external=external))

# The verbs that take every backend's compile options (`--sm` of cuda, `--cpu` of llvm-cpu).
TAKE_COMPILE_OPTIONS = ("compile", "dump")

_SPEC_OPTIONS = (
    Option(
        ("--transform-spec",),
        {"metavar": "SPEC.mlir", "help": "transform-dialect spec applied before lowering (IREE's --iree-preprocessing-transform-spec-filename)"},
    ),
    Option(
        ("--pdl-spec",),
        {"metavar": "SPEC.mlir", "help": "PDL patterns applied before lowering (IREE's --iree-preprocessing-pdl-spec-filename)"},
    ),
)
_TIMEOUT = Option(
    ("--timeout",),
    {
        "type": float,
        "default": None,
        "metavar": "SECONDS",
        "help": "stop the whole command (its import check too) after this long and say why it may hang (default: 300, iree.DEFAULT_RUN_TIMEOUT_S)",
    },  # fmt: skip
)
_MODEL_TIMEOUT = Option(
    ("--timeout",),
    {
        "type": float,
        "default": None,
        "metavar": "SECONDS",
        "help": "stop the tools this command runs on the model (importer, iree-compile) after this long in all "
        "(default: 600 s plus 0.25 s per MB of input, beyond any real model: only a tool that loops meets it)",
    },  # fmt: skip
)
_SKIP = Option(("--skip-unavailable",), {"action": "store_true", "help": "exit 77 (ctest: skipped) when the device is not present"})
_OBJECT_SEARCH_PATH = Option(("--object-search-path",), {"dest": "object_search_paths", "action": "append", "default": [], "metavar": "DIR"})

TOP_DESCRIPTION = (
    "Build and run IREE custom dispatches (CPU plugins, FatELF, CUDA PTX, embedded objects, "
    "executable substitution) with pip-installed tools. Every verb takes the common options "
    "-v, -q and -j N, before or after the verb."
)
TOP_EXAMPLES = (
    "pyree-build samples                 # build and test every sample (the main job)\n"
    "pyree-build plugin --help           # each verb documents itself\n"
    "pyree-build -v compile example.mlir -o build/example.vmfb"
)

COMPILE = Verb(
    "compile",
    "MLIR -> .vmfb with iree-compile (extra iree-compile flags after --)",
    options=(
        Option(("source",), {"metavar": "IN.mlir"}),
        Option(("-o", "--output"), {"required": True, "metavar": "OUT.vmfb"}),
        Option(("--target",), {"choices": TARGETS, "default": "llvm-cpu"}),
        Option(
            ("--link-bitcode",),
            {
                "dest": "link_bitcode",
                "action": "append",
                "default": [],
                "metavar": "FILE.bc",
                "help": "LLVM bitcode to link into the generated GPU code (repeatable)",
            },  # fmt: skip
        ),
        _OBJECT_SEARCH_PATH,
        Option(
            ("--substitute",),
            {
                "dest": "substitutions",
                "action": "append",
                "default": [],
                "metavar": "NAME=FILE",
                "help": "replace executable NAME: a .mlir/.mlirbc file as its source, any other file as its object (repeatable)",
            },
        ),  # fmt: skip
        Option(("--substitute-from",), {"metavar": "DIR", "help": "substitute every executable named by a file in DIR (as dump writes them)"}),
        *_SPEC_OPTIONS,
        Option(
            ("--expect-import",),
            {
                "dest": "expect_imports",
                "action": "append",
                "default": [],
                "metavar": "NAME",
                "help": "fail (and write no module) unless the compiled module calls import NAME, e.g. the one a spec should have put there (repeatable)",
            },
        ),  # fmt: skip
        Option(
            ("--preprocess",),
            {
                "metavar": "PIPELINE",
                "help": "run iree-opt --pass-pipeline=PIPELINE on the source first (input-level rewrites on tosa/torch, e.g. PDL patterns)",
            },
        ),
        Option(("--depfile",)),
    ),
    description=(
        "Compile an MLIR program into a .vmfb module with iree-compile, finding the objects it "
        "references on the object search paths, optionally substituting executables. A program "
        "`import` wrote with its weights in NAME_params.irpa beside it gets them imported into the "
        "module, which then needs no archive. Flags after -- are passed to iree-compile unchanged."
    ),
    examples=(
        "pyree-build compile example.mlir -o build/example.vmfb --target llvm-cpu\n"
        "pyree-build compile example.mlir -o build/example.vmfb -- --mlir-print-ir-after-failure"
    ),
)

RUN = Verb(
    "run",
    "run a module function with iree-run-module and check its output",
    options=(
        Option(("module",), {"metavar": "MODULE.vmfb"}),
        Option(("--function",), {"required": True}),
        Option(("--input",), {"dest": "inputs", "action": "append", "default": [], "metavar": "SPEC", "help": 'e.g. "8xf32=2" (repeatable)'}),
        plugin_option("--executable_plugin (repeatable; later ones are tried first)"),
        Option(("--device",), {"default": "local-sync", "choices": DEVICES}),
        Option(
            ("--expect",),
            {
                "action": "append",
                "default": [],
                "metavar": "TEXT",
                "help": "TEXT must appear within one output line, as a substring; runs of whitespace compare equal (repeatable)",
            },
        ),  # fmt: skip
        Option(
            ("--expect-close",),
            {
                "action": "append",
                "default": [],
                "metavar": "VALUES",
                "help": "result N (the Nth --expect-close) equals VALUES within --rtol/--atol: 4xf32=0.1 0.2 0.3 0.4, 8xf32=1 or @ref.npy (repeatable)",
            },
        ),  # fmt: skip
        Option(("--rtol",), {"type": float, "default": 1e-5, "help": "--expect-close relative tolerance (default 1e-5)"}),
        Option(("--atol",), {"type": float, "default": 1e-8, "help": "--expect-close absolute tolerance (default 1e-8)"}),
        Option(("--check-file",), {"help": "FileCheck file whose CHECK lines the output must match"}),
        Option(
            ("--check-prefix",),
            {
                "dest": "check_prefixes",
                "action": "append",
                "default": [],
                "metavar": "PREFIX",
                "help": "with --check-file: check lines with this prefix, e.g. CHECK-SYSTEM (repeatable; default CHECK)",
            },
        ),  # fmt: skip
        _SKIP,
        _TIMEOUT,
    ),
    description=(
        "Run one function of a module with iree-run-module, loading plugins, and check its output "
        "against --expect texts or a FileCheck file. A failed check exits non-zero and shows "
        "expected against actual."
    ),
    examples='pyree-build run build/example.vmfb --function mixed_invocation --input 8xf32=2 --input 8xf32=4 --plugin build/plugin.so --expect "8xf32=12"',
)

DUMP = Verb(
    "dump",
    "write a program's executable sources, binaries and benchmarks, and an index (extra iree-compile flags after --)",
    options=(
        Option(("source",), {"metavar": "IN.mlir"}),
        Option(("-o", "--output-dir"), {"required": True, "metavar": "DIR"}),
        Option(("--target",), {"choices": DUMP_TARGETS, "default": "llvm-cpu"}),
        _OBJECT_SEARCH_PATH,
        *_SPEC_OPTIONS,
        Option(("--force",), {"action": "store_true", "help": "overwrite dumped files edited since the last dump, and other files in the way"}),
    ),
    description=(
        "Compile a program only far enough to write each of its executables: the source "
        "(module_<name>.mlir), binaries and benchmark programs, plus an index (index.json). "
        "An edited source can be substituted back with `compile --substitute`."
    ),
    examples="pyree-build dump program.mlir -o dumped/",
)

BENCH = Verb(
    "bench",
    "microbenchmark a module with iree-benchmark-module; --compare A B for a ratio",
    options=(
        Option(("modules",), {"nargs": "+", "metavar": "MODULE.vmfb"}),
        Option(
            ("--compare",),
            {
                "action": "store_true",
                "help": "measure two or more sides interleaved and print each one's ratio to the "
                "first; a side is MODULE.vmfb or MODULE.vmfb:PLUGIN.so[,PLUGIN2.so] (plugins only that side loads)",
            },
        ),
        Option(("--function",), {"default": None, "help": "the function to time (default: every function, as for dumped benchmarks)"}),
        Option(("--input",), {"dest": "inputs", "action": "append", "default": [], "metavar": "SPEC"}),
        plugin_option("--executable_plugin (repeatable)"),
        Option(("--device",), {"default": "local-sync"}),
        Option(("--repetitions",), {"type": int, "default": 5, "help": "repetitions per measurement (default 5)"}),
        Option(("--rounds",), {"type": int, "default": 5, "help": "--compare: alternations of A and B (default 5)"}),
        _SKIP,
        _TIMEOUT,
    ),
    description=(
        "Time a module's function with iree-benchmark-module and print mean and median; with "
        "--compare, time two modules (or more) alternately and print the ratio of their medians B/A "
        "(each side's to the first's); MODULE.vmfb:PLUGIN.so gives a side plugins of its own, so one "
        "module can compare two builds of a kernel."
    ),
    examples=(
        "pyree-build bench build/example.vmfb --function mixed_invocation --input 8xf32=2 --input 8xf32=4 --plugin build/plugin.so\n"
        "pyree-build bench --compare build/original.vmfb build/edited.vmfb --function main --input 4x4xf32=1 --input 4x4xf32=2\n"
        "pyree-build bench --compare m.vmfb:old.so m.vmfb:new.so m.vmfb:tuned.so --function main --input 4x4xf32=1"
    ),
)

TUNE = Verb(
    "tune",
    "sweep a kernel's -D parameters: build, check against a reference, benchmark, write best.json",
    options=(
        Option(
            ("sources",), {"nargs": "+", "metavar": "SRC.c", "help": "the kernel's C sources (a whole plugin, as for `plugin`), or one GPU kernel (--target)"}
        ),
        Option(
            ("-o", "--output"),
            {"required": True, "metavar": "best.json", "help": "the result (with --apply: the plugin to build; a GPU kernel's: the object directory)"},
        ),
        Option(
            ("--target",),
            {
                "choices": ("llvm-cpu", "vulkan", "cuda", "hip"),
                "default": "llvm-cpu",
                "help": "llvm-cpu (default: a plugin), or the GPU target of a kernel `replace --target` wrote (.glsl, .cu, .hip)",
            },
        ),  # fmt: skip
        Option(("--program",), {"metavar": "PROGRAM.mlir", "help": "GPU: the program each variant is compiled from (replace's input)"}),
        Option(("--spec",), {"metavar": "spec.mlir", "help": "GPU: the transform spec that dispatches the kernel (replace's spec.mlir)"}),
        # The GPU a variant's kernel and module are built for, as compile takes it.
        Option(("--vulkan-target",), {"default": None, "help": "vulkan: the module's Vulkan target, as for compile (default auto: the device here)"}),
        Option(("--sm",), {"default": None, "help": "cuda: the sm the PTX and the module are built for (default 80)"}),
        Option(("--gfx",), {"default": None, "help": "hip: the gfx the code object and the module are built for (default 942)"}),
        Option(("--kind",), {"choices": ("system", "standalone"), "default": "system", "help": "the plugin kind, as for `plugin` (default system)"}),
        Option(
            ("--param",),
            {
                "dest": "params",
                "action": "append",
                "default": [],
                "metavar": "NAME=V1,V2,...",
                "help": "a -D macro and its values (repeatable: every combination); none: the knobs the source declares (`// pyree-tune: NAME=V1,V2` lines, as `replace` writes)",
            },
        ),
        Option(("--module",), {"metavar": "M.vmfb", "help": "CPU: the module that calls the kernel's import"}),
        plugin_option("CPU: another plugin --module loads (a model's other kernels), loaded with every variant (repeatable)"),
        Option(("--function",), {"help": "the function of --module to run and time"}),
        Option(("--input",), {"dest": "inputs", "action": "append", "default": [], "metavar": "SPEC", "help": 'e.g. "8xf32=2" or @x.npy (repeatable)'}),
        Option(("--reference",), {"metavar": "REF.vmfb", "help": "the results to reproduce: this module's (e.g. the program without the spec)"}),
        Option(
            ("--onnx",),
            {"metavar": "MODEL.onnx", "help": "the results to reproduce: onnxruntime's (needs pyree_build[onnx]); without --input, verify's wide draw"},
        ),
        Option(
            ("--expect-output",),
            {
                "dest": "expect_output",
                "action": "append",
                "default": [],
                "metavar": "VALUES",
                "help": "the results to reproduce: a spec or ref.npy per result (repeatable)",
            },
        ),  # fmt: skip
        Option(("--arch",), {"dest": "archs", "action": "append", "default": [], "help": "standalone: x86_64, aarch64, riscv64 (repeatable)"}),
        Option(("--cpu",), {"choices": ("baseline", "host"), "default": "baseline", "help": "system: baseline (default) or host"}),
        Option(("--device",), {"default": None, "choices": DEVICES, "help": "where the variants run (default local-sync; a GPU kernel's: its target's)"}),
        Option(
            ("--rtol",),
            {
                "type": float,
                "default": None,
                "help": "check: relative tolerance (default 1e-4 against --reference/--onnx, as verify; 1e-5 against --expect-output)",
            },
        ),
        Option(
            ("--atol",),
            {
                "type": float,
                "default": None,
                "help": "check: absolute tolerance (default 1e-5 x the largest magnitude against --reference/--onnx; 1e-8 against --expect-output)",
            },
        ),
        Option(
            ("--timeout",),
            {"type": float, "default": 60.0, "metavar": "SECONDS", "help": "a run or benchmark of a variant longer than this is a hang (default 60)"},
        ),
        Option(("--spread",), {"type": float, "default": 0.05, "help": "stop a variant's rounds when the last three are within this fraction (default 0.05)"}),
        Option(("--budget",), {"type": float, "default": 10.0, "metavar": "SECONDS", "help": "benchmark time per variant at most (default 10)"}),
        Option(("--max-rounds",), {"type": int, "default": 20, "help": "benchmark rounds per variant at most (default 20)"}),
        Option(("--repetitions",), {"type": int, "default": 3, "help": "iree-benchmark-module repetitions per round (default 3)"}),
        Option(("--build-dir",), {"metavar": "DIR", "help": "where the variants' plugins go (default: <best>.variants beside -o)"}),
        Option(("--ray",), {"metavar": "ADDRESS", "help": "run the sweep on a Ray cluster (host:port, or auto); needs pyree_build[ray]"}),
        Option(
            ("--ray-resources",),
            {"metavar": "JSON", "help": "benchmark on nodes with these Ray resources, e.g. '{\"bench_node\": 1}' (a CPU model, a GPU)"},
        ),  # fmt: skip
        Option(("--apply",), {"metavar": "best.json", "help": "build the plugin best.json chose into -o instead of sweeping (CMake: TUNED)"}),
        *C_OPTIONS,
    ),
    description=(
        "Build every combination of the --param values as -D flags (each build cached), run each variant once "
        "and compare its results with the reference's (a variant that computes a wrong result, crashes or hangs "
        "is reported and never chosen), benchmark the rest one at a time with iree-benchmark-module (rounds until "
        "the spread is small or the budget is spent), print a table by median time and write best.json: the "
        "winner, its -D flags and every measurement. --ray runs the builds and checks as Ray tasks and the "
        "benchmarks on the nodes with --ray-resources. --target vulkan|cuda|hip tunes a GPU kernel `replace --target` "
        "wrote: each variant compiles --program with --spec against its own object and runs on the target's device. "
        "--plugin loads the module's other plugins with every variant (before it): a kernel of a model that calls "
        "several is tuned inside the whole model."
    ),
    examples=(
        "pyree-build tune kernel.c --param TILE=1,2,4,8 --module build/m.vmfb --function f --input 64x64xf32=1 "
        "--reference build/ref.vmfb -o build/best.json\n"
        "pyree-build tune kernels/dense.c --module build/m.vmfb --function main --onnx model.onnx -o build/best.json   # replace's knobs\n"
        "pyree-build tune kernels/g3.c --module build/model.vmfb --plugin build/g1.so --plugin build/g7.so --function main --reference build/iree.vmfb "
        "-o build/g3.json   # in the whole model\n"
        "pyree-build tune kernel.c --apply build/best.json -o build/kernel.so   # the chosen variant\n"
        "pyree-build tune k/dense.glsl --target vulkan --program m.mlir --spec k/spec.mlir --function main --onnx m.onnx -o build/best.json\n"
        "pyree-build tune k/dense.glsl --target vulkan --apply build/best.json -o build/spv   # the chosen variant's SPIR-V\n"
        "pyree-build tune kernel.c ... --ray 10.0.0.1:6379 --ray-resources '{\"bench_node\": 1}'"
    ),
)

SAMPLES = Verb(
    "samples",
    "build every sample with CMake, run ctest, print a table (the main job)",
    options=(
        Option(("--build-dir",), {"default": "build/samples", "help": "CMake build directory (default: build/samples)"}),
        Option(("-R", "--tests-regex"), {"default": None, "help": "only run tests matching this regex"}),
    ),
    description=(
        "The main job: configure samples/ with CMake and Ninja, build the target iree-sample-deps, "
        "run ctest and print one row per test (sample, test, result, time). CUDA tests are "
        "reported as skipped, with the reason, where no usable GPU is present."
    ),
    examples="pyree-build samples\npyree-build samples -R plugin -j 2",
)

NEW = Verb(
    "new",
    "write a downstream CMake project (plugin, MLIR, CMakeLists.txt, README) that builds as written",
    options=(
        Option(("directory",), {"metavar": "DIR"}),
        Option(("--name",), {"help": "CMake project name (default: the directory name)"}),
        Option(
            ("--force",),
            {"action": "store_true", "help": "write into a non-empty directory, replacing only files an earlier new wrote that are unchanged since"},
        ),
        Option(("--import",), {"dest": "import_name", "metavar": "NAME", "help": "generate the plugin and program for your own import NAME (with --args)"}),
        Option(
            ("--args",),
            {
                "dest": "import_args",
                "metavar": "KIND:TYPE,...",
                "help": (
                    "a plain C function's signature, sizes by name (what pb.load_inline(args=...) takes): "
                    '"in:f32[n], in:f32[n], in:f32, out:f32[n]" makes kernel.c with void NAME(const float*, const float*, float, float*, size_t n); '
                    "or the import's own argument block, in call order: buffers KIND:TYPE (1-D) or KIND:TYPE[?x?] (N-D), KIND in|out|inout, "
                    "TYPE f32|f16|i8|i16|i32|i64; scalars scalar:TYPE (f32|i8|i16|i32|i64), passed after the buffers; "
                    'e.g. "in:f32,scalar:f32,scalar:f32,out:f32" or "in:f32[?x?],out:f32[?x?]"'
                ),
            },
        ),
    ),
    description=(
        "Write a downstream project (a C plugin, an MLIR program, CMakeLists.txt, pyproject.toml "
        "and a README) that builds and passes its test as written, with CMake or as a wheel."
    ),
    examples='pyree-build new my_project && cd my_project && cmake -G Ninja -S . -B build -Dpyree_build_DIR="$(pyree-build --cmake-dir)"',
)

CACHE = Verb(
    "cache",
    "the build cache: info or clear (location: $PYREE_BUILD_CACHE)",
    options=(Option(("action",), {"choices": ("info", "clear")}),),
    description=(
        "Show or clear the build cache, which stores every action's outputs keyed by its inputs, "
        "flags and tools. It lives in $PYREE_BUILD_CACHE (default ~/.cache/pyree_build); "
        "PYREE_BUILD_CACHE=off disables it."
    ),
    examples="pyree-build cache info\npyree-build cache clear",
)

DOCTOR = Verb(
    "doctor",
    "show every tool found, each device usable here, and which workflows build and run",
    description=(
        "Show pyree_build's version and Python, every tool found (version and path, or how to "
        "install it), whether the IREE wheels match the pinned release, and for each workflow "
        "whether it can be built and run on this machine."
    ),
    examples="pyree-build doctor",
)

IMPORT = Verb(
    "import",
    "ONNX model (or a torch.export.save'd program, .pt2) -> MLIR, each op named by its ONNX node (or torch module)",
    options=(
        Option(
            ("model",),
            {
                "metavar": "MODEL.onnx|MODEL.pt2",
                "help": "the ONNX model (external data beside it, or in --data-dir), or a program saved with torch.export.save "
                '(imported with iree-turbine\'s aot.export: pip install "pyree_build[torch]" and torch)',
            },
        ),
        Option(("-o", "--output"), {"required": True, "metavar": "OUT.mlir"}),
        Option(
            ("--opset-version",),
            {
                "type": int,
                "default": None,
                "metavar": "N",
                "help": "upgrade the model to this opset first (default: a model older than opset 17 is raised to 17, with a note)",
            },
        ),
        Option(("--data-dir",), {"default": None, "metavar": "DIR", "help": "where the model's external data files are (default: the model's directory)"}),
        Option(
            ("--inline-params",),
            {
                "dest": "externalize_params",
                "action": "store_false",
                "default": True,
                "help": "keep every weight inline in the MLIR as text (by default each weight of 100 elements or more goes to "
                "OUT_params.irpa beside it, scope 'model', and compile imports them back into the module)",
            },
        ),
        Option(
            ("--externalize-params",), {"dest": "externalize_params", "action": "store_true", "default": True, "help": "the default (kept for older scripts)"}
        ),
        Option(("--depfile",)),
        _MODEL_TIMEOUT,
        Option(("--force",), {"action": "store_true", "help": "overwrite an output you wrote or edited (by default import replaces only what it wrote)"}),
    ),
    description=(
        'Import an ONNX model with iree-import-onnx (pip install "pyree_build[onnx]"), give every '
        'top-level op its ONNX node name as its location (loc("fc1"), kept by iree-compile on the ops '
        "lowered from it), and check the result with IREE's input conversion: an op IREE cannot "
        "lower is an error naming its node. A model older than opset 17 is raised to opset 17 with onnx's "
        "version converter first. Large weights are written to OUT_params.irpa beside OUT.mlir, not as MLIR text "
        "(at model size text costs minutes to write and to parse at every later step); `compile` imports them "
        "back, so the module is self-contained: keep the archive beside the MLIR."
    ),
    examples="pyree-build import model.onnx -o build/model.mlir\npyree-build compile build/model.mlir -o build/model.vmfb\n"
    "pyree-build import model.pt2 -o build/model.mlir   # torch.export.save(torch.export.export(model, args), 'model.pt2')",
)

VERIFY = Verb(
    "verify",
    "run a module and the ONNX model (onnxruntime) or torch program on the same inputs and compare every output",
    options=(
        Option(("module",), {"metavar": "MODULE.vmfb", "help": "the module compiled from the model (import, then compile)"}),
        Option(("--onnx",), {"dest": "onnx_model", "default": None, "metavar": "MODEL.onnx", "help": "the model the module was compiled from"}),
        Option(
            ("--torch",),
            {
                "dest": "torch_program",
                "default": None,
                "metavar": "PROGRAM.pt2",
                "help": "instead of --onnx: the program (torch.export.save) the module was imported from, run eagerly by torch as the reference",
            },
        ),
        Option(("--function",), {"default": None, "help": "the module's function (default: the graph's name, or the module's only function)"}),
        Option(
            ("--input",),
            {
                "dest": "inputs",
                "action": "append",
                "default": [],
                "metavar": "SPEC",
                "help": 'one per graph input, in order: "4x16xf32=1" or @x.npy (default: random, seeded)',
            },
        ),  # fmt: skip
        Option(
            ("--inputs",),
            {
                "dest": "input_files",
                "nargs": "+",
                "default": [],
                "metavar": "PATH",
                "help": "stored inputs: an ONNX test directory (input_N.pb; its output_N.pb are then the reference) or .pb/.npy files, one per graph input",
            },
        ),  # fmt: skip
        plugin_option("--executable_plugin (repeatable)"),
        Option(
            ("--baseline",),
            {
                "default": None,
                "metavar": "UNREPLACED.vmfb",
                "help": "the model compiled without your kernel: an output it also gets wrong is reported as IREE's difference, not the kernel's",
            },
        ),  # fmt: skip
        Option(("--seed",), {"type": int, "default": 0, "help": "seed of the first drawn inputs; the next draws take the next seeds (default 0)"}),
        Option(
            ("--trials",),
            {
                "type": int,
                "default": 3,
                "metavar": "N",
                "help": "how many sets of inputs to draw: uniform, wide, ties, then again (default 3; from 3 on, a model of few elements "
                "that compares with constants adds one draw per threshold value)",
            },
        ),  # fmt: skip
        Option(
            ("--rtol",),
            {
                "type": float,
                "default": None,
                "help": "relative tolerance (default 1e-4: float32 kernels sum in another order than onnxruntime, a few ulps apart; float16: 4e-3)",
            },
        ),  # fmt: skip
        Option(
            ("--atol",),
            {
                "type": float,
                "default": None,
                "help": "absolute tolerance (default: 1e-5 times each output's largest magnitude; integer outputs are exact)",
            },
        ),  # fmt: skip
        Option(
            ("--device",),
            {
                "default": None,
                "choices": DEVICES,
                "help": "the HAL device the module runs on (default: the module's, vulkan, cuda or hip for a GPU module, else local-sync)",
            },
        ),  # fmt: skip
        _SKIP,
    ),
    description=(
        "Run the module (iree-run-module, with its plugins) and the ONNX model (onnxruntime, "
        "CPUExecutionProvider) on the same inputs: --trials seeded draws that reach each input's "
        "range (floats in [-1, 1]; floats past and at the model's own constants, integers across "
        "their type; a few values only, so elements tie), or --input values, or --inputs (an ONNX "
        "test directory, whose stored outputs are the reference). Prints the worst element of each "
        "output and exits 1 when any element is outside atol + rtol * |reference|. With --baseline, "
        "an output IREE's own module gets wrong too is reported as IREE's difference."
    ),
    examples=(
        "pyree-build verify build/model.vmfb --onnx model.onnx\n"
        "pyree-build verify build/model.vmfb --onnx model.onnx --plugin build/plugin.so --baseline build/model_unreplaced.vmfb\n"
        "pyree-build verify build/test_abs.vmfb --onnx test_abs/model.onnx --inputs test_abs/test_data_set_0"
    ),
)

OPS = Verb(
    "ops",
    "list a program's op groups as a transform spec sees them, numbered for replace",
    options=(
        Option(("source",), {"metavar": "MODEL.mlir", "help": "the program, e.g. written by `pyree-build import`"}),
        Option(
            ("--json",),
            {"action": "store_true", "help": "print a JSON list: index, function, root, ops, operands, results, source, replaceable, reason, targets"},
        ),
        Option(
            ("--target",),
            {
                "dest": "targets",
                "action": "append",
                "default": [],
                "metavar": "vulkan|cuda|hip[,...]",
                "help": "also say, per group, whether `replace --target` can generate a kernel for these GPU targets, and why not",
            },
        ),  # fmt: skip
        _MODEL_TIMEOUT,
    ),
    description=(
        "Compile the program as far as IREE's preprocessing (where a transform spec runs) and list "
        "its op groups: a root op (e.g. linalg.matmul) with the ops fused around it, the tensors it "
        "reads and writes, the ONNX nodes it came from, and whether `replace` can generate it (and "
        "if not, why)."
    ),
    examples="pyree-build ops build/model.mlir\npyree-build ops build/model.mlir --json\npyree-build ops build/model.mlir --target vulkan,cuda",
)

REPLACE = Verb(
    "replace",
    "generate a transform spec, a C import (or a GPU kernel: --target) and a CMakeLists.txt replacing op groups of a program",
    options=(
        Option(("source",), {"metavar": "MODEL.mlir"}),
        Option(
            ("--ops",),
            {
                "action": "append",
                "required": True,
                "metavar": "N[,N...]",
                "help": "op group numbers as `ops` lists them (repeatable); N+M+... merges connected groups into one kernel (one import)",
            },
        ),
        Option(
            ("--import",),
            {
                "dest": "imports",
                "action": "append",
                "required": True,
                "metavar": "NAME[,NAME...]",
                "help": "the import replacing each group, in order (a C identifier)",
            },
        ),  # fmt: skip
        Option(("-o", "--output-dir"), {"required": True, "metavar": "DIR"}),
        Option(
            ("--kind",),
            {
                "choices": ("plugin", "embedded"),
                "default": "plugin",
                "help": "plugin: resolved at run time (--plugin); embedded: objects linked into the module (default plugin)",
            },
        ),  # fmt: skip
        Option(("--onnx",), {"default": None, "metavar": "MODEL.onnx", "help": "the model, so the CMakeLists.txt adds its verify test"}),
        Option(("--function",), {"default": None, "help": "the module function the verify test runs (default: as verify chooses)"}),
        Option(
            ("--dynamic",),
            {"action": "store_true", "help": "generalise every size: the spec matches the group's ops at any shapes, the C reads each size from its arguments"},
        ),  # fmt: skip
        Option(("--force",), {"action": "store_true", "help": "overwrite generated files edited since replace wrote them"}),
        Option(
            ("--target",),
            {
                "choices": ("llvm-cpu", "vulkan", "cuda", "hip"),
                "default": "llvm-cpu",
                "help": "where the kernel runs: llvm-cpu (a C import, the default), or vulkan / cuda / hip: NAME.glsl / NAME.cu / NAME.hip, "
                "a GPU kernel built and compiled for that target by the CMakeLists.txt",
            },
        ),  # fmt: skip
        _MODEL_TIMEOUT,
    ),
    description=(
        "For each op group (numbers from `pyree-build ops`), write into DIR: spec.mlir, a transform "
        "spec whose matcher is the group's own IR and whose rewrite calls the import NAME; NAME.c, the "
        "import with its argument block documented and a correct naive body generated from the ops; "
        "and CMakeLists.txt, which builds it, compiles the program with the spec and EXPECT_IMPORTS, "
        "and adds the verify test. With --target vulkan|cuda|hip the kernel is NAME.glsl, NAME.cu or NAME.hip, "
        "generated from the same loop-nest model, dispatched as a precompiled GPU executable. "
        "A file you edited is never overwritten (unless --force)."
    ),
    examples=(
        "pyree-build replace build/model.mlir --ops 1 --import fc1_relu -o kernels --onnx model.onnx\n"
        "pyree-build replace build/model.mlir --ops 1,3 --import fc1_relu,my_softmax -o kernels --kind embedded\n"
        "pyree-build replace build/model.mlir --ops 1 --import fc1_relu -o kernels --onnx model.onnx --target vulkan"
    ),
)

SERVER = Verb(
    "server",
    "the per-user server that runs every command warm: status or stop",
    options=(
        Option(
            ("action",),
            {"choices": ("status", "stop"), "help": "status: whether it runs, and its pid, socket, uptime, requests and idle timeout; stop: end it and wait"},
        ),
    ),
    description=(
        "Every pyree-build command (CMake's actions and ctests too) is handed to a per-user server that has "
        "already imported what commands need, so a command costs about what its tools cost. It starts "
        "on first use, serves commands in parallel, restarts when pyree_build changes, and exits after "
        "$PYREE_BUILD_SERVER_IDLE seconds without work (default 900; seconds in (0, 604800]). status: whether it runs, its pid, "
        "socket, uptime, requests served and idle timeout; stop: end it (commands running finish). "
        "A server serves only commands whose process context (uid, groups, limits, namespaces, root...) "
        "is its own: status and stop address the server of the context they run in. "
        "PYREE_BUILD_SERVER=off runs each command in its own process instead."
    ),
    examples="pyree-build server status\npyree-build server stop\nPYREE_BUILD_SERVER=off pyree-build cache info   # a command in its own process",
)

# In the order `pyree-build --help` lists them, after the backends' verbs.
CORE_VERBS: dict[str, Verb] = {v.name: v for v in (DUMP, BENCH, TUNE, COMPILE, RUN, IMPORT, OPS, REPLACE, VERIFY, SAMPLES, NEW, CACHE, DOCTOR, SERVER)}
