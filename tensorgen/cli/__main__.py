"""`python -m tensorgen.cli`."""

import sys

from tensorgen.cli import main

sys.exit(main())
