"""pyree_build: IREE custom dispatches (CPU plugins, FatELF, CUDA PTX, embedded objects,
executable substitution) built and run with pip-installed tools.

One function per CLI verb; each returns output paths or results and raises
`PyreeError` (which file, what is wrong, what to do) on bad input.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import PyreeError  # noqa: E402


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
        from .iree import run

        return run
    if name == "fatelf":  # a namespace of actions, like the verb: join, split, read, select
        import importlib

        return importlib.import_module(".fatelf", __name__)
    raise AttributeError(f"module 'pyree_build' has no attribute {name!r}")


__all__ = ["PyreeError", "__version__", "plugin", "objects", "ptx", "compile", "run", "fatelf"]
