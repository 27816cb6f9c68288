"""`python -m zfbench.predict`: zfbench.predict.command.main with this process's arguments."""

import sys

from zfbench.predict.command import main

if __name__ == "__main__":
    sys.exit(main())
