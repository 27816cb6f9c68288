"""`python -m zfbench.accuracy`: zfbench.accuracy.command.main with this process's arguments."""

import sys

from zfbench.accuracy.command import main

if __name__ == "__main__":
    sys.exit(main())
