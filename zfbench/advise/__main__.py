"""`python -m zfbench.advise`: zfbench.advise.command.main with this process's arguments."""

import sys

from zfbench.advise.command import main

if __name__ == "__main__":
    sys.exit(main())
