"""``python -m taccl_py`` runs the ``taccl`` command line."""

import sys

from taccl_py.cli import main

sys.exit(main())
