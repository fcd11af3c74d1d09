"""The content-addressed cache: hits, misses on any input change (headers included), the
cache verb, and the cache being optional."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import PLUGIN_SAMPLE
from support.plugins import write_plugin


def build(src: Path, out: Path, cache: Path | str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYREE_BUILD_CACHE=str(cache))
    return subprocess.run(
        [sys.executable, "-m", "pyree_build", "plugin", src, "-I", src.parent / "include", "-o", out, *extra],
        env=env, capture_output=True, text=True,
    )  # fmt: skip


def test_second_build_is_a_hit_and_an_edited_header_is_a_miss(tmp_path):
    cache = tmp_path / "cache"
    src = write_plugin(tmp_path / "src", "3.0f")
    first = build(src, tmp_path / "a.so", cache)
    assert first.returncode == 0 and "cache hit" not in first.stderr, first.stderr
    second = build(src, tmp_path / "b.so", cache)
    assert second.returncode == 0 and "cache hit" in second.stderr, second.stderr
    assert (tmp_path / "a.so").read_bytes() == (tmp_path / "b.so").read_bytes()

    (src.parent / "include" / "scale.h").write_text("#define SCALE 5.0f\n")  # only the header changes
    third = build(src, tmp_path / "c.so", cache)
    assert third.returncode == 0 and "cache hit" not in third.stderr, third.stderr
    assert (tmp_path / "c.so").read_bytes() != (tmp_path / "a.so").read_bytes()

    (src.parent / "include" / "scale.h").write_text("#define SCALE 3.0f\n")  # back: the first entry again
    fourth = build(src, tmp_path / "d.so", cache)
    assert "cache hit" in fourth.stderr
    assert (tmp_path / "d.so").read_bytes() == (tmp_path / "a.so").read_bytes()


def test_a_flag_change_is_a_miss(tmp_path):
    cache = tmp_path / "cache"
    src = write_plugin(tmp_path / "src", "3.0f")
    assert build(src, tmp_path / "a.so", cache).returncode == 0
    other = build(src, tmp_path / "b.so", cache, "-D", "UNUSED=1")
    assert other.returncode == 0 and "cache hit" not in other.stderr


def test_cache_off_never_stores(tmp_path):
    src = write_plugin(tmp_path / "src", "3.0f")
    for name in ("a.so", "b.so"):
        result = build(src, tmp_path / name, "off")
        assert result.returncode == 0 and "cache hit" not in result.stderr


def test_cache_info_and_clear(cli, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PYREE_BUILD_CACHE", str(cache))
    assert cli("plugin", PLUGIN_SAMPLE / "system_plugin.c", "-o", tmp_path / "p.so").returncode == 0
    info = cli("cache", "info")
    assert info.returncode == 0 and str(cache) in info.stdout and "entries: 1" in info.stdout, info
    cleared = cli("cache", "clear")
    assert cleared.returncode == 0 and "removed 1 entries" in cleared.stdout
    assert "entries: 0" in cli("cache", "info").stdout
    monkeypatch.setenv("PYREE_BUILD_CACHE", "off")
    assert "cache: off" in cli("cache", "info").stdout


def test_a_dependency_remembered_by_its_stat_is_not_hashed_again_and_any_write_still_misses(tmp_path, monkeypatch):
    """The inode cache of dependency hashes: a hit trusts a header's remembered hash while its
    stat is unchanged (so it is not read again), and an edit of the same size with its mtime set
    back still misses: the write moved its ctime, which nothing can set back."""
    import time

    from pyree_build.cache import local
    from pyree_build.cli import main

    cache = tmp_path / "cache"
    src = write_plugin(tmp_path / "src", "3.0f")
    header = src.parent / "include" / "scale.h"
    time.sleep(2.1)  # only a file unchanged for two seconds is remembered
    monkeypatch.setenv("PYREE_BUILD_CACHE", str(cache))
    args = ["plugin", str(src), "-I", str(src.parent / "include")]
    assert main([*args, "-o", str(tmp_path / "a.so")]) == 0
    assert main([*args, "-o", str(tmp_path / "b.so")]) == 0  # a hit: hashes every dependency, remembers them
    hashed: list[str] = []
    real = local.hash_file
    monkeypatch.setattr(local, "hash_file", lambda path: hashed.append(str(path)) or real(path))
    assert main([*args, "-o", str(tmp_path / "c.so")]) == 0
    assert str(header) not in hashed and len(hashed) <= 3, hashed  # the source (keyed before the lookup) and the output copy
    assert (tmp_path / "c.so").read_bytes() == (tmp_path / "a.so").read_bytes()

    before = header.stat()
    header.write_text("#define SCALE 5.0f\n")  # the same size
    os.utime(header, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert header.stat().st_size == before.st_size and header.stat().st_mtime_ns == before.st_mtime_ns
    hashed.clear()
    assert main([*args, "-o", str(tmp_path / "d.so")]) == 0
    assert str(header) in hashed
    assert (tmp_path / "d.so").read_bytes() != (tmp_path / "a.so").read_bytes()
