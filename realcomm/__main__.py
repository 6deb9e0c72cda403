"""``python -m realcomm``: the same as the ``realcomm`` command."""

import os
import sys

from realcomm.cli import main
from realcomm.launch import in_launcher_env

# Spawned processes import the parent's main module again: only the parent runs the command.
if __name__ == "__main__":
    code = main()
    if in_launcher_env():
        # A torchrun worker whose work is done leaves at once: tearing down the interpreter
        # runs torch's C++ destructors after its threads, which now and then aborts the
        # process ("terminate called without an active exception") after a good run.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
