"""The test suite never builds into, nor reads from, a cache the user set up (issue 44, item 11)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _suite_settings(env: dict[str, str]) -> tuple[str, str]:
    """The cache and the remote-cache settings a test session has after conftest's set-up."""
    probe = "import os, sys; sys.path.insert(0, sys.argv[1]); import conftest; print(os.environ['PYREE_BUILD_CACHE']); print(sorted(n for n in os.environ if n.startswith('PYREE_BUILD_REMOTE')))"
    out = subprocess.run([sys.executable, "-c", probe, str(TESTS)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cache, remote = out.stdout.splitlines()
    return cache, remote


def _users_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith(("PYREE_TEST_", "PYREE_BUILD_"))}


def test_a_users_caches_never_serve_the_suite(tmp_path: Path) -> None:
    user_cache = tmp_path / "user-cache"
    user_cache.mkdir()
    env = _users_environment()
    env.update(PYREE_BUILD_CACHE=str(user_cache), PYREE_BUILD_REMOTE_CACHE="http://127.0.0.1:9/users-team-cache", PYREE_BUILD_REMOTE_CACHE_MODE="read")
    cache, remote = _suite_settings(env)
    assert Path(cache) != user_cache and Path(cache).name.startswith("pyree-test-cache."), cache
    assert remote == "[]"
    assert not any(user_cache.iterdir())


def test_without_a_users_cache_the_suite_still_has_its_own() -> None:
    cache, _ = _suite_settings(_users_environment())
    assert Path(cache).name.startswith("pyree-test-cache."), cache


def test_a_pytest_started_by_a_test_shares_its_parents_cache() -> None:
    assert _suite_settings(dict(os.environ))[0] == os.environ["PYREE_BUILD_CACHE"]
