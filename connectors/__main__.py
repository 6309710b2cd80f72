"""`python -m connectors <bridge> [options]`: run a bridge.

Each bridge module defines `COMMAND` (a `connectors.command.BridgeCommand`); adding a bridge
means adding its module and one line in `BRIDGES`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

try:
    from connectors.command import BridgeCommand
    from streams.config import ConfigError, load_settings
    from streams.kafka_settings import KafkaAccessError, KafkaRefusalWording
    from streams.logs import install_kafka_log_filter
except ModuleNotFoundError as error:  # outside the virtualenv: say what to run
    from streams.environment import exit_not_installed

    exit_not_installed(error, "python -m connectors")

BRIDGES = {
    "webhook": "connectors.webhook",
    "azure-queue": "connectors.azure_queue",
    "pubsub": "connectors.pubsub",
    "sqs": "connectors.sqs",
    "reconcile": "connectors.reconcile",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m connectors")
    parser.add_argument("--config", help="config file (default: $STREAMS_CONFIG)")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, module_name in BRIDGES.items():
        command: BridgeCommand = importlib.import_module(module_name).COMMAND
        sub = commands.add_parser(
            name,
            help=command.help,
            description=command.help,
            epilog=command.details() if command.details is not None else None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(sub)
        sub.set_defaults(bridge=command)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )
    install_kafka_log_filter()  # an outage: one line per cause every few seconds
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"connectors: {exc}", file=sys.stderr)
        return 2
    KafkaRefusalWording(settings.kafka).install()  # retry lines name the setting to fix
    try:
        code: int = args.bridge.run(args, settings)
    except KafkaAccessError as exc:  # refused credentials or certificate: one line, exit 2
        print(f"connectors: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
