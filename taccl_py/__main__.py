"""``python -m taccl_py`` runs the ``taccl`` command line."""

import sys

from taccl_py.cli import main

# Guarded: worker processes (``taccl synthesize --jobs``) import the main module again.
if __name__ == "__main__":
    sys.exit(main())
