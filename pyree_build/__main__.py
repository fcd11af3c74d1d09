import sys

from pyree_build.server.client import main

sys.exit(main())
