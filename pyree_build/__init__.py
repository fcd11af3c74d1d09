"""pyree_build: IREE custom dispatches (CPU plugins, FatELF, CUDA PTX, embedded objects,
executable substitution) built and run with pip-installed tools.

One function per CLI verb; each returns output paths or results and raises
`PyreeError` (which file, what is wrong, what to do) on bad input, wrong argument types
included.

Long (~600 lines) because it is the whole public API in one place: one typed function per verb
(its signature and docstring are the Python reference), each a thin call of the module that
does the work, loaded on first use.
"""

from __future__ import annotations

import importlib as _importlib
import sys as _sys
import types as _types
from collections.abc import Callable as _Callable
from typing import TYPE_CHECKING
from typing import Any as _Any
from typing import Generic as _Generic
from typing import ParamSpec as _ParamSpec
from typing import TypeVar as _TypeVar

from pyree_build.core import args as _args
from pyree_build.core.errors import PyreeError
from pyree_build.core.package import __version__

if TYPE_CHECKING:  # the verbs' annotations only: the modules behind them load on first call
    from collections.abc import Iterable, Mapping, Sequence
    from pathlib import Path
    from typing import Any

    import numpy

    from pyree_build.actions.bench import BenchResult
    from pyree_build.actions.executables import Executable
    from pyree_build.actions.inline import InlineKernel
    from pyree_build.core.args import PathLike
    from pyree_build.models.ops import OpGroup
    from pyree_build.models.verify import VerifyResult
    from pyree_build.tuning.sweep import TuneResult

_P = _ParamSpec("_P")
_R = _TypeVar("_R")


def _action(module: str, attr: str) -> _Any:
    """`attr` of a module of this package, imported on first use so `import pyree_build` stays cheap."""
    return getattr(_importlib.import_module(module, __name__), attr)


class _Verb(_Generic[_P, _R]):
    """A verb of the Python API: checks its arguments at the boundary (args.CHECKS), then
    calls the action module's function, imported on first use so `import pyree_build`
    stays cheap. Other attributes come from that module (`pb.bench.compare`).

    Its signature and docstring are those of the function it was declared with (see
    `_verb`), which tests/test_quality.py holds equal to the implementation's."""

    def __init__(self, declared: _Callable[_P, _R], module: str, attr: str, optional: tuple[str, ...] = ()) -> None:
        self.__name__ = self.__qualname__ = declared.__name__
        self.__doc__ = declared.__doc__
        # inspect.signature follows __wrapped__: help() and IDEs show the declared, typed
        # signature without importing the implementation.
        self.__wrapped__ = declared
        self._module, self._attr, self._optional = module, attr, optional

    def _implementation(self) -> _Callable[..., _R]:
        implementation: _Callable[..., _R] = _action(self._module, self._attr)
        return implementation

    def __call__(self, *positional: _P.args, **keywords: _P.kwargs) -> _R:
        # A verb that fails removes the output directories it made (core.files.command_scope).
        with _importlib.import_module(".core.files", __name__).command_scope():
            result: _R = _args.checked_call(self._implementation(), positional, keywords, verb=self.__name__, optional=self._optional)
        return result

    def __get__(self, instance: object, owner: type | None = None) -> _Verb[_P, _R]:
        # A descriptor, as a function is: inspect.isroutine() holds, so help(pb.compile)
        # documents it as a function (signature and docstring), not as a data value.
        return self

    def __getattr__(self, name: str) -> _Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(_importlib.import_module(self._module, __name__), name)

    def __repr__(self) -> str:
        return f"<pyree_build verb {self.__name__}>"


def _verb(module: str, attr: str, optional: tuple[str, ...] = ()) -> _Callable[[_Callable[_P, _R]], _Verb[_P, _R]]:
    """Declare a verb by its signature: the decorated function's body is never run."""

    def declare(declared: _Callable[_P, _R]) -> _Verb[_P, _R]:
        return _Verb(declared, module, attr, optional)

    return declare


# Each verb's parameters are its implementation's (names, kinds, defaults), typed as the API
# takes them: where a list is taken, one value is a list of one (args.CHECKS).


@_verb(".backends.llvm_cpu.plugins", "plugin")
def plugin(
    sources: PathLike | Sequence[PathLike],
    output: PathLike,
    *,
    kind: str = "system",
    archs: str | Sequence[str] = (),
    cc: str = "zig",
    include_dirs: PathLike | Sequence[PathLike] = (),
    defines: str | Sequence[str] = (),
    depfile: PathLike | None = None,
    jobs: int | None = None,
    cpu: str = "baseline",
    depends_also: Sequence[PathLike] = (),
) -> Path:
    """Build a CPU plugin: kind 'system' (.so for this host) or 'standalone' (freestanding ELF / FatELF .sos).
    `depends_also`: more files the depfile lists (a file the defines were chosen from).

    Example: pb.plugin("standalone_plugin.c", "build/plugin.sos", kind="standalone", archs=["x86_64", "aarch64"])
    """
    raise NotImplementedError  # the declaration only: calls go to the implementation


@_verb(".backends.llvm_cpu.plugins", "objects")
def objects(
    source: PathLike,
    output_dir: PathLike,
    *,
    archs: str | Sequence[str],
    cc: str = "zig",
    include_dirs: PathLike | Sequence[PathLike] = (),
    defines: str | Sequence[str] = (),
    allow_undefined: str | Sequence[str] = (),
    depfile: PathLike | None = None,
    jobs: int | None = None,
) -> list[Path]:
    """Compile one C source to a freestanding object per arch, for linking into a module.

    Example: pb.objects("functions.c", "build/objects", archs=["x86_64", "aarch64"])  # -> [.../functions_x86_64.o, ...]
    """
    raise NotImplementedError


@_verb(".backends.cuda.ptx", "ptx")
def ptx(
    source: PathLike,
    sms: str | int | Sequence[str | int],
    output_dir: PathLike,
    *,
    compiler: str = "nvrtc",
    verify: bool = False,
    ptx_isa: str = "auto",
    include_dirs: PathLike | Sequence[PathLike] = (),
    defines: str | Sequence[str] = (),
    depfile: PathLike | None = None,
    jobs: int | None = None,
) -> list[Path]:
    """Compile one .cu to a PTX file per sm.

    Example: pb.ptx("kernels.cu", [75, 80], "build/ptx")  # -> [.../kernels_sm_75.ptx, .../kernels_sm_80.ptx]
    """
    raise NotImplementedError


@_verb(".backends.vulkan.spirv", "spirv")
def spirv(
    sources: PathLike | Sequence[PathLike],
    output_dir: PathLike,
    *,
    compiler: str = "glslang",
    include_dirs: PathLike | Sequence[PathLike] = (),
    defines: str | Sequence[str] = (),
    depfile: PathLike | None = None,
) -> list[Path]:
    """Compile GLSL compute shaders to validated SPIR-V, one .spv per shader.

    Example: pb.spirv(["simple_mul.glsl", "simple_mul_inplace.glsl"], "build/spirv")
    """
    raise NotImplementedError


@_verb(".backends.hip.hsaco", "hsaco")
def hsaco(
    source: PathLike,
    gfxs: str | int | Sequence[str | int],
    output_dir: PathLike,
    *,
    include_dirs: PathLike | Sequence[PathLike] = (),
    defines: str | Sequence[str] = (),
    depfile: PathLike | None = None,
    jobs: int | None = None,
    layout: str = "dirs",
) -> list[Path]:
    """Compile a HIP source to an AMDGPU code object per gfx (`layout="flat"`: `<stem>_gfx<N>.co`, IREE's sample names).

    Example: pb.hsaco("kernels.cu", [942, 1100], "build/hsaco")  # -> [.../gfx942/kernels.co, .../gfx1100/kernels.co]
    """
    raise NotImplementedError


@_verb(".backends.cuda.bitcode", "bitcode")
def bitcode(
    source: PathLike,
    sms: str | int | Sequence[str | int],
    output_dir: PathLike,
    *,
    include_dirs: PathLike | Sequence[PathLike] = (),
    defines: str | Sequence[str] = (),
    depfile: PathLike | None = None,
    jobs: int | None = None,
) -> list[Path]:
    """Compile CUDA device code to NVPTX LLVM bitcode per sm (no CUDA SDK).

    Example: pb.bitcode("ukernel.cu", 80, "build/bitcode")  # -> [.../ukernel_sm_80.bc]
    """
    raise NotImplementedError


@_verb(".actions.compile", "compile")
def compile(  # noqa: A001 - mirrors the CLI verb
    source: PathLike,
    output: PathLike,
    *,
    target: str = "llvm-cpu",
    object_search_paths: PathLike | Sequence[PathLike] = (),
    flags: str | Sequence[str] = (),
    cpu: str = "generic",
    sm: str | int | None = None,
    depfile: PathLike | None = None,
    substitutions: str | Sequence[str] = (),
    substitute_from: PathLike | None = None,
    transform_spec: PathLike | None = None,
    pdl_spec: PathLike | None = None,
    expect_imports: Sequence[str] = (),
    preprocess: str | None = None,
    vulkan_target: str | None = None,
    gfx: str | int | None = None,
    link_bitcode: Sequence[PathLike] = (),
    target_options: Mapping[str, Any] | None = None,
) -> Path:
    """Compile an MLIR program to a .vmfb. A program whose weights `import_onnx` kept in `<stem>_params.irpa`
    beside it gets every one of them imported into the module (which then needs no archive); the archive is an input.

    Example: pb.compile("example.mlir", "build/example.vmfb", target="cuda", sm=80, object_search_paths=["build/ptx"])
    """
    raise NotImplementedError


@_verb(".actions.executables", "dump")
def dump(
    source: PathLike,
    output_dir: PathLike,
    *,
    target: str = "llvm-cpu",
    sm: str | int | None = None,
    flags: str | Sequence[str] = (),
    transform_spec: PathLike | None = None,
    pdl_spec: PathLike | None = None,
    object_search_paths: PathLike | Sequence[PathLike] = (),
    force: bool = False,
    target_options: Mapping[str, Any] | None = None,
) -> list[Executable]:
    """Write a program's executables (sources, binaries, benchmarks) and index.json to a directory.

    Example: [e.name for e in pb.dump("program.mlir", "build/dump")]  # -> ['main_dispatch_0', ...]
    """
    raise NotImplementedError


@_verb(".actions.bench", "bench", optional=("function",))
def bench(
    module: PathLike,
    function: str | None = None,
    *,
    inputs: str | Sequence[str] = (),
    plugins: PathLike | Sequence[PathLike] = (),
    device: str = "local-sync",
    repetitions: int = 5,
    min_time: float = 0.1,
    skip_unavailable: bool = False,
    timeout: float | None = 300.0,
) -> BenchResult:
    """Time a module's function (or every function) with iree-benchmark-module.

    Example: pb.bench("build/example.vmfb", "mixed_invocation", inputs=["8xf32=2", "8xf32=4"], plugins=["build/plugin.sos"])
    """
    raise NotImplementedError


@_verb(".tuning.sweep", "tune", optional=("module", "device", "reference", "onnx", "build_dir", "ray", "ray_resources", "program", "spec", "target_options"))
def tune(
    sources: PathLike | Sequence[PathLike],
    output: PathLike,
    *,
    params: Mapping[str, Sequence[str]] | Sequence[str] = (),
    module: PathLike | None = None,
    function: str,
    inputs: str | Sequence[str] = (),
    kind: str = "system",
    reference: PathLike | None = None,
    onnx: PathLike | None = None,
    expect_output: Sequence[str] = (),
    archs: str | Sequence[str] = (),
    cc: str = "zig",
    cpu: str = "baseline",
    include_dirs: PathLike | Sequence[PathLike] = (),
    defines: str | Sequence[str] = (),
    device: str | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    timeout: float = 60.0,
    spread: float = 0.05,
    budget: float = 10.0,
    max_rounds: int = 20,
    repetitions: int = 3,
    build_dir: PathLike | None = None,
    jobs: int | None = None,
    ray: str | None = None,
    ray_resources: Mapping[str, float] | None = None,
    depfile: PathLike | None = None,
    target: str = "llvm-cpu",
    program: PathLike | None = None,
    spec: PathLike | None = None,
    target_options: Mapping[str, Any] | None = None,
    plugins: PathLike | Sequence[PathLike] = (),
) -> TuneResult:
    """Sweep a kernel's -D parameters (`params`; none: the knobs its source declares with
    `// pyree-tune: NAME=V1,V2` lines, as `replace` writes them): build each combination (cached), check it against the
    reference (`reference` module, `onnx` model or `expect_output`), benchmark the correct ones one
    at a time and write `output` (best.json: the winner, its flags, the measurements). `ray`: a Ray
    cluster's address (or "auto") runs the sweep there. `pb.tune.build_tuned(...)` builds the
    chosen variant, `pb.tune.tuned_defines("best.json")` gives its -D values.

    A GPU kernel that `replace --target vulkan|cuda|hip` wrote: `target` names it, `program` and
    `spec` are what each variant compiles (its object embedded), on the target's device by default;
    `target_options` pick the GPU (`sm`, `gfx`, `vulkan_target`). `device`: local-sync for a plugin.
    `plugins`: the module's other plugins (a model's other replaced kernels), loaded with every
    variant, so that a kernel is tuned inside the whole model it runs in.

    Example: pb.tune("kernel.c", "build/best.json", params={"TILE": [1, 2, 4]}, module="build/m.vmfb", function="f", inputs=["64xf32=1"], reference="build/ref.vmfb").best.label
    """
    raise NotImplementedError


@_verb(".actions.scaffold", "new_project", optional=("name",))
def new(
    directory: PathLike,
    *,
    name: str | None = None,
    force: bool = False,
    import_name: str | None = None,
    import_args: str | None = None,
) -> Path:
    """Write a downstream CMake project into a directory.

    Example: pb.new("my_kernels", import_name="scale", import_args="in:f32,out:f32")
    """
    raise NotImplementedError


@_verb(".models.ir.importer", "import_onnx")
def import_onnx(
    model: PathLike,
    output: PathLike,
    *,
    opset_version: int | None = None,
    data_dir: PathLike | None = None,
    externalize_params: bool = True,
    depfile: PathLike | None = None,
    timeout: float | None = None,
    force: bool = False,
) -> Path:
    """Import an ONNX model to MLIR with the compiler wheel's importer, each op named by its ONNX node (needs pyree_build[onnx]).
    `timeout`: seconds its tools may take in all (default: 600 plus 0.25 per MB of model; a model IREE loops on is stopped).
    An existing output pyree_build did not write (or that was edited since) is replaced only with `force`.
    `externalize_params` (default True): weights of 100 elements or more go to `<output stem>_params.irpa` beside the
    MLIR, not into its text; `pb.compile` imports them back into the module. False keeps them inline.

    Example: pb.import_onnx("mlp.onnx", "build/mlp.mlir")  # also writes build/mlp_params.irpa
    """
    raise NotImplementedError


@_verb(".models.torch_op", "torch_op")
def torch_op(kernel: InlineKernel, name: str) -> Any:
    """Register a kernel built by `pb.load_inline(args=...)` as the torch operator `name` ("mylib::axpy"),
    with a fake implementation (result sizes from the signature) so torch.export and torch.compile see it;
    returns the operator (`torch.ops.mylib.axpy`). Called on CPU tensors it runs the kernel in this process.

    Example: axpy = pb.torch_op(pb.load_inline(c_source=C, function="axpy", args="in:f32[n], in:f32[n], out:f32[n]"), "mylib::axpy")
    """
    raise NotImplementedError


@_verb(".models.ir.torch_import", "import_torch", optional=("source",))
def import_torch(
    model: Any,
    example_args: Sequence[Any] = (),
    *,
    output: PathLike,
    dynamic_shapes: Any = None,
    source: PathLike | None = None,
    force: bool = False,
) -> Path:
    """Import a torch model to MLIR with iree-turbine's aot.export, each op named by its module (`fc1`,
    `blocks.0.attn`; needs pyree_build[torch] and torch). `model`: an nn.Module (exported with
    `example_args` and torch.export's `dynamic_shapes`) or a torch.export.ExportedProgram.

    Example: pb.import_torch(model, (torch.randn(4, 16),), output="build/mlp.mlir", dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    """
    raise NotImplementedError


@_verb(".models.verify", "verify", optional=("onnx_model", "torch", "function", "baseline", "rtol", "atol"))
def verify(
    module: PathLike,
    onnx_model: PathLike | None = None,
    *,
    torch: Any = None,
    function: str | None = None,
    inputs: str | Sequence[str] = (),
    input_files: PathLike | Sequence[PathLike] = (),
    plugins: PathLike | Sequence[PathLike] = (),
    baseline: PathLike | None = None,
    seed: int = 0,
    trials: int = 3,
    rtol: float | None = None,
    atol: float | None = None,
    device: str | None = None,
    skip_unavailable: bool = False,
) -> VerifyResult:
    """Run a module and its ONNX model (onnxruntime) on the same inputs; compare every output (needs pyree_build[onnx]).
    `torch`: instead of the ONNX model, the torch program the module came from (an ExportedProgram or its .pt2),
    run eagerly on the same draws (needs pyree_build[torch] and torch).
    `device`: where the module runs (default: the device its executables are for, vulkan, cuda or
    hip for a GPU module, else local-sync); `skip_unavailable`: exit as skipped where it is absent.

    Example: pb.verify("build/mlp.vmfb", "mlp.onnx", plugins=["build/kernels/fc1_relu.so"]).passed  # -> True
    """
    raise NotImplementedError


@_verb(".models.ops", "ops")
def ops(source: PathLike, *, targets: Sequence[str] = (), timeout: float | None = None) -> list[OpGroup]:
    """The op groups of a program as a transform spec sees them, numbered for `replace`.
    `targets` (vulkan, cuda, hip): also whether each group's kernel can be generated for them;
    `timeout`: seconds IREE's input conversion may take (default: 600 plus 0.25 per MB of program).

    Example: [g.root for g in pb.ops("build/mlp.mlir")] -> ['linalg.generic', 'linalg.matmul', 'linalg.generic']
    """
    raise NotImplementedError


@_verb(".models.replace", "replace", optional=("onnx", "function"))
def replace(
    source: PathLike,
    output_dir: PathLike,
    *,
    ops: int | Sequence[int | Sequence[int]],
    imports: str | Sequence[str],
    kind: str = "plugin",
    onnx: PathLike | None = None,
    function: str | None = None,
    dynamic: bool = False,
    force: bool = False,
    target: str = "llvm-cpu",
    timeout: float | None = None,
) -> list[Path]:
    """Generate the transform spec, the C import (a correct naive body) and a CMakeLists.txt that
    replace op groups `ops` of a program with calls of `imports`; returns the written files.
    An entry of `ops` that is itself a sequence merges those connected groups into one kernel
    (`ops=[(1, 2, 3)]`, the CLI's `--ops 1+2+3`): a Gemm with its activation, for example.
    `dynamic`: match the groups' ops at any sizes (the C reads every size from its arguments).
    `target`: vulkan, cuda or hip writes a GPU kernel (GLSL, CUDA C, HIP C) instead of the C import.
    `timeout`: seconds its iree-compile runs may take in all (default: 600 plus 0.25 per MB of program).

    Example: pb.replace("build/mlp.mlir", "build/kernels", ops=[1], imports=["fc1_relu"], onnx="mlp.onnx")
    """
    raise NotImplementedError


@_verb(".actions.inline", "load_inline", optional=("mlir", "args", "tile", "c_source", "target", "device", "name", "build_dir"))
def load_inline(
    *,
    function: str,
    mlir: str | None = None,
    args: str | None = None,
    tile: int | None = None,
    c_source: str | None = None,
    files: Mapping[str, str] | None = None,
    kind: str = "system",
    target: str | None = None,
    device: str | None = None,
    flags: str | Sequence[str] = (),
    include_dirs: PathLike | Sequence[PathLike] = (),
    defines: str | Sequence[str] = (),
    target_options: Mapping[str, Any] | None = None,
    name: str | None = None,
    build_dir: PathLike | None = None,
) -> InlineKernel:
    """Build a kernel from strings (cached) and return `function` as a callable that takes and
    returns numpy arrays (and, with `args=`, torch tensors or anything with `__dlpack__`).

    `args`: the signature of a plain C function in `c_source` (`void axpy(const float* x,
    const float* y, float* out, size_t n)` is "in:f32[n], in:f32[n], out:f32[n]": buffers
    and scalars in order, then each named size): the program that calls it is generated, its
    sizes read from the arrays at each call, outputs allocated from their declared sizes; the
    dispatch gives each workgroup `tile` rows of the first output's leading size (0: one call
    over everything). Each edit of the C loads beside the earlier ones in this process.
    `mlir`: a program of your own instead, calling imports that `c_source` defines:

    `c_source`: C defining the imports the program calls (`int NAME(void* params, void*
    context, void* reserved)`); the plugin entry that resolves them is generated (C with its
    own `iree_hal_executable_plugin_query` is built as it is). A plugin of `kind` 'system'
    (default) or 'standalone'; or `kind='embedded'`: the C is compiled to one object per arch
    the program names (`kernel_x86_64.o`: STEM_ARCH.o) and linked into the module. `files`: kernel sources by file name, the suffix picking the
    target: `{"kernels.cu": ...}` (PTX per sm the program names, `kernels_sm_80.ptx`),
    `.glsl` (SPIR-V, `NAME.spv`), `.hip` (code objects); `device` defaults to the target's
    first. The import check runs once, here. A build error names the string and its line.

    Example:
        axpy = pb.load_inline(c_source=C, function="axpy", args="in:f32[n], in:f32[n], out:f32[n]")
        axpy(numpy.ones(5, numpy.float32), numpy.ones(5, numpy.float32))  # -> array of 5 elements
        kernel = pb.load_inline(mlir=PROGRAM, c_source=C, function="mixed_invocation")
        kernel(numpy.full(8, 2, numpy.float32), numpy.full(8, 4, numpy.float32))  # -> array of 12.0
    """
    raise NotImplementedError


def run(
    module: PathLike,
    function: str,
    inputs: Iterable[Any] = (),
    *,
    plugins: PathLike | Sequence[PathLike] = (),
    device: str = "local-sync",
    in_process: bool = True,
    **options: Any,
) -> list[numpy.ndarray]:
    """Run `function` of a .vmfb and return its results as numpy arrays.

    In this process through iree.runtime by default; `in_process=False` runs
    iree-run-module instead. Inputs are arrays, numbers (for scalar parameters) or `--input`
    spec strings, either way. Other keyword
    `options` go to the runner chosen (e.g. `expect` for iree-run-module), checked by name.

    Example: pb.run("build/example.vmfb", "mixed_invocation", [numpy.full(8, 2, numpy.float32), "8xf32=4"], plugins=["build/plugin.sos"])
    """
    mod = _args.path(module, "module")
    fn = _args.text(function, "function")
    dev = _args.text(device, "device")
    plugin_paths = _args.paths(plugins, "plugins")
    if inputs is None or isinstance(inputs, (bytes, dict)):
        raise PyreeError(f"inputs must be a list of arrays or input specs, got {type(inputs).__name__}", fix="pass inputs=[array, '8xf32=4', ...]")
    # One spec string or one array is one input, never split into characters or rows.
    items = [inputs] if isinstance(inputs, str) or hasattr(inputs, "__array__") else list(inputs)
    backend = _action(".backends", "for_device")(dev)
    keywords = {"plugins": plugin_paths, "device": dev, **options}
    result: list[numpy.ndarray]
    if _args.flag(in_process, "in_process") and backend is not None and not backend.runs_in_process:
        # IREE's Python runtime cannot read results back on every device of this backend (Vulkan: lavapipe).
        result = _args.checked_call(_action(".actions.run", "run_to_arrays"), (mod, fn, items), keywords, verb="run", checked=("inputs",))
    elif _args.flag(in_process, "in_process"):
        result = _args.checked_call(_action(".actions.inprocess", "run"), (mod, fn, items), keywords, verb="run", checked=("inputs",))
    else:
        with _action(".actions.run", "input_specs")(mod, fn, items) as specs:  # arrays through .npy files, numbers as scalars
            result = _args.checked_call(_action(".actions.run", "run"), (mod, fn), {"inputs": specs, **keywords}, verb="run").outputs
    return result


def _verb_names() -> set[str]:
    module = _sys.modules[__name__]
    return {name for name in __all__ if isinstance(module.__dict__.get(name), _Verb)} | {"run"}


class _Package(_types.ModuleType):
    def __setattr__(self, name: str, value: object) -> None:
        # Importing a submodule sets it as an attribute of its package: `import
        # pyree_build.bench` would replace the verb `bench`. The verb stays; the
        # submodule is still in sys.modules and reachable through the verb's attributes.
        if name in _verb_names() and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)

    def __getattr__(self, name: str) -> _Any:
        if name in _LAZY:  # loaded on first use, as the verbs are
            module, attr = _LAZY[name]
            loaded = _importlib.import_module(module, __name__)
            return getattr(loaded, attr) if attr else loaded
        raise AttributeError(f"module 'pyree_build' has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        # What a user may call or name (tab completion, dir()): not the helpers of this file.
        return sorted({*__all__, "__doc__", "__file__", "__name__", "__path__", "__spec__"})


# Public names behind a module of their own, imported on first use: `with pb.stop_on_signals():`
# (SIGINT/SIGTERM end every tool started), the `fatelf` actions (pack, write, read, select,
# split), and the types the verbs return, for annotations (`def f(r: pb.BenchResult)`).
_LAZY: dict[str, tuple[str, str]] = {
    "stop_on_signals": (".core.processes", "stop_on_signals"),
    "fatelf": (".backends.llvm_cpu.fatelf", ""),
    "BenchResult": (".actions.bench", "BenchResult"),
    "Executable": (".actions.executables", "Executable"),
    "OpGroup": (".models.ops", "OpGroup"),
    "VerifyResult": (".models.verify", "VerifyResult"),
    "InlineKernel": (".actions.inline", "InlineKernel"),
    "TuneResult": (".tuning.sweep", "TuneResult"),
}


_sys.modules[__name__].__class__ = _Package

__all__ = [
    "PyreeError",
    "__version__",
    "plugin",
    "objects",
    "ptx",
    "spirv",
    "hsaco",
    "bitcode",
    "compile",
    "run",
    "fatelf",
    "dump",
    "bench",
    "tune",
    "new",
    "import_onnx",
    "import_torch",
    "torch_op",
    "ops",
    "replace",
    "verify",
    "load_inline",
    "stop_on_signals",
    "BenchResult",
    "Executable",
    "OpGroup",
    "VerifyResult",
    "InlineKernel",
    "TuneResult",
]
