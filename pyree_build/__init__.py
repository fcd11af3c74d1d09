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


# Verb name -> (module, function), imported on first use so `import pyree_build` stays cheap.
_VERBS = {
    "plugin": (".cpu", "plugin"),
    "objects": (".cpu", "objects"),
    "ptx": (".cuda", "ptx"),
    "compile": (".iree", "compile"),
    "dump": (".executables", "dump"),
    "bench": (".bench", "bench"),
    "new": (".scaffold", "new_project"),
}


def __getattr__(name: str):
    import importlib

    if name == "run":
        return _run
    if name == "stop_on_signals":  # `with pb.stop_on_signals():` SIGINT/SIGTERM end every tool started
        return importlib.import_module(".tools", __name__).stop_on_signals
    if name == "fatelf":  # a namespace of actions, like the verb: pack, write, read, select, split
        return importlib.import_module(".fatelf", __name__)
    if name in _VERBS:
        module, attr = _VERBS[name]
        return getattr(importlib.import_module(module, __name__), attr)
    raise AttributeError(f"module 'pyree_build' has no attribute {name!r}")


__all__ = ["PyreeError", "__version__", "plugin", "objects", "ptx", "compile", "run", "fatelf", "dump", "bench", "new"]
