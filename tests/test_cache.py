"""The content-addressed cache: hits, misses on any input change (headers included), the
cache verb, and the cache being optional."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import PLUGIN_SAMPLE


def build(src: Path, out: Path, cache: Path | str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYREE_BUILD_CACHE=str(cache))
    return subprocess.run(
        [sys.executable, "-m", "pyree_build", "plugin", src, "-I", src.parent / "include", "-o", out, *extra],
        env=env, capture_output=True, text=True,
    )  # fmt: skip


def write_plugin(root: Path, scale: str) -> Path:
    from test_cmake import DOWNSTREAM_PLUGIN

    (root / "include").mkdir(parents=True, exist_ok=True)
    (root / "include" / "scale.h").write_text(f"#define SCALE {scale}\n")
    (root / "plugin.c").write_text(DOWNSTREAM_PLUGIN)
    return root / "plugin.c"


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
