"""``python -m simcomm``: the same as the ``simcomm`` command."""

import sys

from simcomm.cli import main

sys.exit(main())
