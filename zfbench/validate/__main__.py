"""`python -m zfbench.validate`: zfbench.validate.command.main with this process's arguments."""

import sys

from zfbench.validate.command import main

if __name__ == "__main__":
    sys.exit(main())
