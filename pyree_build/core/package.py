"""pyree_build's version and where its files are, for any layer to read."""

from pathlib import Path

from pyree_build.core.errors import PyreeError

__version__ = "0.1.0"

# The installed package (or the checkout's pyree_build/): sources, C header, CMake files.
PACKAGE_DIR = Path(__file__).parent.parent


def cmake_dir() -> Path:
    """Where pyree_buildConfig.cmake is: installed into the package, or the source tree's cmake/."""
    here = PACKAGE_DIR
    for candidate in (here / "share" / "cmake" / "pyree_build", here.parent / "cmake"):
        if (candidate / "pyree_buildConfig.cmake").is_file():
            return candidate
    raise PyreeError("pyree_buildConfig.cmake is not installed", file=here, fix="reinstall with `pip install .` from the pyree_build checkout")
