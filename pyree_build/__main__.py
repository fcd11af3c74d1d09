import sys

from pyree_build.cli import main

sys.exit(main())
