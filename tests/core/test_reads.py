"""core/reads.py: what a scope read, recorded where it is opened, in the forms pyree_build reads files."""

from __future__ import annotations

import os
import tempfile

import numpy as np

from pyree_build.core import reads


def test_every_form_of_open_is_recorded_as_named_and_where_it_leads(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(2, np.float32))
    np.zeros(2, np.float32).tofile(tmp_path / "b.bin")
    (tmp_path / "c.txt").write_text("c")
    (tmp_path / "link.bin").symlink_to(tmp_path / "b.bin")
    outside = tmp_path / "outside.txt"
    outside.write_text("o")
    with reads.recording() as read:
        np.load(tmp_path / "a.npy")
        np.fromfile(str(tmp_path / "link.bin"), dtype=np.float32)
        (tmp_path / "c.txt").read_text()
        os.close(os.open(os.fsencode(tmp_path / "c.txt"), os.O_RDONLY))
    outside.read_text()  # after the scope: not recorded
    assert list(read.paths) == [str(tmp_path / "a.npy"), str(tmp_path / "link.bin"), str(tmp_path / "b.bin"), str(tmp_path / "c.txt")]
    assert read.complete


def test_what_the_scope_made_its_own_directories_and_imports_are_not_inputs(tmp_path):
    own = tmp_path / "cache"
    own.mkdir()
    (own / "fact.json").write_text("{}")
    with reads.recording(own=[own]) as read:
        with tempfile.TemporaryDirectory(dir=tmp_path) as made:
            (tmp_path / "out.txt").write_text("written here")
            (tmp_path / "out.txt").read_text()
            open(os.path.join(made, "r"), "w").close()
            os.listdir(made)
            open(os.path.join(made, "r")).close()
        (own / "fact.json").read_text()
        import json.tool  # noqa: F401  (an import reads and lists sys.path: code, not input)
    assert read.paths == {} and read.complete, (read.paths, read.unrecordable)


def test_a_listed_directory_makes_the_record_incomplete_and_note_records_a_tool_read(tmp_path):
    (tmp_path / "x").write_text("x")
    with reads.recording() as read:
        os.listdir(tmp_path)
        reads.note(tmp_path / "x", "relative")
    assert not read.complete and str(tmp_path) in (read.unrecordable or "")
    assert list(read.paths) == [str(tmp_path / "x"), os.path.abspath("relative")]
    with reads.recording() as read:
        reads.note("/proc/cpuinfo")
    assert not read.complete


def test_the_kernels_reports_are_never_inputs_listed_or_read():
    """Process control lists /proc around every tool (whose pipes are held by whom): that is no
    input of the command, and a plan must still be written after it."""
    with reads.recording() as read:
        os.listdir("/proc")
        list(os.scandir("/proc/self"))
        with open("/proc/self/stat") as f:
            f.read()
    assert read.complete, read.unrecordable
    assert list(read.paths) == []


def test_a_tools_version_looked_up_on_the_search_path_is_no_input(tmp_path):
    """Finding iree-base-runtime's version lists every directory on sys.path: with that
    counted as a listing, no plan was ever written where the lookup was not yet memoized."""
    from pyree_build.core import toolchain

    toolchain._dist_version_on.cache_clear()
    with reads.recording() as read:
        toolchain._dist_version("iree-base-runtime")
        with reads.paused():
            os.listdir(tmp_path)
        (tmp_path / "after.txt").write_text("a")
        (tmp_path / "after.txt").read_text()
    assert read.complete, read.unrecordable
    assert list(read.paths) == []  # written in the scope: its own


def test_threads_pausing_and_recording_in_every_interleaving_keep_each_scope(tmp_path):
    # tune's workers record and pause at once: a pause in one thread must neither drop a
    # scope another thread opened meanwhile (its close failed: "x not in list") nor silence
    # that thread's reads. Each step of the two threads is forced in turn, in every order.
    import itertools
    import threading

    wanted = tmp_path / "input.txt"
    wanted.write_text("x", encoding="utf-8")
    version = tmp_path / "version.txt"
    version.write_text("v", encoding="utf-8")

    def pauser(steps: list[threading.Event], done: list[threading.Event]) -> None:
        steps[0].wait()
        with reads.paused():
            done[0].set()
            steps[1].wait()
            open(version, encoding="utf-8").close()
            done[1].set()
            steps[2].wait()
        done[2].set()

    orders = set(itertools.permutations("PPPRRR"))
    assert orders
    for order in sorted(orders):
        steps = {who: [threading.Event() for _ in range(3)] for who in "PR"}
        done = {who: [threading.Event() for _ in range(3)] for who in "PR"}
        got: dict[str, reads.Reads] = {}

        def recorder(steps: list[threading.Event], done: list[threading.Event], got: dict[str, reads.Reads]) -> None:
            steps[0].wait()
            with reads.recording() as scope:
                done[0].set()
                steps[1].wait()
                open(wanted, encoding="utf-8").close()
                done[1].set()
                steps[2].wait()
            got["scope"] = scope
            done[2].set()

        threads = [
            threading.Thread(target=pauser, args=(steps["P"], done["P"])),
            threading.Thread(target=recorder, args=(steps["R"], done["R"], got)),
        ]
        for thread in threads:
            thread.start()
        taken = {"P": 0, "R": 0}
        for who in order:
            steps[who][taken[who]].set()
            assert done[who][taken[who]].wait(10), (order, who)
            taken[who] += 1
        for thread in threads:
            thread.join(10)
        scope = got["scope"]
        assert str(wanted) in scope.paths, order
        assert str(version) not in scope.paths, order
    assert not reads._ACTIVE


def test_a_hash_noted_for_a_written_file_follows_it_through_a_rename_and_no_further_than_its_bytes(tmp_path):
    # The cache hashes an output's private file once and the output manifest reuses that hash
    # after the rename (the same inode, size and time); a change of size or time is read again.
    import hashlib

    from pyree_build.core import readers

    private, final = tmp_path / ".out.private", tmp_path / "out.bin"
    private.write_bytes(b"weights" * 1000)
    noted = "0" * 64  # not the bytes' hash: proves the answer came from the note
    readers.note_written_hash(private, noted)
    os.rename(private, final)
    assert readers.sha256_of_written(final) == noted
    st = final.stat()
    os.utime(final, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # same size, another time
    assert readers.sha256_of_written(final) == hashlib.sha256(b"weights" * 1000).hexdigest()
    readers.note_written_hash(final, noted)
    with open(final, "ab") as f:
        f.write(b"!")
    assert readers.sha256_of_written(final) == hashlib.sha256(b"weights" * 1000 + b"!").hexdigest()
    assert readers.sha256_of_written(tmp_path / "absent") is None
