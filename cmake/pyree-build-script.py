#!python
# The typed `pyree-build` where no native client could be built (no C compiler, not Linux):
# the Python client, as `pyree-build-py`. The installer rewrites the first line to its Python.
import sys

from pyree_build.server.client import main

if __name__ == "__main__":
    sys.exit(main())
