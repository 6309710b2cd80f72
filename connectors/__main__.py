"""`python -m connectors <bridge>`: run a bridge.

webhook   the HTTP server for push providers (see connectors.webhook)
"""

from __future__ import annotations

import argparse
import logging
import sys

from streams.config import ConfigError, load_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m connectors")
    commands = parser.add_subparsers(dest="command", required=True)
    webhook = commands.add_parser("webhook", help="HTTP server for push providers")
    webhook.add_argument("--config", help="config file (default: $STREAMS_CONFIG)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"connectors: {exc}", file=sys.stderr)
        return 2
    if args.command == "webhook":
        from connectors.webhook import serve

        serve(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
