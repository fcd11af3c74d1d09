"""A tune's sweep on a Ray cluster: each variant's build and check is a Ray task (any node), each
benchmark a Ray task on a node with the requested resources, one at a time.

Imported only for `tune --ray` (through core/lazy.py in tuning/sweep.py), so nothing else ever
imports Ray. The inputs (sources, headers beside them and in -I directories, the module, the
expected results) travel through Ray's object store and are written on each node under a
directory named by their content, the same path everywhere: a variant's build has the same
cache key on every node, so with a remote cache (PYREE_BUILD_REMOTE_CACHE, passed on to the
tasks) no variant is built twice anywhere. The plugins come back through Ray too.
A task whose node dies is retried elsewhere by Ray (max_retries); one that still fails is
reported as lost, never chosen, and the sweep goes on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import os
import socket
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
import ray.exceptions

from pyree_build.cache.remote import AUTH_ENV, MODE_ENV, TIMEOUT_ENV, TOKEN_ENV, URL_ENV
from pyree_build.core import echo, files, lazy
from pyree_build.core.errors import PyreeError
from pyree_build.tuning.benchmarks import measure_variant
from pyree_build.tuning.plan import LOST, PathLike, Plan, Variant
from pyree_build.tuning.variant_checks import build_and_check, log_checked, mark_as_written

if TYPE_CHECKING:
    import numpy

np = lazy.module("numpy")

# What the tasks need from the driver's environment: the shared cache tier.
FORWARDED_ENV = (URL_ENV, TOKEN_ENV, AUTH_ENV, MODE_ENV, TIMEOUT_ENV)
_HEADERS = (".h", ".hpp", ".hh", ".inc", ".def")
RETRIES = 3


def bundle(plan: Plan, expected: Sequence[numpy.ndarray]) -> dict[str, bytes]:
    """Every file a variant's build, check and benchmark read, by a name relative to one directory."""
    blobs: dict[str, bytes] = {}
    for source in map(Path, plan.sources):
        blobs[f"src/{source.name}"] = source.read_bytes()
        for header in source.parent.iterdir():  # `#include "x.h"` beside the source
            if header.suffix in _HEADERS and header.is_file():
                blobs.setdefault(f"src/{header.name}", header.read_bytes())
    for i, directory in enumerate(map(Path, plan.include_dirs)):
        for header in directory.rglob("*"):
            if header.suffix in _HEADERS and header.is_file():
                blobs[f"include{i}/{header.relative_to(directory).as_posix()}"] = header.read_bytes()
    blobs["module.vmfb"] = Path(plan.module).read_bytes()
    for i, plugin in enumerate(map(Path, plan.plugins)):
        blobs[f"loaded/{i}/{plugin.name}"] = plugin.read_bytes()
    for k, array in enumerate(expected):
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(array))
        blobs[f"expected/{k}.npy"] = buffer.getvalue()
    return blobs


def materialize(blobs: Mapping[str, bytes], root: PathLike | None = None) -> Path:
    """Files (relative name -> bytes) written under a directory named by their content, the same
    path on every machine: a build there has the same cache key everywhere (the remote cache
    shares it). Used by the Ray tasks; written once, atomically."""
    digest = hashlib.sha256()
    for name in sorted(blobs):
        digest.update(name.encode() + b"\0" + hashlib.sha256(blobs[name]).digest())
    base = Path(root) if root is not None else Path(tempfile.gettempdir()) / "pyree-tune"
    directory = base / digest.hexdigest()[:24]
    for name, data in blobs.items():
        path = directory / name
        if not path.is_file() or path.read_bytes() != data:
            path.parent.mkdir(parents=True, exist_ok=True)
            with files.atomic_output(path) as tmp:
                tmp.write_bytes(data)
    return directory


def rebased(plan: Plan, root: Path) -> Plan:
    """The plan with its paths in the bundle's directory on this node."""
    return dataclasses.replace(
        plan,
        sources=[str(root / "src" / Path(s).name) for s in plan.sources],
        include_dirs=[str(root / f"include{i}") for i in range(len(plan.include_dirs))],
        module=str(root / "module.vmfb"),
        plugins=[str(root / "loaded" / str(i) / Path(p).name) for i, p in enumerate(plan.plugins)],
    )


def _node() -> str:
    return f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:8]}"


def build_and_check_task(blobs: Mapping[str, bytes], plan: Plan, params: dict[str, str]) -> dict[str, Any]:
    """On a worker: build one variant (cached), check it; its status and its plugin's bytes."""
    root = materialize(blobs)
    expected = [np.load(io.BytesIO(blobs[f"expected/{k}.npy"])) for k in range(sum(n.startswith("expected/") for n in blobs))]
    variant = build_and_check(rebased(plan, root), Variant(dict(params)), root / "variants", expected)
    plugin = Path(variant.plugin).read_bytes() if variant.status == "ok" and variant.plugin else None
    return {"status": variant.status, "reason": variant.reason, "plugin": plugin, "node": _node()}


def measure_task(blobs: Mapping[str, bytes], plan: Plan, params: dict[str, str], plugin: bytes, name: str) -> dict[str, Any]:
    """On a benchmark node: the variant's rounds, timed there."""
    root = materialize(blobs)
    variant = Variant(dict(params), status="ok")
    variant.plugin = str(materialize({name: plugin}, root / "plugins") / name)
    measure_variant(rebased(plan, root), variant)
    return {"status": variant.status, "reason": variant.reason, "samples_ms": variant.samples_ms, "node": _node()}


_build_and_check = ray.remote(num_cpus=1, max_retries=RETRIES)(build_and_check_task)
_measure = ray.remote(num_cpus=1, max_retries=RETRIES)(measure_task)


def connect(address: str) -> None:
    """Join the cluster at `address` (host:port or auto), passing the remote cache's settings on."""
    env = {name: os.environ[name] for name in FORWARDED_ENV if os.environ.get(name)}
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, runtime_env={"env_vars": env} if env else None)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError or its own types for a cluster it cannot reach
        raise PyreeError(
            f"cannot join the Ray cluster at {address}: {exc}",
            fix="start one (`ray start --head` on one machine, `ray start --address HEAD:PORT` on the others) and pass its address, or leave --ray out",
        ) from None


def require_resources(resources: Mapping[str, float]) -> None:
    """Refuse resources no node has (Ray would wait for them forever)."""
    available = ray.cluster_resources()  # type: ignore[no-untyped-call]
    missing = {k: v for k, v in resources.items() if available.get(k, 0.0) < v}
    if missing:
        raise PyreeError(
            f"no node of the Ray cluster has the resources {missing} for the benchmarks",
            fix=f"start a node with them (ray start ... --resources '{{\"{next(iter(missing))}\": 1}}'); the cluster has {sorted(available)}",
        )


def _lost(variant: Variant, error: BaseException) -> None:
    variant.status = LOST
    variant.reason = (
        f"its task failed on the cluster after {RETRIES} retries: {str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}"
    )


def _collect_checks(plan: Plan, variants: list[Variant], blobs: Any, directory: Path) -> None:
    refs = [(_build_and_check.remote(blobs, plan, v.params), v) for v in variants]
    for ref, variant in refs:
        try:
            answer = ray.get(ref)
        except ray.exceptions.RayError as error:
            _lost(variant, error)
            continue
        variant.status, variant.reason, variant.node = answer["status"], answer["reason"], answer["node"]
        if answer["plugin"] is not None:  # the artifact, back through Ray, beside the local sweep's
            out = directory / variant.directory / f"{Path(plan.sources[0]).stem}{plan.suffix}"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(answer["plugin"])
            variant.plugin = str(out)


def _mark_as_written(plan: Plan, variants: list[Variant], blobs: Any) -> None:
    """variant_checks.as_written_first on the cluster: the sources' own build made there, from
    the bundle's path as every variant was (a plugin names its source's path); where it cannot
    be made, the declared order alone decides ties."""
    if plan.gpu or not any(v.status == "ok" and v.plugin for v in variants):
        return
    try:
        answer = ray.get(_build_and_check.remote(blobs, plan, {}))
    except ray.exceptions.RayError:
        return
    if answer["plugin"] is not None:
        mark_as_written(variants, answer["plugin"])


def _collect_measurements(plan: Plan, variants: list[Variant], blobs: Any, resources: Mapping[str, float]) -> None:
    task = _measure.options(resources=dict(resources)) if resources else _measure
    for variant in (v for v in variants if v.status == "ok" and v.plugin):
        plugin = Path(variant.plugin or "")
        with echo.Stopwatch(f"benchmark {variant.label}"):
            ref = task.remote(blobs, plan, variant.params, plugin.read_bytes(), plugin.name)
            try:
                answer = ray.get(ref, timeout=plan.budget + plan.max_rounds * plan.timeout + 120)
            except ray.exceptions.GetTimeoutError:
                ray.cancel(ref, force=True)
                variant.status, variant.reason = LOST, f"no node with {dict(resources) or 'a free CPU'} finished its benchmark in time"
                continue
            except ray.exceptions.RayError as error:
                _lost(variant, error)
                continue
        variant.status, variant.reason, variant.samples_ms, variant.node = answer["status"], answer["reason"], answer["samples_ms"], answer["node"]


def sweep(plan: Plan, variants: list[Variant], expected: Sequence[numpy.ndarray], *, address: str, resources: Mapping[str, float], directory: Path) -> None:
    """Build and check every variant as Ray tasks, then benchmark the correct ones, one at a time."""
    connect(address)
    try:
        require_resources(resources)
        blobs = ray.put(bundle(plan, expected))
        with echo.Stopwatch(f"build and check {len(variants)} variant(s) on the Ray cluster at {address}"):
            _collect_checks(plan, variants, blobs, directory)
            log_checked(variants)
            _mark_as_written(plan, variants, blobs)
        _collect_measurements(plan, variants, blobs, resources)
    finally:
        ray.shutdown()
