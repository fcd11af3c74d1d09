"""What a tune writes and reads: best.json (the winner, how to rebuild it, every measurement;
`best_record`, `read_best`), and the content key of a sweep (the sources, headers, module,
reference, parameters and settings), by which a best.json already written is up to date.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pyree_build.cache import keys
from pyree_build.core import files, readers
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.outputs import included_files
from pyree_build.tuning.choice import choose, ranked
from pyree_build.tuning.plan import PathLike, Plan, Variant

FORMAT = "pyree_build.tune.v1"


def source_sha256(path: Path) -> str:
    """A file's sha256, as best.json records a source's."""
    return readers.sha256_of(path) or "-"  # a source that is gone or not a file matches no record


def content_key(sources: Sequence[PathLike], include_dirs: Sequence[PathLike], params: Mapping[str, Sequence[str]], module: PathLike,
                reference: PathLike | None, onnx: PathLike | None, settings: Mapping[str, object], spec: PathLike = "",
                plugins: Sequence[PathLike] = ()) -> str:  # fmt: skip
    """What a tune's result depends on, by content: the sources and the headers they include,
    the module (a GPU kernel's: the program and the spec), the reference, the parameters and
    every setting (the device as resolved; the target only for a GPU kernel, so a CPU tune's key
    is the one it had before GPU kernels and its best.json stays up to date), and the other
    plugins the module loads (by content, in order; none: the key it had before them). Equal
    keys: the same sweep."""
    named = [*map(Path, sources), *included_files(map(Path, sources), [os.fspath(d) for d in include_dirs]), Path(module)]
    named += [Path(spec)] if spec else []
    named += [Path(r) for r in (reference, onnx) if r is not None and Path(r).is_file()]
    named += [Path(p) for p in plugins]
    return keys.key_of({"params": params, "settings": settings, "reference": os.fspath(reference or "")}, named)


def recorded_winner(out: Path, key: str) -> Variant | None:
    """The winner already recorded at `out` when it was tuned from the same content (a `touch` of a
    source re-runs the command in a build, not the sweep); its time is renewed so the build is satisfied."""
    try:
        record = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("key") != key or not isinstance(record.get("winner"), dict):
        return None
    os.utime(out)
    return Variant(dict(record["winner"].get("params", {})), status="ok")


def _variant_record(v: Variant) -> dict[str, Any]:
    record = {k: value for k, value in asdict(v).items() if k not in ("plugin", "module")}
    if v.samples_ms:
        record.update(median_ms=v.median_ms, min_ms=min(v.samples_ms), max_ms=max(v.samples_ms))
    return record


def best_record(plan: Plan, variants: Sequence[Variant], best: Variant) -> dict[str, Any]:
    """What best.json holds: the winner, its flags, how to rebuild it, and every measurement."""
    return {
        "format": FORMAT,
        "winner": {**_variant_record(best), "defines": [*plan.defines, *best.flags]},
        "flags": [f"-D{f}" for f in best.flags],
        "build": {
            "sources": [{"path": s, "sha256": source_sha256(Path(s))} for s in plan.sources],
            "kind": plan.kind,
            "archs": plan.archs,
            "cc": plan.cc,
            "cpu": plan.cpu,
            "include_dirs": plan.include_dirs,
            "defines": plan.defines,
            **({"target": plan.target, "program": plan.program, "spec": plan.spec, "target_options": plan.target_options} if plan.gpu else {}),
        },  # fmt: skip
        "measured": {
            "module": plan.module or best.module or "",
            "function": plan.function,
            "inputs": plan.inputs,
            "device": plan.device,
            "machine": platform.machine(),
            "host": platform.node(),
        },  # fmt: skip
        "choice": {"tied_with": [v.label for v in choose(variants)[1]], "clear": not choose(variants)[1]},
        "variants": [_variant_record(v) for v in ranked(variants)],
    }


def read_best(tuned: PathLike) -> dict[str, Any]:
    """best.json, checked to be one a tune wrote."""
    path = require_file(tuned, "tune result")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise PyreeError(f"not a tune result: {exc}", file=path, fix="write it with `pyree-build tune ... -o best.json`") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("winner", {}).get("params"), dict):
        raise PyreeError(f"not a tune result (format {FORMAT} expected)", file=path, fix="write it with `pyree-build tune ... -o best.json`")
    return data


def write_best(out: Path, plan: Plan, variants: Sequence[Variant], best: Variant, key: str) -> None:
    """best.json at `out` (atomically), with the content key it was tuned from."""
    with files.atomic_output(out) as tmp:
        tmp.write_text(json.dumps({**best_record(plan, variants, best), "key": key}, indent=2) + "\n", encoding="utf-8")
