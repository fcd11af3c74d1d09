"""FatELF: several ELF files, one per architecture, in one container the IREE runtime reads.

Layout (little-endian throughout), as IREE's loader reads it:
  header, 8 bytes:   u32 magic 0x1F0E70FA, u16 version 1, u8 record count, u8 reserved
  record, 24 bytes:  u16 e_machine, u8 osabi, u8 osabi version, u8 word size (1 = 32-bit,
                     2 = 64-bit), u8 byte order (1 = little, 0 = big), 2 reserved bytes,
                     u64 offset, u64 size
The ELFs follow, each starting on a page boundary. The loader takes the record whose
machine, word size and byte order match the host.

Reading is strict and bounded: every malformed container gets its own message and no
read goes past the data it was given.
"""
from __future__ import annotations

import os
import platform
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .errors import PyreeError

PathLike = str | os.PathLike[str]

MAGIC = 0x1F0E70FA
VERSION = 1
HEADER = struct.Struct("<IHBB")
RECORD = struct.Struct("<HBBBBBBQQ")
PAGE = 4096
MAX_RECORDS = 255

WORD_SIZE_32, WORD_SIZE_64 = 1, 2
BYTE_ORDER_BIG, BYTE_ORDER_LITTLE = 0, 1  # the runtime's values (not ELF's EI_DATA 2/1)

MACHINES = {"x86_64": 62, "aarch64": 183, "riscv64": 243}
_ARCH_OF_MACHINE = {v: k for k, v in MACHINES.items()}
_ELF_MAGIC = b"\x7fELF"

_FIX_REBUILD = "rebuild it with `pyree-build plugin --kind standalone ... -o X.sos` or `pyree-build fatelf join`"


@dataclass(frozen=True)
class Record:
    machine: int
    osabi: int
    osabi_version: int
    word_size: int
    byte_order: int
    offset: int
    size: int

    @property
    def arch(self) -> str:
        return _ARCH_OF_MACHINE.get(self.machine, f"machine {self.machine}")

    @property
    def bits(self) -> int:
        return 64 if self.word_size == WORD_SIZE_64 else 32

    @property
    def endian(self) -> str:
        return "little" if self.byte_order == BYTE_ORDER_LITTLE else "big"


@dataclass(frozen=True)
class _ElfIdentity:
    machine: int
    osabi: int
    osabi_version: int
    word_size: int
    byte_order: int


def _identity(data: bytes) -> _ElfIdentity | None:
    """The fields a record copies from an ELF header, or None if `data` is not an ELF."""
    if len(data) < 20 or data[:4] != _ELF_MAGIC or data[4] not in (1, 2) or data[5] not in (1, 2):
        return None
    little = data[5] == 1
    (machine,) = struct.unpack_from("<H" if little else ">H", data, 18)
    return _ElfIdentity(
        machine=machine,
        osabi=data[7],
        osabi_version=data[8],
        word_size=WORD_SIZE_32 if data[4] == 1 else WORD_SIZE_64,
        byte_order=BYTE_ORDER_LITTLE if little else BYTE_ORDER_BIG,
    )


def machine_for_arch(arch: str) -> int:
    from .elfcheck import normalize_arch

    return MACHINES[normalize_arch(arch)]


def _align(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


def pack(elfs: Sequence[PathLike | bytes]) -> bytes:
    """Build a FatELF from ELF files or ELF bytes, one per architecture."""
    if not elfs:
        raise PyreeError("no ELF files to pack", fix="pass at least one ELF")
    if len(elfs) > MAX_RECORDS:
        raise PyreeError(f"{len(elfs)} ELF files; a FatELF holds at most {MAX_RECORDS}", fix="pack fewer files")
    blobs: list[tuple[str, bytes, _ElfIdentity]] = []
    seen: dict[tuple[int, int, int], str] = {}
    for item in elfs:
        label = "<bytes>" if isinstance(item, bytes) else os.fspath(item)
        if isinstance(item, bytes):
            data = item
        else:
            try:
                data = Path(item).read_bytes()
            except OSError as exc:
                raise PyreeError(f"cannot read it: {exc.strerror}", file=label, fix="check the path") from None
        ident = _identity(data)
        if ident is None:
            raise PyreeError("not an ELF file", file=label, fix="pass the ELF files built for each architecture")
        key = (ident.machine, ident.word_size, ident.byte_order)
        if key in seen:
            arch = _ARCH_OF_MACHINE.get(ident.machine, f"machine {ident.machine}")
            raise PyreeError(
                f"two ELF files for the same architecture ({arch}): {seen[key]} and {label}",
                file=label,
                fix="pass one ELF per architecture; the runtime could only ever load one of them",
            )
        seen[key] = label
        blobs.append((label, data, ident))

    offset = _align(HEADER.size + RECORD.size * len(blobs))
    table = bytearray(HEADER.pack(MAGIC, VERSION, len(blobs), 0))
    body = bytearray()
    for _, data, ident in blobs:
        table += RECORD.pack(ident.machine, ident.osabi, ident.osabi_version, ident.word_size, ident.byte_order, 0, 0, offset, len(data))
        body += data + b"\0" * (_align(len(data)) - len(data))
        offset += _align(len(data))
    table += b"\0" * (_align(len(table)) - len(table))
    return bytes(table + body)


def write(output: PathLike, inputs: Sequence[PathLike | bytes]) -> Path:
    """Pack `inputs` into the FatELF file `output`, atomically."""
    from .cache import atomic_output

    data = pack(inputs)
    out = Path(output)
    with atomic_output(out) as tmp:
        tmp.write_bytes(data)
    return out


def parse(data: bytes, *, file: PathLike | None = None) -> list[Record]:
    """The records of a FatELF held in `data`; a PyreeError for anything malformed."""

    def bad(what: str, fix: str = _FIX_REBUILD) -> PyreeError:
        return PyreeError(what, file=file, fix=fix)

    if len(data) < HEADER.size:
        if data[:4] == _ELF_MAGIC[: len(data[:4])] and data:
            raise bad("truncated: shorter than an ELF header, and not a FatELF")
        raise bad(f"truncated: {len(data)} bytes, shorter than the {HEADER.size}-byte FatELF header")
    magic, version, count, _ = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        if data[:4] == _ELF_MAGIC:
            raise bad(
                "bad magic: this is a plain ELF file, not a FatELF",
                fix="pass it to the runtime directly, or wrap it with `pyree-build fatelf join`",
            )
        raise bad(f"bad magic 0x{magic:08X} (a FatELF starts with 0x{MAGIC:08X})")
    if version != VERSION:
        raise bad(f"unknown version {version} (only version {VERSION} is defined)")
    if count == 0:
        raise bad("no records: the FatELF holds no ELF")
    table_end = HEADER.size + RECORD.size * count
    if len(data) < table_end:
        raise bad(f"truncated: the record table needs {table_end} bytes, the file has {len(data)}")

    records = []
    for i in range(count):
        fields = RECORD.unpack_from(data, HEADER.size + RECORD.size * i)
        machine, osabi, osabi_version, word_size, byte_order, _, _, offset, size = fields
        records.append(Record(machine, osabi, osabi_version, word_size, byte_order, offset, size))

    spans = []
    for i, rec in enumerate(records):
        where = f"record {i} ({rec.arch})"
        if rec.size == 0:
            raise bad(f"{where} has size 0")
        if rec.offset > len(data) or rec.size > len(data) - rec.offset:
            raise bad(f"{where} lies past the end of the file: bytes {rec.offset}..{rec.offset + rec.size}, file size {len(data)}")
        if rec.offset < table_end:
            raise bad(f"{where} overlaps the header and record table (offset {rec.offset} < {table_end})")
        spans.append((rec.offset, rec.offset + rec.size, i))
    spans.sort()
    for (start_a, end_a, a), (start_b, _, b) in zip(spans, spans[1:]):
        if start_b < end_a:
            raise bad(f"records {a} and {b} overlap (bytes {start_a}..{end_a} and from {start_b})")

    for i, rec in enumerate(records):
        where = f"record {i} ({rec.arch})"
        ident = _identity(data[rec.offset : rec.offset + min(rec.size, 64)])
        if ident is None:
            raise bad(f"{where}: its bytes are not an ELF file")
        mismatches = []
        if ident.machine != rec.machine:
            mismatches.append(f"machine {ident.machine} in the ELF, {rec.machine} in the record")
        if ident.word_size != rec.word_size:
            mismatches.append(f"{'64' if ident.word_size == WORD_SIZE_64 else '32'}-bit ELF, word size {rec.word_size} in the record")
        if ident.byte_order != rec.byte_order:
            mismatches.append(f"{'little' if ident.byte_order else 'big'}-endian ELF, byte order {rec.byte_order} in the record")
        if mismatches:
            raise bad(f"{where}: the ELF disagrees with its record: {'; '.join(mismatches)}")
    return records


def read(path: PathLike) -> list[Record]:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise PyreeError(f"cannot read it: {exc.strerror}", file=p, fix="check the path") from None
    return parse(data, file=p)


def describe(records: Sequence[Record]) -> str:
    lines = [f"{'arch':<10} {'class':<7} {'order':<7} {'offset':>10} {'size':>10}"]
    for rec in records:
        lines.append(f"{rec.arch:<10} {rec.bits}-bit  {rec.endian:<7} {rec.offset:>10} {rec.size:>10}")
    return "\n".join(lines)


def _host_machine() -> int:
    from .elfcheck import host_arch

    arch = host_arch()
    if arch not in MACHINES:
        raise PyreeError(f"no FatELF machine number known for this host ({platform.machine()})", fix="pass --arch")
    return MACHINES[arch]


def select(
    path: PathLike, *, machine: int | None = None, word_size: int = WORD_SIZE_64, byte_order: int = BYTE_ORDER_LITTLE
) -> bytes:
    """The ELF bytes for `machine` (default: this host), as the runtime's loader would pick."""
    p = Path(path)
    records = read(p)
    data = p.read_bytes()
    want = _host_machine() if machine is None else machine
    for rec in records:
        if rec.machine == want and rec.word_size == word_size and rec.byte_order == byte_order:
            return data[rec.offset : rec.offset + rec.size]
    present = ", ".join(f"{r.arch} ({r.bits}-bit {r.endian})" for r in records)
    wanted = _ARCH_OF_MACHINE.get(want, f"machine {want}")
    raise PyreeError(f"no ELF for {wanted} in it; it holds: {present}", file=p, fix="build the plugin for that arch too (--arch)")


def split(path: PathLike, output_dir: PathLike) -> list[Path]:
    """Write each ELF of the FatELF to `output_dir/<stem>_<arch>.so`."""
    from .cache import atomic_output

    p = Path(path)
    records = read(p)
    data = p.read_bytes()
    outs = []
    for rec in records:
        out = Path(output_dir) / f"{p.stem}_{rec.arch.replace(' ', '_')}.so"
        with atomic_output(out) as tmp:
            tmp.write_bytes(data[rec.offset : rec.offset + rec.size])
        outs.append(out)
    return outs
