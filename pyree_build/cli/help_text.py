"""Help of options declared without one, and the usage tails main() parses itself.

A verb's description and examples live in its declaration (cli/verbs.py, or the backend's
Verb); an option without help, here or there, is caught by tests/cli/test_help.py.
"""

from __future__ import annotations

# Help for options declared without one: (verb, dest) first, then ("*", dest).
OPTIONS: dict[tuple[str, str], str] = {
    ("", "verb"): "what to do; `pyree-build VERB --help` documents each",
    ("fatelf", "action"): "what to do with the FatELF",
    ("*", "include_dirs"): "add an include directory (repeatable)",
    ("*", "defines"): "define a macro (repeatable)",
    ("*", "depfile"): "also write a Make/Ninja depfile listing every input (for CMake's DEPFILE)",
    ("*", "output_dir"): "the output directory",
    ("*", "output"): "the output file",
    ("*", "source"): "the input file",
    ("*", "input"): "the FatELF file to read",
    ("plugin", "sources"): "C sources, compiled separately and linked into one plugin",
    ("plugin", "kind"): "system: a .so for this host (dlopen); standalone: freestanding ELF per arch (FatELF .sos for several)",
    ("objects", "source"): "the C source",
    ("fatelf join", "inputs"): "the ELFs to pack, one per architecture",
    ("fatelf join", "output"): "the FatELF file to write",
    ("fatelf select", "output"): "where to write the selected ELF",
    ("ptx", "source"): "the CUDA source",
    ("ptx", "compiler"): "nvrtc: the NVRTC library from PyPI, no CUDA SDK needed; nvcc: the CUDA toolkit's compiler",
    ("dump", "source"): "the MLIR program",
    ("dump", "target"): "the HAL target to compile the executables for",
    ("dump", "object_search_paths"): "a directory where referenced objects are looked for, as for compile (repeatable)",
    ("spirv", "sources"): "GLSL compute shaders (.glsl, .comp)",
    ("hsaco", "source"): "the HIP source",
    ("bitcode", "source"): "the CUDA source holding __device__ functions",
    ("code-objects", "module"): "the compiled module",
    ("imports", "module"): "the compiled module",
    ("bench", "modules"): "the module to time (two with --compare)",
    ("bench", "inputs"): 'an input of the function, e.g. "8xf32=2" or @file.npy (repeatable, in order)',
    ("bench", "plugins"): "an executable plugin the module needs (repeatable)",
    ("bench", "device"): "the HAL device: local-sync, local-task or cuda",
    ("compile", "source"): "the MLIR program",
    ("compile", "target"): "the HAL target backend",
    ("compile", "object_search_paths"): "a directory where referenced objects (.o, .ptx) are looked for (repeatable)",
    ("run", "module"): "the compiled module",
    ("run", "function"): "the function to run",
    ("run", "device"): "the HAL device: local-sync (one thread), local-task (a thread pool) or cuda",
    ("new", "directory"): "the project directory (created; must be empty unless --force)",
    ("cache", "action"): "info: where the cache is, its entries and size; clear: remove every entry",
}

# Text appended to a verb's usage line, for arguments main() takes before argparse sees them.
USAGE_TAIL: dict[str, str] = {"compile": "[-- IREE_FLAGS...]", "dump": "[-- IREE_FLAGS...]"}


def option_help(verb: str, dest: str) -> str | None:
    return OPTIONS.get((verb, dest)) or OPTIONS.get(("*", dest))
