"""`make send`: the "Try it" S3 notification again, as a new change each time.

`examples/s3-put.json` posted twice is one change delivered twice, which the stream drops as a
duplicate by design (same event id); this posts it with a fresh sequencer (later than every
earlier one, so the change is also newer for its key) and the current event time, so that
`make tail` prints one new event per `make send`. KEY=<key> sends it for another object key.
Standard library only: it needs nothing but the running webhook bridge.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "s3-put.json"
sys.path.insert(0, str(ROOT))

from streams import localstack  # noqa: E402  (standard library only)


def fresh_notification(
    sample: dict[str, object], key: str | None, now_ns: int
) -> dict[str, object]:
    """`sample` as a new change: a sequencer made of the clock (18 hex digits starting
    `01`, above the sample's `0055...`, rising with time) and the current event time."""
    notification = json.loads(json.dumps(sample))
    record = notification["Records"][0]
    record["eventTime"] = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(now_ns / 1e9))
    s3_object = record["s3"]["object"]
    s3_object["sequencer"] = f"01{now_ns:016X}"
    if key is not None:
        s3_object["key"] = urllib.parse.quote_plus(key, safe="/")
    return notification


def nothing_answers(url: str, error: OSError) -> str:
    """The line for a URL where no bridge answers: where the running stack's bridge is, or
    that none runs."""
    stack = localstack.running()
    said = f"no webhook bridge answers at {url} ({error})"
    if stack is None:
        return f"{said}; start `make run` first"
    return (
        f"{said}; {stack.describe()}: `make send` without WEBHOOK_PORT, or "
        f"WEBHOOK_PORT={stack.webhook_port} make send"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make send", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--key", help="the object key (default the sample's, photos/red flower.jpg)"
    )
    parser.add_argument(
        "--url",
        default=f"http://127.0.0.1:{os.environ.get('WEBHOOK_PORT') or '8080'}/hooks/s3",
        help="the webhook bridge's s3 route (default http://127.0.0.1:$WEBHOOK_PORT/hooks/s3)",
    )
    args = parser.parse_args(argv)
    notification = fresh_notification(json.loads(SAMPLE.read_text()), args.key, time.time_ns())
    s3_object = notification["Records"][0]["s3"]["object"]  # type: ignore[index]
    request = urllib.request.Request(
        args.url, data=json.dumps(notification).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    except OSError as error:
        print(f"make send: {nothing_answers(args.url, error)}", file=sys.stderr)
        return 1
    key = urllib.parse.unquote_plus(s3_object["key"])
    print(f"sent a new change of {key!r} (sequencer {s3_object['sequencer']}): HTTP {status}")
    return 0 if status == 202 else 1


if __name__ == "__main__":
    sys.exit(main())
