"""`python -m streams ...`: see streams.cli."""

import sys

from streams.cli import main

sys.exit(main())
