"""The READMEs are executable truth: every ```sh / ```bash / ```python block of README.md, of
every page of docs/, of each sample's README and of the README `pyree-build new` writes runs, in
order, in a scratch copy of the checkout, and must exit 0 and print what it claims. The README and
the reference pages of docs/ (REFERENCE_PAGES: cli.md, python.md, ...) run from the checkout's
root, one after another, as one document split in pages; the walk-throughs (WALKTHROUGHS) run in
docs/, each sample's README in its sample's directory.

Conventions inside a block (visible in the README on purpose):
  `# readme-test: skip (REASON)`  the block is reported as skipped with REASON;
  `# readme-test: needs WHAT`     skipped unless WHAT is available here (see NEEDS);
  `# => TEXT`                     the block's output must contain TEXT (`...` matches anything).
Blocks of other languages (cmake, tables) are fragments, not commands, and are not run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO

RUNNABLE = {"sh": "bash", "bash": "bash", "shell": "bash", "python": "python"}
MARKER = re.compile(r"^\s*#\s*readme-test:\s*(skip|needs)\s*(.*?)\s*$")
CLAIM = re.compile(r"^\s*#\s*=>\s?(.*)$")


@dataclass
class Block:
    readme: Path  # relative to the checkout
    line: int
    language: str
    code: str
    cwd: Path | None = None  # where it runs, relative to the checkout; None: the page's directory

    @property
    def directory(self) -> Path:
        return self.readme.parent if self.cwd is None else self.cwd

    @property
    def id(self) -> str:
        return f"{self.readme}:{self.line}"

    def markers(self) -> list[tuple[str, str]]:
        return [(m.group(1), m.group(2)) for m in map(MARKER.match, self.code.splitlines()) if m]

    def claims(self) -> list[str]:
        return [m.group(1).strip() for m in map(CLAIM.match, self.code.splitlines()) if m]


def extract(text: str, readme: Path, cwd: Path | None = None) -> list[Block]:
    blocks, inside, start, lang, lines = [], False, 0, "", []
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^```\s*([\w+-]*)", line)
        if fence and not inside:
            inside, start, lang, lines = True, number, fence.group(1).lower(), []
        elif line.startswith("```") and inside:
            inside = False
            if lang in RUNNABLE:
                blocks.append(Block(readme, start, RUNNABLE[lang], "\n".join(lines) + "\n", cwd))
        elif inside:
            lines.append(line)
    return blocks


def _have_tool(finder: Callable[[], object]) -> Callable[[], bool]:
    def check() -> bool:
        from pyree_build.core.errors import PyreeError

        try:
            finder()
            return True
        except PyreeError:
            return False

    return check


def _installed_wheel() -> bool:
    from pyree_build.cli import cmake_dir

    return "site-packages" in str(cmake_dir())


def _cuda_gpu() -> bool:
    from pyree_build.backends.cuda.target import cuda_status

    return cuda_status()[0]


def _vulkan_device() -> bool:
    from pyree_build.backends.vulkan.devices import status

    return status()[0]


def _importable(*modules: str) -> Callable[[], bool]:
    import importlib.util

    return lambda: all(importlib.util.find_spec(m) is not None for m in modules)


def _needs() -> dict[str, Callable[[], bool]]:
    from pyree_build.core import toolchain

    return {
        "nvcc": _have_tool(toolchain.nvcc),
        "ptxas": _have_tool(toolchain.ptxas),
        "nvrtc": _have_tool(toolchain.nvrtc),
        "glslang": _have_tool(lambda: (toolchain.glsl_compiler(), toolchain.spirv_val())),
        "a CUDA GPU": _cuda_gpu,
        "a Vulkan device": _vulkan_device,
        "pyree_build installed from a wheel": _installed_wheel,
        "onnx": _importable("onnx", "onnxruntime"),
        "torch": _importable("torch", "iree.turbine"),
        "torch.onnx": _importable("torch", "onnxscript", "onnx", "onnxruntime"),
    }


def skip_reason(block: Block) -> str | None:
    needs = _needs()
    for kind, what in block.markers():
        if kind == "skip":
            return what.strip("() ") or "marked skip"
        label = what.split("(")[0].strip()
        if label not in needs:
            raise AssertionError(f"{block.id}: unknown `readme-test: needs {what}`; known: {', '.join(needs)}")
        if not needs[label]():
            return f"needs {what}"
    return None


def check_claims(block: Block, output: str) -> None:
    for claim in block.claims():
        pattern = ".*?".join(re.escape(part.strip()) for part in claim.split("..."))
        assert re.search(pattern, output, re.S), f"{block.id}: the README claims output {claim!r}; got:\n{output[-3000:]}"


def _environment(scratch: Path) -> dict[str, str]:
    """`pyree-build`, `python` and `pip` as a user of this checkout has them; a private cache."""
    bin_dir = scratch / ".readme-bin"
    bin_dir.mkdir(exist_ok=True)
    for name, command in (("pyree-build", f'"{sys.executable}" -m pyree_build'), ("python", f'"{sys.executable}"'),
                          ("python3", f'"{sys.executable}"'), ("pip", f'"{sys.executable}" -m pip')):  # fmt: skip
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        script.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    if not _installed_wheel():
        # A checkout on PYTHONPATH: CMake's search for "the Python with pyree_build" could
        # settle on another interpreter that sees it too, so name this one (as documented).
        env["PYTHONPATH"] = str(scratch) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYREE_BUILD_PYTHON"] = sys.executable
    env["PYREE_BUILD_CACHE"] = str(scratch / ".readme-cache")
    return env


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> None:
    reason = skip_reason(block)
    if reason:
        pytest.skip(f"{block.id}: {reason}")
    if block.language == "bash":
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    else:
        argv = [sys.executable, "-c", block.code]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{block.id} failed (exit {proc.returncode}):\n{block.code}\n--- output ---\n{output[-4000:]}"
    check_claims(block, output)


# Pages of docs/ that continue the README: their blocks run from the checkout's root, after the
# README's, in this order (python.md reads build/onnx/mlp.onnx, which cli.md's import block writes).
REFERENCE_PAGES = ("cli.md", "python.md", "tuning.md", "server.md", "cmake.md", "troubleshooting.md", "developing.md",
                   "models-at-scale.md", "install.md", "architecture.md", "math.md")  # fmt: skip
# Pages of docs/ that are walk-throughs: every block runs in docs/, as in a README.
WALKTHROUGHS = ("your-kernel-in-an-onnx-model.md", "your-kernel-in-a-torch-model.md", "cache-and-rebuilds.md", "writing-an-import.md")


def _pages() -> list[tuple[Path, Path | None]]:
    """(page, where its blocks run, or None for the page's own directory), in the order they run."""
    root = Path(".")
    reference = [(Path("docs") / name, root) for name in REFERENCE_PAGES]
    walkthroughs = [(Path("docs") / name, None) for name in WALKTHROUGHS]
    samples = [(p.relative_to(REPO), None) for p in sorted((REPO / "samples").rglob("README.md"))]
    return [(Path("README.md"), None), *reference, *walkthroughs, *samples]


def _readmes() -> list[Path]:
    return [page for page, _ in _pages()]


BLOCKS = [b for page, cwd in _pages() for b in extract((REPO / page).read_text(encoding="utf-8"), page, cwd)]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A copy of the checkout, as a user who cloned it has it; blocks run in it in order."""
    root = tmp_path_factory.mktemp("readme") / "pyree_build"
    shutil.copytree(REPO, root, ignore=shutil.ignore_patterns(".git", "build", "__pycache__", "*.egg-info", ".pytest_cache"))
    return root, _environment(root)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block(block: Block, scratch: tuple[Path, dict[str, str]]) -> None:
    root, env = scratch
    run_block(block, root / block.directory, env)


def _new_readme_blocks() -> list[Block]:
    from pyree_build.actions.scaffold import sample_readme

    return extract(sample_readme("fresh_project"), Path("fresh_project/README.md"))


NEW_BLOCKS = _new_readme_blocks()


@pytest.fixture(scope="module")
def new_project(scratch: tuple[Path, dict[str, str]]) -> Path:
    root, env = scratch
    project = root.parent / "fresh_project"
    subprocess.run([sys.executable, "-m", "pyree_build", "new", project], env=env, check=True, capture_output=True)
    return project


@pytest.mark.slow
@pytest.mark.parametrize("block", NEW_BLOCKS, ids=[b.id for b in NEW_BLOCKS])
def test_new_project_readme_block(block: Block, new_project: Path, scratch: tuple[Path, dict[str, str]]) -> None:
    assert extract((new_project / "README.md").read_text(encoding="utf-8"), block.readme)[NEW_BLOCKS.index(block)].code == block.code
    run_block(block, new_project, scratch[1])


def test_the_conventions_are_checked():
    """A claim that the output lacks fails; markers parse; other languages are not run."""
    text = "```sh\necho hello\n# => hel...lo\n```\n```cmake\nnot run\n```\n```python\n# readme-test: skip (why)\n```\n"
    sh, py = extract(text, Path("X.md"))
    assert (sh.language, sh.claims(), py.markers()) == ("bash", ["hel...lo"], [("skip", "(why)")])
    check_claims(sh, "hello")
    with pytest.raises(AssertionError, match="claims output"):
        check_claims(sh, "goodbye")
    assert skip_reason(py) == "why"


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _markdown_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "samples").rglob("README.md"))]


@pytest.mark.parametrize("page", _markdown_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_of_a_page_leads_somewhere(page: Path) -> None:
    """Sections moved between the README and docs/ keep their links: each relative link names a
    file that exists, and each #anchor a heading of the page it points into."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.relative_to(REPO)}: link to {target}: {path} does not exist"
        if anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", re.sub(r"```.*?```", "", linked.read_text(encoding="utf-8"), flags=re.S), re.M)
            assert anchor in {_slug(h) for h in headings}, f"{page.relative_to(REPO)}: link to {target}: no such heading"


def _text(page: str) -> str:
    return (REPO / page).read_text(encoding="utf-8")


def _fenced(text: str, language: str | None = None) -> list[str]:
    """The bodies of the page's fenced blocks (of one language, or of every language)."""
    return [body for lang, body in re.findall(r"^```\s*([\w+-]*)\n(.*?)^```", text, re.M | re.S) if language in (None, lang.lower())]


def test_every_page_of_docs_runs_its_blocks():
    """A page added to docs/ is either a reference page (run from the root) or a walk-through (run in
    docs/): none is left out, so a block moved out of the README is never left unrun."""
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    assert pages == set(REFERENCE_PAGES) | set(WALKTHROUGHS), "add the page to REFERENCE_PAGES or WALKTHROUGHS"
    assert not set(REFERENCE_PAGES) & set(WALKTHROUGHS)
    assert {b.readme.name for b in BLOCKS} >= {"README.md", "cli.md", "python.md", "server.md", "writing-an-import.md"}
    assert all(b.directory == Path(".") for b in BLOCKS if b.readme.name in REFERENCE_PAGES)


def test_the_readme_is_short_and_names_the_two_commands_ci_runs():
    """A newcomer's README: at most 400 lines, with the fresh machine's two commands in one block,
    the second of them the one .ci/run runs, and how long that takes."""
    readme = _text("README.md")
    assert len(readme.splitlines()) <= 400
    main = 'pip install ".[all]" && pyree-build samples'
    tests = 'pip install ".[test]" && pytest'
    assert any(re.search(rf"^{re.escape(main)} .*\n^{re.escape(tests)} ", b, re.M) for b in _fenced(readme, "sh"))
    assert _text(".ci/run").rstrip().splitlines()[-1] == tests
    assert re.search(r"about \d+ min on 2 cores", readme)  # how long the test command takes, as measured


def test_every_cli_verb_has_an_example_in_the_cli_reference():
    """docs/cli.md has a section and a shell example for every verb the parser knows."""
    import argparse

    from pyree_build.cli.parser import build_parser

    (sub,) = [a for a in build_parser(external=False)._actions if isinstance(a, argparse._SubParsersAction)]
    cli = _text("docs/cli.md")
    commands = "\n".join(_fenced(cli, "sh"))
    headings = " ".join(re.findall(r"^## (.*)$", cli, re.M))
    for verb in sub.choices:
        assert re.search(rf"(^|[\s!=]|\$\()pyree-build {re.escape(verb)}\b", commands, re.M), f"docs/cli.md: no example of `pyree-build {verb}`"
        assert re.search(rf"(^|[\s,]){re.escape(verb)}\b", headings), f"docs/cli.md: no section for {verb}"


def test_every_cmake_function_is_in_the_cmake_reference():
    """docs/cmake.md shows a call of every public pyree_* function cmake/ defines."""
    defined = set(re.findall(r"^\s*function\((pyree_\w+)", "\n".join(p.read_text() for p in (REPO / "cmake").glob("*.cmake")), re.M))
    assert len(defined) >= 12, defined
    calls = "\n".join(_fenced(_text("docs/cmake.md"), "cmake"))
    missing = sorted(f for f in defined if not re.search(rf"^\s*{f}\(NAME ", calls, re.M))
    assert not missing, f"docs/cmake.md has no example of {missing}"


def test_the_troubleshooting_table_is_whole():
    """Every row says what you did, what pyree_build says and what to do; none was lost in the move
    out of the README (218 rows then)."""
    rows = [line for line in _text("docs/troubleshooting.md").splitlines() if line.startswith("| ") and not line.startswith("| what you did")]
    assert len(rows) >= 218
    for row in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]
        assert len(cells) == 3 and all(cells[:2]), f"docs/troubleshooting.md: a row without its three cells: {row[:120]}"
    assert "(docs/troubleshooting.md)" in _text("README.md")
