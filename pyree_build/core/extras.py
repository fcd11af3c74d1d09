"""pyree_build's extras (pyproject.toml's optional dependencies) as this environment has them.

The default install is the lean core: every CPU workflow, and nothing that runs code at
Python start-up. GPU targets and the ONNX sample come with extras (`[cuda]`, `[vulkan]`,
`[onnx]`, `[ptxas]`; `[all]` is every one a sample uses). What each extra requires is read
from the installed package's metadata, so it is always pyproject.toml's list; an extra is
installed when every distribution it requires on this machine is.

A tool comes from an extra when its install command starts with that extra's command
(`pip install "pyree_build[cuda]"`): `doctor` reads that to name the extra a workflow needs.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping

from pyree_build.core import lazy

# importlib.metadata costs ~15 ms: only `doctor` reads it.
_metadata = lazy.module("importlib.metadata")

DIST = "pyree_build"
# Extras for developing pyree_build itself, not for a workflow: doctor does not list them.
DEVELOPER_EXTRAS = ("test",)
_INSTALL = re.compile(r'^pip install "pyree_build\[([\w-]+)\]"')
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_CLAUSE = re.compile(r"""\s*(?:(\()|(\))|(and|or)\b|([a-z_.]+)\s*(===|==|!=|<=|>=|~=|<|>|not in|in)\s*(['"])(.*?)\6)""")


def install_command(extra: str) -> str:
    """The one command that adds `extra` to this environment."""
    return f'pip install "{DIST}[{extra}]"'


def extra_of_install(install: str) -> str | None:
    """The extra whose command an install hint starts with (None: the tool comes from elsewhere)."""
    found = _INSTALL.match(install)
    return found.group(1) if found else None


def normalize(name: str) -> str:
    """A distribution name as the package index compares names (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def marker_environment(extra: str = "") -> dict[str, str]:
    """The values a requirement's environment marker may name, for this Python and machine."""
    return {
        "extra": extra,
        "platform_system": platform.system(),
        "sys_platform": sys.platform,
        "platform_machine": platform.machine(),
        "os_name": os.name,
        "python_version": "{}.{}".format(*sys.version_info),
        "python_full_version": platform.python_version(),
        "implementation_name": sys.implementation.name,
        "platform_python_implementation": platform.python_implementation(),
    }


def _compare(left: str, op: str, right: str) -> bool:
    if op in ("in", "not in"):
        return (left in right) == (op == "in")
    if re.fullmatch(r"[\d.]+", left) and re.fullmatch(r"[\d.]+", right) and op not in ("===",):
        a, b = (tuple(int(p) for p in v.split(".") if p) for v in (left, right))
        return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "~=": a >= b}[op]
    return {"==": left == right, "===": left == right, "!=": left != right}.get(op, True)


def marker_holds(marker: str, environment: Mapping[str, str]) -> bool:
    """Whether a PEP 508 environment marker holds: `name op 'value'` clauses joined by and/or,
    with parentheses, as pip's markers are written (a marker it cannot read counts as true)."""
    tokens: list[bool | str] = []
    position, marker = 0, marker.strip()
    while position < len(marker):
        found = _CLAUSE.match(marker, position)
        if not found or found.end() == position:
            return True
        opening, closing, joiner, name, op, _, value = found.groups()
        tokens.append(opening or closing or joiner or _compare(str(environment.get(name, "")), op, value))
        position = found.end()
    try:
        value, end = _either(tokens, 0)
    except (IndexError, ValueError):
        return True
    return value if end == len(tokens) else True


def _either(tokens: list[bool | str], i: int) -> tuple[bool, int]:
    value, i = _both(tokens, i)
    while i < len(tokens) and tokens[i] == "or":
        right, i = _both(tokens, i + 1)
        value = value or right
    return value, i


def _both(tokens: list[bool | str], i: int) -> tuple[bool, int]:
    value, i = _one(tokens, i)
    while i < len(tokens) and tokens[i] == "and":
        right, i = _one(tokens, i + 1)
        value = value and right
    return value, i


def _one(tokens: list[bool | str], i: int) -> tuple[bool, int]:
    if tokens[i] == "(":
        value, i = _either(tokens, i + 1)
        if tokens[i] != ")":
            raise ValueError("unbalanced parentheses")
        return value, i + 1
    if not isinstance(tokens[i], bool):
        raise ValueError(f"unexpected {tokens[i]!r}")
    return bool(tokens[i]), i + 1


def parse_requirement(text: str) -> tuple[str, tuple[str, ...], str]:
    """(normalized distribution name, its extras, its marker) of one Requires-Dist line."""
    spec, _, marker = text.partition(";")
    found = _REQUIREMENT.match(spec)
    if not found:
        raise ValueError(f"not a requirement: {text!r}")
    extras = tuple(e.strip() for e in (found.group(2) or "").split(",") if e.strip())
    return normalize(found.group(1)), extras, marker.strip()


def declared(requires: Iterable[str], names: Iterable[str], environment: Mapping[str, str] | None = None) -> dict[str, tuple[str, ...]]:
    """Each extra in `names` -> the distributions it adds on this machine (sorted), given the
    package's Requires-Dist lines; `pyree_build[other]` in an extra brings `other`'s too."""
    base = dict(environment if environment is not None else marker_environment())
    direct: dict[str, set[str]] = {}
    nested: dict[str, set[str]] = {}
    lines = [parse_requirement(line) for line in requires]
    for extra in names:
        direct[extra], nested[extra] = set(), set()
        for dist, extras, marker in lines:
            if not marker or "extra" not in marker or not marker_holds(marker, {**base, "extra": extra}):
                continue
            if dist == normalize(DIST):
                nested[extra].update(extras)
            else:
                direct[extra].add(dist)

    def closure(extra: str, seen: frozenset[str]) -> set[str]:
        dists = set(direct.get(extra, ()))
        for other in nested.get(extra, ()):
            if other not in seen:
                dists |= closure(other, seen | {other})
        return dists

    return {extra: tuple(sorted(closure(extra, frozenset({extra})))) for extra in direct}


def this_package() -> dict[str, tuple[str, ...]] | None:
    """`declared` for the installed pyree_build: every extra it offers, in pyproject's order
    (None: pyree_build is not installed, e.g. a checkout on PYTHONPATH, so it has no metadata)."""
    try:
        meta = _metadata.metadata(DIST)
    except _metadata.PackageNotFoundError:
        return None
    return declared(meta.get_all("Requires-Dist") or [], meta.get_all("Provides-Extra") or [])


def installed_distributions() -> set[str]:
    """The normalized names of every distribution this Python sees."""
    return {normalize(d.metadata["Name"]) for d in _metadata.distributions() if d.metadata["Name"]}


def missing(extras: Mapping[str, Iterable[str]], have: set[str]) -> dict[str, tuple[str, ...]]:
    """Each extra -> the distributions it requires that are not installed (empty: installed)."""
    return {extra: tuple(d for d in dists if normalize(d) not in have) for extra, dists in extras.items()}
