"""Plain record classes for the modules every verb imports, without `dataclasses`.

Importing dataclasses costs ~8 ms (it imports inspect, ast, dis and tokenize), a seventh of
a cache hit's whole budget. `record` writes the same __init__, __repr__, __eq__ and (frozen)
__hash__ and read-only attributes for a class's annotated fields, in their order; a field
with a default (or `field(default_factory=...)`) must follow those without, as in a dataclass.
Modules off the hot path, or that need asdict/replace, keep using dataclasses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

T = TypeVar("T")

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform  # typing has it from 3.11 only
else:

    def dataclass_transform(**_: object) -> Callable[[T], T]:
        return lambda decorated: decorated  # a marker for type checkers; nothing at run time


_MISSING = object()


class _Factory:
    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def field(*, default_factory: Callable[[], Any]) -> Any:
    """A field whose default is made per instance (a new list or dict), as dataclasses.field."""
    return _Factory(default_factory)


class FrozenError(AttributeError):
    """Assigning to a field of a frozen record (dataclasses raises an AttributeError too)."""


@overload
def record(cls: type[T], *, frozen: bool = False) -> type[T]: ...


@overload
def record(cls: None = None, *, frozen: bool = False) -> Callable[[type[T]], type[T]]: ...


# Type checkers read a record class as a dataclass: its fields are its __init__'s parameters.
@dataclass_transform(field_specifiers=(field,))
def record(cls: type[T] | None = None, *, frozen: bool = False) -> type[T] | Callable[[type[T]], type[T]]:
    """Class decorator: `@record` or `@record(frozen=True)`."""

    def wrap(klass: type[T]) -> type[T]:
        names = [n for n, a in klass.__dict__.get("__annotations__", {}).items() if not str(a).startswith(("ClassVar", "typing.ClassVar"))]
        defaults = {n: klass.__dict__[n] for n in names if n in klass.__dict__}
        for name, value in defaults.items():
            if isinstance(value, _Factory):
                delattr(klass, name)  # made per instance (a plain default stays a class attribute, as in dataclasses)
        setter = "object.__setattr__(self, {n!r}, {v})" if frozen else "self.{n} = {v}"
        params: list[str] = []
        body: list[str] = []
        env: dict[str, Any] = {"_Factory": _Factory}
        for n in names:
            value = defaults.get(n, _MISSING)
            if value is _MISSING:
                params.append(n)
                body.append(setter.format(n=n, v=n))
            elif isinstance(value, _Factory):
                env[f"_make_{n}"] = value.make
                params.append(f"{n}=_Factory")
                body.append(setter.format(n=n, v=f"_make_{n}() if {n} is _Factory else {n}"))
            else:
                env[f"_default_{n}"] = value
                params.append(f"{n}=_default_{n}")
                body.append(setter.format(n=n, v=n))
        source = f"def __init__(self, {', '.join(params)}):\n    " + ("\n    ".join(body) or "pass")
        exec(source, env)  # noqa: S102 - the source is made of this class's own field names
        init = env["__init__"]
        init.__qualname__ = f"{klass.__qualname__}.__init__"
        klass.__init__ = init  # type: ignore[method-assign]
        fields = tuple(names)

        def __repr__(self: Any) -> str:
            return f"{type(self).__qualname__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in fields) + ")"

        def __eq__(self: Any, other: object) -> bool:
            if other.__class__ is not self.__class__:
                return NotImplemented
            return all(getattr(self, n) == getattr(other, n) for n in fields)

        klass.__repr__ = __repr__  # type: ignore[method-assign]
        klass.__eq__ = __eq__  # type: ignore[method-assign]
        klass.__match_args__ = fields  # type: ignore[attr-defined,misc]
        if frozen:

            def __setattr__(self: Any, name: str, value: object) -> None:
                raise FrozenError(f"cannot assign to field {name!r}")

            def __delattr__(self: Any, name: str) -> None:
                raise FrozenError(f"cannot delete field {name!r}")

            klass.__setattr__ = __setattr__  # type: ignore[method-assign]
            klass.__delattr__ = __delattr__  # type: ignore[method-assign]
            klass.__hash__ = lambda self: hash(tuple(getattr(self, n) for n in fields))  # type: ignore[method-assign]
        else:
            klass.__hash__ = None  # type: ignore[assignment]  # mutable and compared by value, as a dataclass
        return klass

    return wrap if cls is None else wrap(cls)
