"""`python -m streams ...`: see streams.cli."""

import sys

try:
    from streams.cli import main
except ModuleNotFoundError as error:  # outside the virtualenv: say what to run
    from streams.environment import exit_not_installed

    exit_not_installed(error, "python -m streams")

sys.exit(main())
