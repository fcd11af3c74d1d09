"""Shared by the tests: write_plugin (once in test_cache.py)."""

from __future__ import annotations

from pathlib import Path


def write_plugin(root: Path, scale: str) -> Path:
    from support.cmake_projects import DOWNSTREAM_PLUGIN

    (root / "include").mkdir(parents=True, exist_ok=True)
    (root / "include" / "scale.h").write_text(f"#define SCALE {scale}\n")
    (root / "plugin.c").write_text(DOWNSTREAM_PLUGIN)
    return root / "plugin.c"
