"""Transition only: the names pyree_build/cli and actions/inprocess still import from here.

iree.py was split into actions/compile.py (compile, target_flags) and actions/run.py (run,
run_to_arrays, require_device, ...); the device probes and cuda's target attribute moved to
their backends. Delete this file once cli/ and inprocess.py import the new modules.
"""
from __future__ import annotations

from pyree_build.actions.compile import compile, target_flags  # noqa: F401, A004
from pyree_build.actions.run import (  # noqa: F401
    DEFAULT_RUN_TIMEOUT_S,
    EMBEDDED_PREFIX,
    SKIP_EXIT_CODE,
    DeviceUnavailable,
    RunResult,
    check_timeout,
    crash_hint,
    plugin_flag,
    require_device,
    run,
    run_to_arrays,
)
from pyree_build.backends.cuda.target import cuda_status, cuda_target_attr  # noqa: F401
from pyree_build.backends.hip.devices import hip_status  # noqa: F401
