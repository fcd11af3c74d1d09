"""pyree_build: IREE custom dispatches (CPU plugins, FatELF, CUDA PTX, embedded objects,
executable substitution) built and run with pip-installed tools.

One function per CLI verb; each returns output paths or results and raises
`PyreeError` (which file, what is wrong, what to do) on bad input.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import PyreeError  # noqa: E402


def _run(module, function, inputs=(), *, plugins=(), device="local-sync", in_process=True):  # type: ignore[no-untyped-def]
    """Run `function` of a .vmfb and return its results as numpy arrays.

    In this process through iree.runtime by default; `in_process=False` runs
    iree-run-module instead (inputs must then be `--input` spec strings).
    """
    if in_process:
        from .inprocess import run as run_in_process

        return run_in_process(module, function, inputs, plugins=plugins, device=device)
    from .iree import run as run_tool

    return run_tool(module, function, inputs=[str(i) for i in inputs], plugins=plugins, device=device).outputs


def __getattr__(name: str):  # lazy: `import pyree_build` stays cheap for the CLI
    if name == "plugin":
        from .cpu import plugin

        return plugin
    if name == "objects":
        from .cpu import objects

        return objects
    if name == "ptx":
        from .cuda import ptx

        return ptx
    if name == "compile":
        from .iree import compile

        return compile
    if name == "run":
        return _run
    if name == "dump":
        from .executables import dump

        return dump
    if name == "bench":
        from .bench import bench

        return bench
    if name == "new":
        from .scaffold import new_project

        return new_project
    if name == "fatelf":  # a namespace of actions, like the verb: join, split, read, select
        import importlib

        return importlib.import_module(".fatelf", __name__)
    raise AttributeError(f"module 'pyree_build' has no attribute {name!r}")


__all__ = ["PyreeError", "__version__", "plugin", "objects", "ptx", "compile", "run", "fatelf", "dump", "bench", "new"]
