"""One program, read once for every group `ops` lists and `replace` generates.

The program is parsed once as a spec sees it, its groups found once, and the generalized copy
(every named linalg op as the linalg.generic it stands for, which the emitters read) parsed once,
when a kernel is first generated. Every group's matcher, kernel and replaceability, for every
target, come from this one reading: nothing a group asks costs a pass over the whole model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyree_build.models.ir import captures, groups, program


@dataclass
class Analysis:
    """A program's text, its parsed module, its groups, and (on first use) its generalized copy."""

    text: str
    module: Any
    groups: list[groups.Group]
    _generalized: Any = field(default=None, repr=False)
    _generalized_functions: dict[str, Any] = field(default_factory=dict, repr=False)
    _anchors: dict[Any, tuple[str, int, int]] | None = field(default=None, repr=False)

    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)

    @classmethod
    @contextlib.contextmanager
    def of(cls, text: str) -> Iterator[Analysis]:
        """The program `text`, read for the block: its facts are kept until it ends."""
        module = program.parse(text)
        with contextlib.ExitStack() as stack:
            stack.enter_context(program.reading(module))
            found = cls(text, module, groups.find_groups(module), _stack=stack)
            yield found

    def generalized_function(self, function: Any) -> Any:
        """The generalized copy of `function` (one of this module's): its top-level ops
        correspond one to one, in order, with the original's."""
        if self._generalized is None:
            self._generalized = program.parse(self.text, generalize=True)
            self._stack.enter_context(program.reading(self._generalized))
            # By name, listed once: a model's module holds a global per weight besides its functions.
            self._generalized_functions = {program.symbol_name(f): f for f in program.functions(self._generalized)}
        return self._generalized_functions[program.symbol_name(function)]

    def anchor(self, op: Any) -> tuple[str, int, int]:
        """`op`'s name, its place among the module's ops of that name in the order
        `transform.structured.match` lists them (pre-order), and how many there are: how a
        spec picks out this op."""
        if self._anchors is None:
            places: dict[Any, tuple[str, int]] = {}
            counts: dict[str, int] = {}
            for each in captures.nested_ops(self.module.operation):
                places[each] = (each.name, counts.get(each.name, 0))
                counts[each.name] = counts.get(each.name, 0) + 1
            self._anchors = {op: (name, place, counts[name]) for op, (name, place) in places.items()}
        return self._anchors[op]
