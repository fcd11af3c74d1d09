import sys

from pyree_build.server.daemon import main

sys.exit(main())
