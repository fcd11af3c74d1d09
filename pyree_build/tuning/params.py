"""A tune's knobs: `NAME=V1,V2` parameters as given (`parse_params`, checked to be -D macros with
printable one-line values), as a source declares them (`// pyree-tune:` lines, `declared_params`),
and every combination of their values (`variants_of`).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pyree_build.core.errors import PyreeError, require_file
from pyree_build.tuning.plan import PathLike, Variant

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_params(params: Mapping[str, object] | str | Iterable[str]) -> dict[str, list[str]]:
    """`NAME=V1,V2` strings (or a mapping NAME -> values) as NAME -> list of values, in order."""
    items: Iterable[tuple[str, object]]
    if isinstance(params, Mapping):
        items = params.items()
    else:
        texts: list[object] = [params] if isinstance(params, str) else list(params)
        pairs: list[tuple[str, object]] = []
        for text in texts:
            if not isinstance(text, str) or "=" not in text:
                raise PyreeError(f"parameter {text!r} is not NAME=V1,V2,...", fix="e.g. --param TILE=1,2,4,8 (repeatable)")
            name, _, text_values = text.partition("=")
            pairs.append((name.strip(), [v.strip() for v in text_values.split(",") if v.strip()]))
        items = pairs
    parsed: dict[str, list[str]] = {}
    for name, values in items:
        listed: list[Any] = [values] if isinstance(values, (str, int, float)) or not isinstance(values, Iterable) else list(values)
        if not isinstance(name, str) or not _NAME.match(name):
            raise PyreeError(f"parameter name {name!r} is not a C macro name", fix="name a -D macro of the kernel: letters, digits, _")
        if name in parsed or not listed:
            raise PyreeError(f"parameter {name} is given twice or without values", fix=f"give each once: --param {name}=1,2,4")
        values = [str(v) for v in listed]
        for value in values:
            # A -D value is one line of the preprocessor's predefines: a line break would add lines of its own.
            if not value or not value.isprintable():
                raise PyreeError(f"parameter {name} has the value {value!r}, which is empty or holds a line break or control character",
                                 fix=f"give printable values on one line: --param {name}=1,2,4")  # fmt: skip
        parsed[name] = values
    if not parsed:
        raise PyreeError("nothing to tune: no --param given", fix="e.g. --param TILE=1,2,4,8")
    return parsed


# A knob a source declares for tune: `// pyree-tune: NAME=V1,V2,...` (what `replace` writes above
# each of its schedule's macros); the rest of the line after the values is a comment. A knob
# declared `// pyree-tune after: NAME=...` is swept after the others are chosen, at their winner.
_DECLARED = re.compile(r"^\s*//\s*pyree-tune(\s+after)?:\s*([A-Za-z_]\w*\s*=\s*[^\s]+)", re.MULTILINE)


def declared_stages(sources: Sequence[PathLike] | PathLike) -> list[dict[str, list[str]]]:
    """The knobs the sources declare, as the stages tune sweeps them in when given no --param:
    every `// pyree-tune: NAME=V1,V2` knob together first (every combination), then each
    `// pyree-tune after: NAME=...` knob alone, in the order written, at the values chosen so
    far (a tile first, then its vector width: 16 + 4 variants rather than 64). A name declared
    twice keeps its first values."""
    first: dict[str, list[str]] = {}
    later: list[dict[str, list[str]]] = []
    seen: set[str] = set()
    for source in [sources] if isinstance(sources, (str, os.PathLike)) else sources:
        text = require_file(source, "C source").read_text(encoding="utf-8", errors="replace")
        for after, declaration in _DECLARED.findall(text):
            for name, values in parse_params([declaration]).items():
                if name not in seen:
                    seen.add(name)
                    if after:
                        later.append({name: values})
                    else:
                        first[name] = values
    return [stage for stage in [first, *later] if stage]


def declared_params(sources: Sequence[PathLike] | PathLike) -> dict[str, list[str]]:
    """Every knob the sources declare (`// pyree-tune:` and `// pyree-tune after:` lines), in the
    order of the stages tune sweeps them in."""
    return {name: values for stage in declared_stages(sources) for name, values in stage.items()}


def declared_or_refuse(sources: Sequence[PathLike] | PathLike) -> list[dict[str, list[str]]]:
    declared = declared_stages(sources)
    if not declared:
        raise PyreeError(
            "nothing to tune: no --param given, and the source declares no knob",
            file=os.fspath(sources) if isinstance(sources, (str, os.PathLike)) else None,
            fix="pass --param TILE=1,2,4,8, or declare the knob in the source: a line `// pyree-tune: TILE=1,2,4,8` (replace writes them)",
        )
    return declared


def variants_of(params: Mapping[str, Sequence[str]], first_order: int = 0) -> list[Variant]:
    """Every combination of the values (the cartesian product), in the order given."""
    names = list(params)
    combinations = itertools.product(*(params[n] for n in names))
    return [Variant(dict(zip(names, values)), order=first_order + k) for k, values in enumerate(combinations)]
