#!/usr/bin/env python3
"""The environment of the stack a make command belongs to (issue 35, item 2), for `eval`.

    python3 dev/stack.py env     # shell assignments: the running `make run`'s settings, else
                                 # the local broker's client settings (localkafka.py env)
    python3 dev/stack.py where   # one line: where the running `make run` stack is (exit 1: none)

`make tail`, `make status`, `make dead-letters` and `make send` evaluate `env`: with a
`make run` going (streams/localstack.py), its Kafka client settings and ports, the variables
given to the command winning; without one, and without KAFKA_BOOTSTRAP_SERVERS, the local
broker's `client.env` (LOCAL_KAFKA_PORT / LOCAL_KAFKA_DIR say which), as before.
Standard library only: it runs with the system Python.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streams import localstack  # noqa: E402  (standard library only)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["where"]:
        stack = localstack.running()
        if stack is None:
            print("no `make run` is running", file=sys.stderr)
            return 1
        print(stack.describe())
        return 0
    if args != ["env"]:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    extra = localstack.command_environ(os.environ)
    if extra:
        for name, value in extra.items():
            print(f"{name}={shlex.quote(value)}")
        return 0
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return 0
    return subprocess.run(
        [sys.executable, str(ROOT / "dev" / "kafka" / "localkafka.py"), "env"], check=False
    ).returncode


if __name__ == "__main__":
    sys.exit(main())
