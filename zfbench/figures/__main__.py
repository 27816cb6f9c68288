"""`python -m zfbench.figures`: zfbench.figures.command.main with this process's arguments."""

import sys

from zfbench.figures.command import main

if __name__ == "__main__":
    sys.exit(main())
