"""FatELF: pack/read/select/split, the CLI verbs, every malformed container, and fuzzing."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from conftest import PLUGIN_SAMPLE, assert_clean_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyree_build.backends.llvm_cpu import fatelf
from pyree_build.backends.llvm_cpu.elf import host_arch
from pyree_build.core.errors import PyreeError

ARCHES = ("x86_64", "aarch64", "riscv64")
# Bounded by default (the whole file stays well under 20 s); PYREE_FUZZ_EXAMPLES=100000 for a long run.
EXAMPLES = int(os.environ.get("PYREE_FUZZ_EXAMPLES", "3000"))


@pytest.fixture(scope="module")
def elfs(tmp_path_factory) -> dict[str, Path]:
    from conftest import run_cli

    d = tmp_path_factory.mktemp("fatelf_parts")
    out = {}
    for arch in ARCHES:
        out[arch] = d / f"p_{arch}.so"
        result = run_cli("plugin", "--kind", "standalone", "--arch", arch, PLUGIN_SAMPLE / "standalone_plugin.c", "-o", out[arch])
        assert result.returncode == 0, result
    return out


@pytest.fixture
def fat(elfs, tmp_path) -> Path:
    return fatelf.write(tmp_path / "p.sos", [elfs[a] for a in ARCHES])


def fake_elf(machine: int, *, bits: int = 64, little: bool = True, size: int = 64) -> bytes:
    """Just an ELF header: enough for the FatELF reader, which checks the identity only."""
    ident = b"\x7fELF" + bytes([2 if bits == 64 else 1, 1 if little else 2, 1, 0, 0]) + b"\0" * 7
    return (ident + struct.pack("<HH" if little else ">HH", 3, machine)).ljust(size, b"\0")


def test_round_trip_gives_identical_bytes_page_aligned(elfs, fat, tmp_path):
    records = fatelf.read(fat)
    assert [r.arch for r in records] == list(ARCHES)
    assert all(r.offset % 4096 == 0 and r.bits == 64 and r.endian == "little" for r in records)
    parts = fatelf.split(fat, tmp_path / "parts")
    for arch, part in zip(ARCHES, parts):
        assert part.name == f"p_{arch}.so"
        assert part.read_bytes() == elfs[arch].read_bytes()


def test_select_picks_the_hosts_elf(elfs, fat):
    assert fatelf.select(fat) == elfs[host_arch()].read_bytes()
    assert fatelf.select(fat, machine=fatelf.machine_for_arch("riscv_64")) == elfs["riscv64"].read_bytes()


def test_cli_join_list_split_select(cli, elfs, tmp_path):
    sos = tmp_path / "cli.sos"
    assert cli("fatelf", "join", *(elfs[a] for a in ARCHES), "-o", sos).returncode == 0
    listing = cli("fatelf", "list", sos)
    assert listing.returncode == 0
    for arch in ARCHES:
        assert arch in listing.stdout
    assert "4096" in listing.stdout
    assert cli("fatelf", "split", sos, "-o", tmp_path / "parts").returncode == 0
    assert (tmp_path / "parts" / "cli_aarch64.so").read_bytes() == elfs["aarch64"].read_bytes()
    assert cli("fatelf", "select", sos, "--arch", "riscv64", "-o", tmp_path / "rv.so").returncode == 0
    assert (tmp_path / "rv.so").read_bytes() == elfs["riscv64"].read_bytes()


def test_pack_rejects_non_elf_and_duplicate_arch(elfs, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(PyreeError, match="not an ELF"):
        fatelf.pack([elfs["x86_64"], text])
    with pytest.raises(PyreeError, match="same architecture") as err:
        fatelf.pack([elfs["x86_64"], elfs["aarch64"], elfs["x86_64"]])
    assert str(err.value.what).count(str(elfs["x86_64"])) == 2  # both files are named
    with pytest.raises(PyreeError, match="no ELF files"):
        fatelf.pack([])
    with pytest.raises(PyreeError, match="at most 255"):
        fatelf.pack([fake_elf(m) for m in range(256)])
    with pytest.raises(PyreeError, match="input 2 .*not an ELF"):
        fatelf.pack([X86, b"\x7fELF"])  # a bare magic is not an ELF header


def test_cli_join_refuses_bad_inputs_and_writes_nothing(cli, elfs, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    out = tmp_path / "x.sos"
    assert_clean_error(cli("fatelf", "join", elfs["x86_64"], text, "-o", out), "not an ELF", str(text))
    assert_clean_error(cli("fatelf", "join", elfs["x86_64"], elfs["x86_64"], "-o", out), "same architecture")
    assert not out.exists()


def _header(count: int, *, magic: int = fatelf.MAGIC, version: int = 1) -> bytes:
    return struct.pack("<IHBB", magic, version, count, 0)


def _record(machine: int, offset: int, size: int, *, word: int = 2, order: int = 1) -> bytes:
    return struct.pack("<HBBBBBBQQ", machine, 0, 0, word, order, 0, 0, offset, size)


def _container(*records: bytes, body: dict[int, bytes]) -> bytes:
    data = bytearray(_header(len(records)) + b"".join(records))
    for offset, blob in body.items():
        data += b"\0" * (offset - len(data)) if offset > len(data) else b""
        data[offset : offset + len(blob)] = blob
    return bytes(data)


X86, ARM = fake_elf(62), fake_elf(183)
MALFORMED = {
    "bad magic": _header(1, magic=0xDEADBEEF) + _record(62, 4096, 64),
    "plain ELF file": X86,
    "unknown version": _header(1, version=7) + _record(62, 4096, 64),
    "no records": _header(0),
    "truncated": _header(2) + _record(62, 4096, 64),
    "past the end": _container(_record(62, 4096, 9999), body={4096: X86}),
    "overlap": _container(_record(62, 4096, 128), _record(183, 4096 + 64, 64), body={4096: X86, 4160: ARM}),
    "not an ELF": _container(_record(62, 4096, 64), body={4096: b"MZ" + b"\0" * 62}),
    "disagrees": _container(_record(183, 4096, 64), body={4096: X86}),
    "size 0": _container(_record(62, 4096, 0), body={4096: X86}),
    "overlaps the header and record table": _header(1) + _record(62, 8, 64) + X86,
}


@pytest.mark.parametrize("fragment", list(MALFORMED))
def test_each_malformed_container_has_its_own_message(cli, tmp_path, fragment):
    path = tmp_path / "bad.sos"
    path.write_bytes(MALFORMED[fragment])
    with pytest.raises(PyreeError, match=fragment):
        fatelf.parse(MALFORMED[fragment])
    assert_clean_error(cli("fatelf", "list", path), fragment, str(path))


def test_encoding_matches_irees_fatelf_h(elfs):
    """IREE's byte order is MSB = 0, LSB = 1 (not ELF's EI_DATA 2/1); word size is EI_CLASS."""
    data = fatelf.pack([elfs["x86_64"], fake_elf(243, bits=32), fake_elf(62, little=False)])
    magic, version, count, reserved = struct.unpack_from("<IHBB", data)
    assert (magic, version, count, reserved) == (0x1F0E70FA, 1, 3, 0)
    rows = [struct.unpack_from("<HBBBBBBQQ", data, 8 + 24 * i) for i in range(3)]
    assert [(r[0], r[3], r[4]) for r in rows] == [(62, 2, 1), (243, 1, 1), (62, 2, 0)]
    records = fatelf.parse(data)
    assert [r.label for r in records] == ["x86_64 (64-bit little-endian)", "riscv32 (32-bit little-endian)", "x86_64 (64-bit big-endian)"]
    assert all(r.offset % 4096 == 0 for r in records)


def test_select_names_what_the_fatelf_holds(cli, elfs, tmp_path):
    sos = fatelf.write(tmp_path / "two.sos", [elfs["x86_64"], elfs["aarch64"]])
    with pytest.raises(PyreeError, match=r"no ELF for riscv64 .*holds: x86_64 \(64-bit little-endian\), aarch64"):
        fatelf.select(sos, machine=243)
    with pytest.raises(PyreeError, match="no ELF for x86_64 \\(32-bit"):
        fatelf.select(sos, machine=62, word_size=fatelf.WORD_SIZE_32)
    assert_clean_error(cli("fatelf", "select", sos, "--arch", "riscv_64", "-o", tmp_path / "rv.so"), "no ELF for riscv64", "aarch64")
    assert not (tmp_path / "rv.so").exists()
    assert_clean_error(cli("fatelf", "select", sos, "--arch", "mips", "-o", tmp_path / "m.so"), "unknown architecture 'mips'")
    assert_clean_error(cli("fatelf", "list", tmp_path / "missing.sos"), "FatELF not found")


def test_a_record_whose_class_or_byte_order_disagrees(tmp_path):
    as_32 = _container(_record(62, 4096, 64, word=1), body={4096: X86})
    with pytest.raises(PyreeError, match="disagrees.*32-bit|disagrees.*word size"):
        fatelf.parse(as_32)
    big = _container(_record(62, 4096, 64, order=1), body={4096: fake_elf(62, little=False)})
    with pytest.raises(PyreeError, match="disagrees.*big-endian"):
        fatelf.parse(big)


def test_the_runtime_loads_our_fatelf(cli, fat, system_module):
    result = cli("run", system_module, "--function", "mixed_invocation", "--input", "8xf32=2", "--input", "8xf32=4",
                 "--plugin", fat, "--expect", "8xf32=12 12 12 12 12 12 12 12")  # fmt: skip
    assert result.returncode == 0, result


FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _check_parse(data: bytes) -> None:
    try:
        records = fatelf.parse(data)
    except PyreeError as err:
        assert err.what and err.fix
        return
    # Accepted: every ELF lies inside the data, after the table, apart from the others.
    table_end = 8 + 24 * len(records)
    spans = sorted((rec.offset, rec.end) for rec in records)
    for start, end in spans:
        assert table_end <= start < end <= len(data)
    for (_, end_a), (start_b, _) in zip(spans, spans[1:]):
        assert end_a <= start_b


@FUZZ
@given(st.binary(max_size=4096))
def test_fuzz_arbitrary_bytes(data):
    _check_parse(data)


VALID = fatelf.pack([X86, ARM, fake_elf(243)])


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=12), st.integers(0, len(VALID)))
def test_fuzz_mutations_of_a_valid_container(flips, cut):
    data = bytearray(VALID)
    for index, value in flips:
        data[index] = value
    _check_parse(bytes(data[:cut] if cut % 3 == 0 else data))


@FUZZ
@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 255))
def test_fuzz_huge_offsets_and_sizes_never_read_out_of_bounds(offset, size, count):
    data = _header(max(count, 1)) + _record(62, offset, size) * max(count, 1)
    _check_parse(data + b"\0" * 64)
