"""Copy a forked worker's memory while it waits for a client, not while it serves one.

A worker is forked from the server and shares its pages copy-on-write; the first write to a
page (Python writes on every reference it takes) copies it then, at ~3 us a page in a VM. A
command touches ~1,300 such pages: ~4 ms of each request. The spare worker has nothing to do
until a client connects, so it copies those pages ahead (MADV_POPULATE_WRITE, which copies a
page as a write would and changes nothing in it) and stops the moment a client is waiting.

Which pages: the ones workers wrote before. A worker, once its client has the exit code,
lists the pages it holds alone (/proc/self/pagemap's exclusive bit: copied on its writes) and
tells the server (`learned`), whose next spares copy those first. Until a worker has reported,
a spare copies every resident writable page it can before its client comes. Only pages present
in the server are ever copied (never memory it reserved and did not use).

Linux >= 5.14 (4.2 for the learning); elsewhere, or where /proc/self/pagemap cannot be read,
nothing is done and workers copy on write as before.
"""

from __future__ import annotations

import array
import ctypes
import itertools
import os
from collections.abc import Callable, Iterable, Iterator

from pyree_build.core import lazy, libc

# Loaded by the server before it forks (startup.preload; not at this module's import, which comes
# before the server holds BLAS to one thread): a scan costs ~0.1 ms, where a Python loop took ~2.
numpy = lazy.module("numpy")

_MADV_POPULATE_WRITE = 23
_PAGE = os.sysconf("SC_PAGE_SIZE")
_SLICE_PAGES = 64  # ~0.2 ms of copying between two looks for a waiting client
_PRESENT = 1 << 63
_EXCLUSIVE = 1 << 56  # mapped by this process alone: for a forked worker, copied since the fork
MAX_LEARNED = 1 << 12  # pages (16 MiB): what a spare copies ahead at most (a `run` writes ~2,000)


def _madvise() -> Callable[..., int] | None:
    madvise = libc.function("madvise")
    if madvise is not None:
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]  # type: ignore[attr-defined]  # addresses above 2**31
    return madvise


def _pages(flags: int) -> list[int]:
    """The page numbers of this process's private writable memory (the heap, Python's arenas,
    libraries' data) whose pagemap entry has every bit of `flags`."""
    found: list[int] = []
    with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
        for line in maps:
            fields = line.split()
            if fields[1] != "rw-p":
                continue
            start, _, end = fields[0].partition("-")
            first, last = int(start, 16) // _PAGE, int(end, 16) // _PAGE
            entries = numpy.frombuffer(os.pread(pagemap.fileno(), (last - first) * 8, first * 8), dtype=numpy.uint64)
            found += (first + numpy.flatnonzero(entries & numpy.uint64(flags) == flags)).tolist()
    return found


def resident() -> list[int]:
    return _pages(_PRESENT)


def written_since_fork() -> list[int]:
    """In a forked worker: the pages it copied (and the ones it allocated itself)."""
    try:
        return _pages(_PRESENT | _EXCLUSIVE)
    except OSError:
        return []


def _runs(pages: Iterable[int]) -> Iterator[tuple[int, int]]:
    """(first page, count) of each run of consecutive pages, at most _SLICE_PAGES long."""
    first = count = 0
    for page in sorted(pages):
        if count and page == first + count and count < _SLICE_PAGES:
            count += 1
            continue
        if count:
            yield first, count
        first, count = page, 1
    if count:
        yield first, count


def copy_ahead(learned: frozenset[int], wanted: Callable[[], bool]) -> set[int]:
    """Copy the `learned` pages (every resident writable page if none are learned yet), a
    slice at a time, until done or `wanted()` (a client is waiting). Returns the pages copied.

    A learned page the server does not have was allocated by a worker (its heap grew): the
    spare gets it now, zeroed, where its own command will likely allocate too."""
    madvise = _madvise()
    if madvise is None:
        return set()
    try:
        pages = learned or resident()
    except OSError:
        return set()
    copied: set[int] = set()
    for first, count in _runs(pages):
        if wanted():
            break
        if madvise(first * _PAGE, count * _PAGE, _MADV_POPULATE_WRITE) == 0:  # else: a kernel without it, or a mapping it cannot copy
            copied.update(range(first, first + count))
    return copied


def learn(learned: dict[int, None], reported: Iterable[int], limit: int = MAX_LEARNED) -> int:
    """Add the pages a worker reported to `learned` (kept in the order they were last
    reported) and drop the oldest beyond `limit`; return how many were new. The set was a
    union that only grew, until every spare copied 30 MB ahead (7,665 pages after a few
    thousand commands of every verb) and freed it again at its exit. A page every command
    writes is copied ahead, so never reported again, and ages out only when other pages keep
    coming: a worker then writes it, reports it, and it is learned again."""
    new = 0
    for page in reported:
        new += page not in learned
        learned.pop(page, None)
        learned[page] = None
    for page in list(itertools.islice(learned, max(0, len(learned) - limit))):
        del learned[page]
    return new


def encode(pages: Iterable[int]) -> bytes:
    return array.array("Q", pages).tobytes()


def decode(data: bytes) -> list[int]:
    pages = array.array("Q")
    pages.frombytes(data[: len(data) - len(data) % 8])
    return list(pages)
