"""Transition only: the names pyree_build/cli and actions/inprocess still import from here.

iree.py was split into actions/compile.py (compile, target_flags) and actions/run.py (run,
run_to_arrays, require_device, ...); the device probes and cuda's target attribute moved to
their backends. Each name is read from its new module on first use, so `run` does not load
compile's modules. Delete this file once cli/ and inprocess.py import the new modules.
"""
from __future__ import annotations

import importlib
from typing import Any

_MOVED = {
    "compile": "pyree_build.actions.compile",
    "target_flags": "pyree_build.actions.compile",
    "cuda_status": "pyree_build.backends.cuda.target",
    "cuda_target_attr": "pyree_build.backends.cuda.target",
    "hip_status": "pyree_build.backends.hip.devices",
}


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module(_MOVED.get(name, "pyree_build.actions.run")), name)
