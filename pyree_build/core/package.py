"""pyree_build's version and where its files are, for any layer to read."""
from pathlib import Path

__version__ = "0.1.0"

# The installed package (or the checkout's pyree_build/): sources, C header, CMake files.
PACKAGE_DIR = Path(__file__).parent.parent
