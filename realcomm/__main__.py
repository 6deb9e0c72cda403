"""``python -m realcomm``: the same as the ``realcomm`` command."""

import sys

from realcomm.cli import main

# Spawned processes import the parent's main module again: only the parent runs the command.
if __name__ == "__main__":
    sys.exit(main())
