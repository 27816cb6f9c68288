"""`python -m zfbench.simulate`: zfbench.simulate.command.main with this process's arguments."""

import sys

from zfbench.simulate.command import main

if __name__ == "__main__":
    sys.exit(main())
