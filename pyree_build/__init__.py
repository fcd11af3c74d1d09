"""pyree_build: IREE custom dispatches (CPU plugins, FatELF, CUDA PTX, embedded objects,
executable substitution) built and run with pip-installed tools.

One function per CLI verb; each returns output paths or results and raises
`PyreeError` (which file, what is wrong, what to do) on bad input, wrong argument types
included.
"""
from __future__ import annotations

import importlib as _importlib
import sys as _sys
import types as _types
from typing import Any as _Any

from pyree_build.core.errors import PyreeError  # noqa: E402
from pyree_build.core.package import __version__  # noqa: E402


class _Verb:
    """A verb of the Python API: checks its arguments at the boundary (args.CHECKS), then
    calls the action module's function, imported on first use so `import pyree_build`
    stays cheap. Other attributes come from that module (`pb.bench.compare`)."""

    def __init__(self, name: str, module: str, attr: str, doc: str, optional: tuple[str, ...] = ()) -> None:
        self.__name__ = self.__qualname__ = name
        self.__doc__ = doc
        self._module, self._attr, self._optional = module, attr, optional

    def _implementation(self):  # type: ignore[no-untyped-def]
        return getattr(_importlib.import_module(self._module, __name__), self._attr)

    def __call__(self, *positional: _Any, **keywords: _Any) -> _Any:
        from pyree_build.core.args import checked_call

        return checked_call(self._implementation(), positional, keywords, verb=self.__name__, optional=self._optional)

    @property
    def __signature__(self):  # type: ignore[no-untyped-def]
        import inspect

        return inspect.signature(self._implementation())  # what help() and IDEs show

    def __getattr__(self, name: str) -> _Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(_importlib.import_module(self._module, __name__), name)

    def __repr__(self) -> str:
        return f"<pyree_build verb {self.__name__}>"


plugin = _Verb("plugin", ".backends.llvm_cpu.plugins", "plugin", "Build a CPU plugin: kind 'system' (.so for this host) or 'standalone' (freestanding ELF / FatELF .sos).")
objects = _Verb("objects", ".backends.llvm_cpu.plugins", "objects", "Compile one C source to a freestanding object per arch, for linking into a module.")
ptx = _Verb("ptx", ".backends.cuda.ptx", "ptx", "Compile one .cu to a PTX file per sm.")
spirv = _Verb("spirv", ".backends.vulkan.spirv", "spirv", "Compile GLSL compute shaders to validated SPIR-V, one .spv per shader.")
hsaco = _Verb("hsaco", ".backends.hip.hsaco", "hsaco", "Compile a HIP source to an AMDGPU code object per gfx.")
bitcode = _Verb("bitcode", ".backends.cuda.bitcode", "bitcode", "Compile CUDA device code to NVPTX LLVM bitcode per sm (no CUDA SDK).")
compile = _Verb("compile", ".actions.compile", "compile", "Compile an MLIR program to a .vmfb.")  # noqa: A001 - mirrors the CLI verb
dump = _Verb("dump", ".actions.executables", "dump", "Write a program's executables (sources, binaries, benchmarks) and index.json to a directory.")
bench = _Verb("bench", ".actions.bench", "bench", "Time a module's function (or every function) with iree-benchmark-module.", optional=("function",))
new = _Verb("new", ".actions.scaffold", "new_project", "Write a downstream CMake project into a directory.", optional=("name",))


def run(
    module: _Any, function: _Any, inputs: _Any = (), *, plugins: _Any = (), device: _Any = "local-sync", in_process: _Any = True, **options: _Any
) -> list:  # type: ignore[type-arg]
    """Run `function` of a .vmfb and return its results as numpy arrays.

    In this process through iree.runtime by default; `in_process=False` runs
    iree-run-module instead (inputs must then be `--input` spec strings). Other keyword
    `options` go to the runner chosen (e.g. `expect` for iree-run-module), checked by name.
    """
    from pyree_build.core import args

    mod = args.path(module, "module")
    fn = args.text(function, "function")
    dev = args.text(device, "device")
    plugin_paths = args.paths(plugins, "plugins")
    if inputs is None or isinstance(inputs, (bytes, dict)):
        raise PyreeError(f"inputs must be a list of arrays or input specs, got {type(inputs).__name__}", fix="pass inputs=[array, '8xf32=4', ...]")
    # One spec string or one array is one input, never split into characters or rows.
    items = [inputs] if isinstance(inputs, str) or hasattr(inputs, "__array__") else list(inputs)
    from pyree_build import backends

    backend = backends.for_device(dev)
    if args.flag(in_process, "in_process") and backend is not None and not backend.runs_in_process:
        # IREE's Python runtime cannot read results back on every device of this backend (Vulkan: lavapipe).
        from pyree_build.actions.run import run_to_arrays

        return args.checked_call(run_to_arrays, (mod, fn, items), {"plugins": plugin_paths, "device": dev, **options}, verb="run", checked=("inputs",))
    if args.flag(in_process, "in_process"):
        from pyree_build.actions.inprocess import run as run_in_process

        return args.checked_call(run_in_process, (mod, fn, items), {"plugins": plugin_paths, "device": dev, **options}, verb="run", checked=("inputs",))
    from pyree_build.actions.run import run as run_tool

    specs = args.strings(items, "inputs (with in_process=False, --input spec strings)")
    return args.checked_call(run_tool, (mod, fn), {"inputs": specs, "plugins": plugin_paths, "device": dev, **options}, verb="run").outputs


_VERBS = ("plugin", "objects", "ptx", "spirv", "hsaco", "bitcode", "compile", "run", "dump", "bench", "new")


class _Package(_types.ModuleType):
    def __setattr__(self, name: str, value: object) -> None:
        # Importing a submodule sets it as an attribute of its package: `import
        # pyree_build.bench` would replace the verb `bench`. The verb stays; the
        # submodule is still in sys.modules and reachable through the verb's attributes.
        if name in _VERBS and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)

    def __getattr__(self, name: str) -> _Any:
        if name == "stop_on_signals":  # `with pb.stop_on_signals():` SIGINT/SIGTERM end every tool started
            return _importlib.import_module(".core.processes", __name__).stop_on_signals
        if name == "fatelf":  # a namespace of actions, like the verb: pack, write, read, select, split
            return _importlib.import_module(".backends.llvm_cpu.fatelf", __name__)
        raise AttributeError(f"module 'pyree_build' has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), "fatelf", "stop_on_signals"})


_sys.modules[__name__].__class__ = _Package

__all__ = ["PyreeError", "__version__", "plugin", "objects", "ptx", "spirv", "hsaco", "bitcode", "compile", "run", "fatelf", "dump", "bench", "new", "stop_on_signals"]
