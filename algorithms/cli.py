"""What the ``simcomm`` and ``realcomm`` command lines share: a parser whose mistakes raise
instead of printing the usage and exiting, and one way out for every error, a single line
``PROG: error: ...`` on stderr and exit status 2."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

USAGE_ERROR = 2


class UsageError(Exception):
    """A command-line mistake."""


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake raises ``UsageError`` so that it leaves as every other error
    does."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see {self.prog} --help)")


def run_command(prog: str, command: Callable[[], int],
                errors: tuple[type[BaseException], ...]) -> int:
    """Run ``command`` and return its exit status. A ``UsageError`` or one of ``errors``
    prints one line on stderr and returns ``USAGE_ERROR``; a reader that leaves early
    (``... | head``) ends the output quietly."""
    try:
        return command()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (UsageError, *errors) as error:
        message = " ".join(str(error).split())
        print(f"{prog}: error: {message}", file=sys.stderr)
        return USAGE_ERROR
