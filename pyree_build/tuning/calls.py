"""The child process of a tune check: call a module's function with a variant's plugin loaded
(after the module's other plugins), once per entry of `calls` and all in this one process,
saving every result as `<i>_<j>.npy`.

A kernel can be right on its first call and wrong after (state kept between calls, a buffer
reused); iree-run-module calls a function once per process, so several calls need one process
that keeps the plugin loaded: this one, started by variant_checks.check_variant so that a variant that
crashes or hangs takes down this child, never the tune.
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
        for i, inputs in enumerate(spec["calls"]):
            results = inprocess.run(spec["module"], spec["function"], inputs, plugins=spec["plugins"], device=spec["device"])
            for j, result in enumerate(results):
                np.save(out / f"{i}_{j}.npy", result)
    except PyreeError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
