"""Reading FlatBuffer tables by field index, bounds-checked, without generated code.

IREE's executable formats (a Vulkan executable's pipelines, its SPIR-V) are FlatBuffers
embedded in a module; pyree_build reads a few fields of them. Every read checks its bounds
and raises ValueError on bytes that are not a well-formed table, so a caller can scan a
module for candidates and skip what does not parse.
"""

from __future__ import annotations

import struct


class Table:
    """One table of a FlatBuffer: `data[at:]` starts with its offset to its vtable."""

    def __init__(self, data: bytes, at: int) -> None:
        self.data = data
        self.at = at
        vtable = at - _read(data, "<i", at)
        vtable_size = _read(data, "<H", vtable)
        if vtable_size < 4 or vtable_size % 2:
            raise ValueError(f"a vtable of {vtable_size} bytes")
        self._fields = [_read(data, "<H", vtable + 4 + 2 * i) for i in range((vtable_size - 4) // 2)]

    @classmethod
    def root(cls, data: bytes, at: int = 0) -> Table:
        """The root table of the FlatBuffer that starts at `at`."""
        return cls(data, at + _read(data, "<I", at))

    def _field(self, index: int) -> int | None:
        offset = self._fields[index] if index < len(self._fields) else 0
        return self.at + offset if offset else None

    def u32(self, index: int, default: int = 0) -> int:
        where = self._field(index)
        return default if where is None else _read(self.data, "<I", where)

    def _vector(self, index: int) -> tuple[int, int]:
        """(first element, length) of a vector field; (0, 0) where it is absent."""
        where = self._field(index)
        if where is None:
            return 0, 0
        start = where + _read(self.data, "<I", where)
        return start + 4, _read(self.data, "<I", start)

    def tables(self, index: int) -> list[Table]:
        first, length = self._vector(index)
        slots = [first + 4 * i for i in range(length)]
        return [Table(self.data, slot + _read(self.data, "<I", slot)) for slot in slots]

    def u32_bytes(self, index: int) -> bytes:
        """A [uint32] vector field as its raw little-endian bytes."""
        first, length = self._vector(index)
        if first + 4 * length > len(self.data):
            raise ValueError("a vector past the end of the buffer")
        return self.data[first : first + 4 * length]

    def string(self, index: int) -> str:
        first, length = self._vector(index)
        if first + length > len(self.data):
            raise ValueError("a string past the end of the buffer")
        return self.data[first : first + length].decode("utf-8", errors="replace")


def _read(data: bytes, fmt: str, at: int) -> int:
    if at < 0:
        raise ValueError("an offset before the start of the buffer")
    try:
        value: int = struct.unpack_from(fmt, data, at)[0]
    except struct.error as exc:
        raise ValueError(str(exc)) from None
    return value
