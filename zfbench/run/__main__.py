"""`python -m zfbench.run`: zfbench.run.command.main with this process's arguments."""

import sys

from zfbench.run.command import main

if __name__ == "__main__":
    sys.exit(main())
