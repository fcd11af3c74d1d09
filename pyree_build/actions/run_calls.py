"""The child process of run.run_calls: call a module's function once per set of inputs, all in
this one process with the module loaded once, saving each call's results as `<i>_<j>.npy`.

iree-run-module calls a function once per process, and each process builds the module's
pipelines again: on lavapipe, LLVM compiles every shader on its first dispatch (a SqueezeNet's
29 shaders: about one run's time), unless Mesa's shader cache on disk has them. Here they are
built once for all the calls. A child, so that a driver that
crashes or hangs takes it down, never the caller (the server); no plugins are loaded here.

Exit code 0: every call's results saved; any other: the runtime refused the module or a call,
said on stderr (the parent then runs iree-run-module, whose message names the problem as every
run's does).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from pyree_build.actions import inprocess
from pyree_build.core.errors import PyreeError


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    out = Path(spec["out"])
    try:
        results = inprocess.call_many(spec["module"], spec["function"], spec["calls"], device=spec["device"])
    except (PyreeError, RuntimeError, ValueError, TypeError, KeyError) as error:
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    for i, arrays in enumerate(results):
        for j, array in enumerate(arrays):
            np.save(out / f"{i}_{j}.npy", array)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
