"""Rewrites applied to a program before IREE compiles it: transform / PDL specs and iree-opt
preprocessing pipelines.

Specs go through IREE's own flags (so `compile`, `dump` and CMake share one path); this
module only turns them into flags with absolute paths, checks that the files exist, and
reports them as inputs so the cache and the depfile see an edited spec.
"""
from __future__ import annotations

import os
from pathlib import Path

from .errors import PyreeError, require_file

PathLike = str | os.PathLike[str]

TRANSFORM_SPEC_FLAG = "--iree-preprocessing-transform-spec-filename"
PDL_SPEC_FLAG = "--iree-preprocessing-pdl-spec-filename"


def spec_flags(*, transform_spec: PathLike | None = None, pdl_spec: PathLike | None = None) -> tuple[list[str], list[Path]]:
    """iree-compile flags for the given specs, and the spec files (inputs of the compile)."""
    flags: list[str] = []
    files: list[Path] = []
    for path, flag, what in ((transform_spec, TRANSFORM_SPEC_FLAG, "transform spec"), (pdl_spec, PDL_SPEC_FLAG, "PDL spec")):
        if path is None:
            continue
        spec = require_file(path, what).resolve()
        if spec.suffix not in (".mlir", ".mlirbc"):
            raise PyreeError(f"a {what} must be an MLIR file (.mlir or .mlirbc)", file=spec, fix=f"pass the {what} written in MLIR")
        flags.append(f"{flag}={spec}")
        files.append(spec)
    return flags, files
