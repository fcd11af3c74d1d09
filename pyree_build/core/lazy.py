"""Heavy third-party modules, named at the top of the module that uses them, loaded on first use.

`np = lazy.module("numpy")` at module level says what a module depends on, as an import
would, yet costs nothing until an attribute is read: numpy, pyelftools, iree.runtime and
cuda.bindings are each 30-100 ms, and most commands never touch them (a cached build, a run
that prints text). The same holds for the few standard-library and pyree_build modules that
only a rare path needs (importlib.metadata for installed backends, ctypes for a plugin
probe, the remote cache). Other modules are imported normally; backends are loaded through
the registry (pyree_build.backends) on first use.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

# Every module named here, in order: the per-user server imports them before it forks its
# workers (except the heaviest), so that a command finds them loaded.
NAMED: dict[str, None] = {}


def module(name: str) -> types.ModuleType:
    """`name`, imported when one of its attributes is first read (the real module if it is
    already imported). A missing module raises ImportError at that first read, where the
    caller's try/except around the use sees it."""
    NAMED[name] = None
    if name in sys.modules:
        return sys.modules[name]
    return _LazyModule(name)


class _LazyModule(types.ModuleType):
    """Stands in for a module until an attribute is read, then imports it and delegates."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__dict__["_pyree_loaded"] = None

    def _load(self) -> types.ModuleType:
        loaded = self.__dict__["_pyree_loaded"]
        if loaded is None:
            loaded = importlib.import_module(self.__name__)
            self.__dict__["_pyree_loaded"] = loaded
        return loaded

    def __getattr__(self, attr: str) -> object:
        return getattr(self._load(), attr)

    def __dir__(self) -> list[str]:
        return dir(self._load())

    def __repr__(self) -> str:
        state = "loaded" if self.__dict__["_pyree_loaded"] is not None else "not loaded yet"
        return f"<lazy module {self.__name__!r} ({state})>"
