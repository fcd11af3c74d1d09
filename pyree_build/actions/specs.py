"""Rewrites applied to a program before IREE compiles it: transform / PDL specs and iree-opt
preprocessing pipelines.

Specs go through IREE's own flags (so `compile`, `dump` and CMake share one path); this
module only turns them into flags with absolute paths, checks that the files exist, and
reports them as inputs so the cache and the depfile see an edited spec.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pyree_build.core import echo, processes, toolchain
from pyree_build.core.errors import PyreeError, require_file

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


# Pass options that name a file, e.g. iree-preprocessing-apply-pdl-patterns{patterns-file=X}.
_FILE_OPTION = re.compile(r"(?P<key>[\w-]*-file)=(?P<path>[^\s,}]+)")


def pipeline_files(pipeline: str) -> tuple[str, list[Path]]:
    """The pipeline with each `...-file=PATH` option made absolute, and those files.

    Absolute so the step does not depend on the directory it runs in; listed so the
    cache key and the depfile see an edited pattern file.
    """
    if not pipeline.strip() or "(" not in pipeline:
        raise PyreeError(
            f"'{pipeline}' is not a pass pipeline",
            fix="write it as iree-opt's --pass-pipeline takes it, e.g. 'builtin.module(iree-preprocessing-apply-pdl-patterns{patterns-file=spec.pdl.mlir})'",
        )
    files: list[Path] = []
    pieces: list[str] = []
    end = 0
    for m in _FILE_OPTION.finditer(pipeline):  # as re.sub would, keeping each file found
        path = require_file(m["path"], f"file named by {m['key']} in the --preprocess pipeline").resolve()
        files.append(path)
        pieces += [pipeline[end : m.start()], f"{m['key']}={path}"]
        end = m.end()
    pieces.append(pipeline[end:])
    return "".join(pieces), files


def preprocess(source: Path, pipeline: str, output: Path) -> None:
    """Run iree-opt --pass-pipeline=PIPELINE on `source`, writing `output` (rewrites at the
    input level, e.g. PDL patterns on tosa or torch ops, before iree-compile converts them)."""
    opt = toolchain.iree_opt()
    with echo.Stopwatch(f"iree-opt {source.name}: preprocess"):
        processes.spawn(
            opt.command(source, f"--pass-pipeline={pipeline}", "-o", output),
            what="iree-opt (--preprocess)",
            file=source,
            fix="check the pipeline (iree-opt --help lists the passes) and the pattern files it names",
        )
