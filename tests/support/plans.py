"""Shared by the tests: plan_files (once in test_client_plans.py)."""

from __future__ import annotations

import os
from pathlib import Path

from pyree_build.client import plans


def plan_files(runtime: Path) -> list[str]:
    directory = runtime / "pyree_build" / plans.PLANS_DIR  # plans.plans_dir() in the test's runtime
    return sorted(n for n in os.listdir(directory) if not n.startswith(plans.CODE_FILE)) if directory.is_dir() else []
