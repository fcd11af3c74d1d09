"""FatELF: several ELF files, one per architecture, in one container the IREE runtime reads.

Layout (little-endian throughout), as IREE's loader reads it
(runtime/src/iree/hal/local/elf/fatelf.h and fatelf.c):
  header, 8 bytes:   u32 magic 0x1F0E70FA, u16 version 1, u8 record count, u8 reserved
  record, 24 bytes:  u16 e_machine, u8 osabi (e_ident[7]), u8 osabi version (e_ident[8]),
                     u8 word size (1 = 32-bit, 2 = 64-bit: the same values as ELF's EI_CLASS),
                     u8 byte order (1 = little, 0 = big: NOT ELF's EI_DATA, where big is 2),
                     2 reserved bytes, u64 offset, u64 size
The ELFs follow, each starting on a page boundary when we write them. The loader takes the
first record whose machine, word size and byte order match the host.

Reading is strict and bounded: every malformed container gets its own message (a PyreeError
naming the file, what is wrong and what to do), and no read goes past the data it was given.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Union

from pyree_build.backends.llvm_cpu.elf import host_arch, normalize_arch
from pyree_build.core import args, lazy
from pyree_build.core.errors import PyreeError, require_file
from pyree_build.core.files import atomic_output, atomic_outputs
from pyree_build.core.outputs import check_outputs
from pyree_build.core.records import record

# Only to name an unknown host in an error.
platform = lazy.module("platform")

PathLike = Union[str, "os.PathLike[str]"]
ElfInput = PathLike | bytes | bytearray | memoryview

MAGIC = 0x1F0E70FA
VERSION = 1
HEADER = struct.Struct("<IHBB")
RECORD = struct.Struct("<HBBBBBBQQ")
PAGE = 4096
MAX_RECORDS = 255  # the record count is one byte

WORD_SIZE_32, WORD_SIZE_64 = 1, 2
# IREE's own values; its header warns they differ from ELF's EI_DATA (LSB 1, MSB 2).
BYTE_ORDER_BIG, BYTE_ORDER_LITTLE = 0, 1

MACHINES = {"x86_64": 62, "aarch64": 183, "riscv64": 243}
_ARCH_OF_MACHINE = {v: k for k, v in MACHINES.items()}

_ELF_MAGIC = b"\x7fELF"
_EI_CLASS, _EI_DATA, _EI_OSABI, _EI_ABIVERSION = 4, 5, 7, 8
_ELFCLASS32, _ELFCLASS64 = 1, 2
_ELFDATA2LSB, _ELFDATA2MSB = 1, 2
# An ELF header is 52 bytes for 32-bit and 64 for 64-bit; anything shorter cannot be loaded.
_EHDR_SIZE = {_ELFCLASS32: 52, _ELFCLASS64: 64}

_FIX_REBUILD = "rebuild it with `pyree-build plugin --kind standalone --arch A --arch B ... -o X.sos` or `pyree-build fatelf join`"


@record(frozen=True)
class Record:
    """One row of the record table: which ELF, and where its bytes lie in the container."""

    machine: int
    osabi: int
    osabi_version: int
    word_size: int
    byte_order: int
    offset: int
    size: int

    @property
    def arch(self) -> str:
        # EM_RISCV (243) covers rv32 and rv64; only the class tells them apart.
        if self.machine == MACHINES["riscv64"] and self.word_size == WORD_SIZE_32:
            return "riscv32"
        return _ARCH_OF_MACHINE.get(self.machine, f"machine {self.machine}")

    @property
    def bits(self) -> int | None:
        """32 or 64; None for a word size the format does not define."""
        return {WORD_SIZE_32: 32, WORD_SIZE_64: 64}.get(self.word_size)

    @property
    def endian(self) -> str:
        """'little' or 'big'; a value the format does not define is shown as such."""
        return {BYTE_ORDER_LITTLE: "little", BYTE_ORDER_BIG: "big"}.get(self.byte_order, f"byte order {self.byte_order}")

    @property
    def end(self) -> int:
        return self.offset + self.size

    @property
    def label(self) -> str:
        """e.g. 'aarch64 (64-bit little-endian)', for messages."""
        bits = f"{self.bits}-bit" if self.bits else f"word size {self.word_size}"
        order = f"{self.endian}-endian" if self.byte_order in (BYTE_ORDER_LITTLE, BYTE_ORDER_BIG) else self.endian
        return f"{self.arch} ({bits} {order})"


@record(frozen=True)
class _ElfIdentity:
    """The fields a record copies from an ELF header, already in FatELF's encoding."""

    machine: int
    osabi: int
    osabi_version: int
    word_size: int
    byte_order: int


def _identity(data: bytes | memoryview) -> _ElfIdentity | None:
    """Read the identity from an ELF header, or None if `data` does not start with one."""
    if len(data) < 20 or bytes(data[:4]) != _ELF_MAGIC:
        return None
    elf_class, elf_data = data[_EI_CLASS], data[_EI_DATA]
    if elf_class not in _EHDR_SIZE or elf_data not in (_ELFDATA2LSB, _ELFDATA2MSB):
        return None
    if len(data) < _EHDR_SIZE[elf_class]:
        return None
    little = elf_data == _ELFDATA2LSB
    # e_machine sits at offset 18 in both classes, in the ELF's own byte order.
    (machine,) = struct.unpack_from("<H" if little else ">H", data, 18)
    return _ElfIdentity(
        machine=machine,
        osabi=data[_EI_OSABI],
        osabi_version=data[_EI_ABIVERSION],
        word_size=WORD_SIZE_32 if elf_class == _ELFCLASS32 else WORD_SIZE_64,
        byte_order=BYTE_ORDER_LITTLE if little else BYTE_ORDER_BIG,
    )


def machine_for_arch(arch: str) -> int:
    """ELF e_machine for an arch name; IREE's spellings (arm_64, riscv_64) are accepted too."""
    return MACHINES[normalize_arch(arch)]  # normalize_arch raises a PyreeError naming the known arches


def _align(n: int) -> int:
    return -(-n // PAGE) * PAGE


def _pad(n: int) -> bytes:
    return b"\0" * (_align(n) - n)


def pack(elfs: Sequence[ElfInput]) -> bytes:
    """Build a FatELF from ELF files or ELF bytes, one per (machine, word size, byte order)."""
    if isinstance(elfs, (str, os.PathLike, bytes, bytearray, memoryview)):
        elfs = [elfs]  # one file, never its characters
    if not elfs:
        raise PyreeError("no ELF files to pack into a FatELF", fix="pass at least one ELF")
    if len(elfs) > MAX_RECORDS:
        raise PyreeError(f"{len(elfs)} ELF files; a FatELF holds at most {MAX_RECORDS}", fix="pack fewer files")
    blobs: list[tuple[bytes, _ElfIdentity]] = []
    seen: dict[tuple[int, int, int], str] = {}
    for i, item in enumerate(elfs):
        if isinstance(item, (bytes, bytearray, memoryview)):
            label, file, data = f"input {i + 1} (bytes)", None, bytes(item)
        else:
            label = file = os.fspath(args.path(item, "ELF input"))
            try:
                data = Path(item).read_bytes()
            except OSError as exc:
                raise PyreeError(f"cannot read it: {exc.strerror}", file=file, fix="check the path") from None
        ident = _identity(data)
        if ident is None:
            what = "not an ELF file" if file else f"{label} is not an ELF file"
            raise PyreeError(what, file=file, fix="pass the ELF files built for each architecture (`pyree-build plugin --kind standalone --arch A -o A.so`)")
        key = (ident.machine, ident.word_size, ident.byte_order)
        if key in seen:
            rec = Record(ident.machine, ident.osabi, ident.osabi_version, ident.word_size, ident.byte_order, 0, 0)
            raise PyreeError(
                f"two ELF files for the same architecture {rec.label}: {seen[key]} and {label}",
                file=file,
                fix="pass one ELF per architecture; the runtime would only ever load the first",
            )
        seen[key] = label
        blobs.append((data, ident))

    table = bytearray(HEADER.pack(MAGIC, VERSION, len(blobs), 0))
    offset = _align(HEADER.size + RECORD.size * len(blobs))
    for data, ident in blobs:
        table += RECORD.pack(ident.machine, ident.osabi, ident.osabi_version, ident.word_size, ident.byte_order, 0, 0, offset, len(data))
        offset += _align(len(data))
    parts = [bytes(table), _pad(len(table))]
    for data, _ in blobs:
        parts += [data, _pad(len(data))]
    return b"".join(parts)


def write(output: PathLike, inputs: Sequence[ElfInput]) -> Path:
    """Pack `inputs` into the FatELF file `output`, atomically (a failure leaves no file)."""
    if isinstance(inputs, (str, os.PathLike, bytes, bytearray, memoryview)):
        inputs = [inputs]  # one file, never its characters
    (out,) = check_outputs([output], [i for i in inputs if isinstance(i, (str, os.PathLike))])
    data = pack(inputs)  # before touching the output, so a bad input leaves nothing behind
    with atomic_output(out) as tmp:
        tmp.write_bytes(data)
    return out


def parse(data: bytes, *, file: PathLike | None = None) -> list[Record]:
    """The records of the FatELF held in `data`; a PyreeError for anything malformed.

    Every check is a bound check on Python ints against len(data), so no offset or size,
    however large, leads to a read outside `data` or to a large allocation.
    """
    view = memoryview(data)
    count = _check_header(view, file)
    table_end = HEADER.size + RECORD.size * count
    if len(view) < table_end:
        raise _bad(f"truncated: the table of {count} records needs {table_end} bytes, the file has {len(view)}", file)
    records = [Record(m, oa, ov, ws, bo, off, size) for m, oa, ov, ws, bo, _, _, off, size in RECORD.iter_unpack(view[HEADER.size : table_end])]
    _check_placement(records, len(view), table_end, file)
    for i, rec in enumerate(records):
        _check_identity(view, i, rec, file)
    return records


def _bad(what: str, file: PathLike | None, fix: str = _FIX_REBUILD) -> PyreeError:
    return PyreeError(what, file=file, fix=fix)


def _check_header(view: memoryview, file: PathLike | None) -> int:
    """The record count of a well-formed header."""
    if len(view) < HEADER.size:
        if len(view) >= 4 and bytes(view[:4]) == _ELF_MAGIC:
            raise _bad(f"truncated: {len(view)} bytes; not a FatELF and too short for an ELF", file)
        raise _bad(f"truncated: {len(view)} bytes, shorter than the {HEADER.size}-byte FatELF header", file)
    magic, version, count, _ = HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        if bytes(view[:4]) == _ELF_MAGIC:
            raise _bad(
                "bad magic: this is a plain ELF file, not a FatELF", file,
                fix="pass it to the runtime directly (it loads plain ELFs too), or make a FatELF of it with `pyree-build fatelf join`",
            )  # fmt: skip
        raise _bad(f"bad magic 0x{magic:08X}: not a FatELF (it starts with 0x{MAGIC:08X})", file)
    if version != VERSION:
        raise _bad(f"unknown version {version} (only FatELF version {VERSION} is defined)", file)
    if count == 0:
        raise _bad("no records: the FatELF holds no ELF", file)
    return count


def _check_placement(records: list[Record], size: int, table_end: int, file: PathLike | None) -> None:
    """Every record lies after the table, inside the file, and apart from every other."""
    for i, rec in enumerate(records):
        where = f"record {i} ({rec.arch})"
        if rec.size == 0:
            raise _bad(f"{where} is empty (size 0)", file)
        if rec.end > size:
            raise _bad(f"{where} lies past the end of the file: bytes {rec.offset}..{rec.end}, but the file has {size}", file)
        if rec.offset < table_end:
            raise _bad(f"{where} overlaps the header and record table: it starts at {rec.offset}, the table ends at {table_end}", file)
    ordered = sorted(range(len(records)), key=lambda i: (records[i].offset, i))
    for a, b in zip(ordered, ordered[1:]):
        if records[b].offset < records[a].end:
            ra, rb = records[a], records[b]
            raise _bad(f"records {a} and {b} overlap: bytes {ra.offset}..{ra.end} and {rb.offset}..{rb.end}", file)


def _check_identity(view: memoryview, i: int, rec: Record, file: PathLike | None) -> None:
    """Record `i`'s bytes are an ELF whose machine, word size and byte order are the record's."""
    where = f"record {i} ({rec.arch})"
    ident = _identity(view[rec.offset : rec.offset + min(rec.size, 64)])
    if ident is None:
        raise _bad(f"{where}: its bytes at {rec.offset} are not an ELF file", file)
    wrong = []
    if ident.machine != rec.machine:
        wrong.append(f"machine {ident.machine} in the ELF, {rec.machine} in the record")
    if ident.word_size != rec.word_size:
        wrong.append(f"{32 if ident.word_size == WORD_SIZE_32 else 64}-bit ELF, word size {rec.word_size} in the record")
    if ident.byte_order != rec.byte_order:
        wrong.append(f"{'little' if ident.byte_order == BYTE_ORDER_LITTLE else 'big'}-endian ELF, byte order {rec.byte_order} in the record")
    if wrong:
        raise _bad(f"{where}: the ELF disagrees with its record: {'; '.join(wrong)}", file)


def _load(path: PathLike) -> tuple[Path, bytes, list[Record]]:
    """Read the file once, so records and bytes come from the same version of it."""
    p = require_file(path, "FatELF")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise PyreeError(f"cannot read it: {exc.strerror}", file=p, fix="check the path and its permissions") from None
    return p, data, parse(data, file=p)


def read(path: PathLike) -> list[Record]:
    """The records of the FatELF file at `path`, checked."""
    return _load(path)[2]


def describe(records: Sequence[Record]) -> str:
    """A table, one line per record: arch, class, byte order, offset, size."""
    lines = [f"{'arch':<12} {'class':<8} {'order':<8} {'offset':>10} {'size':>10}"]
    for rec in records:
        bits = f"{rec.bits}-bit" if rec.bits else f"size {rec.word_size}"
        lines.append(f"{rec.arch:<12} {bits:<8} {rec.endian:<8} {rec.offset:>10} {rec.size:>10}")
    return "\n".join(lines)


def _host_machine() -> int:
    arch = host_arch()
    if arch not in MACHINES:
        raise PyreeError(
            f"no FatELF machine known for this host ({platform.machine()})",
            fix=f"pass --arch (one of {', '.join(MACHINES)})",
        )
    return MACHINES[arch]


def select(path: PathLike, *, machine: int | None = None, word_size: int | None = None, byte_order: int | None = None) -> bytes:
    """The ELF bytes for `machine` (default: this host), picked as the runtime's loader does.

    Word size and byte order default to this Python's (the runtime is built for the same host).
    """
    p, data, records = _load(path)
    want_machine = _host_machine() if machine is None else machine
    want_word = word_size if word_size is not None else (WORD_SIZE_64 if sys.maxsize > 2**32 else WORD_SIZE_32)
    want_order = byte_order if byte_order is not None else (BYTE_ORDER_LITTLE if sys.byteorder == "little" else BYTE_ORDER_BIG)
    for rec in records:  # the first match wins, as in the loader
        if (rec.machine, rec.word_size, rec.byte_order) == (want_machine, want_word, want_order):
            return data[rec.offset : rec.end]
    wanted = Record(want_machine, 0, 0, want_word, want_order, 0, 0).label
    present = ", ".join(r.label for r in records)
    raise PyreeError(
        f"no ELF for {wanted} in it; it holds: {present}",
        file=p,
        fix=f"pick one of those with --arch, or rebuild it with that arch too (`pyree-build plugin --kind standalone --arch {wanted.split()[0]} ...`)",
    )


def split(path: PathLike, output_dir: PathLike) -> list[Path]:
    """Write each ELF of the FatELF to `output_dir/<stem>_<arch>.so`; return the paths."""
    p, data, records = _load(path)
    out_dir = args.path(output_dir, "output directory")
    outs: list[Path] = []
    for i, rec in enumerate(records):
        name = f"{p.stem}_{rec.arch.replace(' ', '_')}"
        if any(r.arch == rec.arch for r in records[:i]):
            name += f"_{i}"  # same arch twice (another word size or byte order): keep both
        outs.append(out_dir / f"{name}.so")
    check_outputs(outs, [p], output_dirs=[out_dir])  # every output, before the first is written
    with atomic_outputs(outs) as tmps:  # every part or none: a full disk must not leave 2 of 3
        for rec, tmp in zip(records, tmps):
            tmp.write_bytes(data[rec.offset : rec.end])
    return outs


# The `fatelf` verbs (llvm-cpu's Verb declarations): paths and words in, what to show out.


def join_files(inputs: Sequence[ElfInput], output: PathLike) -> Path:
    """`fatelf join`: pack `inputs` into the FatELF `output`."""
    return write(output, inputs)


def listing(input: PathLike) -> str:  # noqa: A002 - the verb's option
    """`fatelf list`: one line per record."""
    return describe(read(input))


def select_file(input: PathLike, output: PathLike, arch: str | None = None) -> Path:  # noqa: A002 - the verb's option
    """`fatelf select`: write the ELF for this host (or `arch`) to `output`."""
    check_outputs([output], [input])
    data = select(input, machine=None if not arch else machine_for_arch(normalize_arch(arch)))
    with atomic_output(output) as tmp:
        tmp.write_bytes(data)
    return Path(output)
