"""`python -m pdnode ...`: the same command line as the `pdnode` entry point."""

import sys

from .commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
