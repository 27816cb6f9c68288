"""`python -m zfbench.gradients`: zfbench.gradients.command.main with this process's arguments."""

import sys

from zfbench.gradients.command import main

if __name__ == "__main__":
    sys.exit(main())
