"""`make run`: the local default, end to end, in one terminal; Ctrl-C stops what it started.

1. a local Apache Kafka broker (dev/kafka/localkafka.py), unless KAFKA_BOOTSTRAP_SERVERS is set;
2. the stream's topics;
3. the worker, `faust -A streams worker`;
4. the webhook bridge, `python -m connectors webhook`, with the `s3` route open without
   authentication (local development only; it says so in its log).

Logs of the worker and the bridge go to ~/.cache/storage-events/run/. The worker's state
(STREAMS_DATA_DIR, unless set) lives with the broker: `worker-state` in the local broker's state
directory, so that another broker never meets this one's state (the worker would discard it
anyway, streams/engine/binding.py, at the cost of a restore); against KAFKA_BOOTSTRAP_SERVERS, in
~/.cache/storage-events/run/worker-state.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RUN_DIR = Path.home() / ".cache" / "storage-events" / "run"
LOCAL_KAFKA = ROOT / "dev" / "kafka" / "localkafka.py"
WEBHOOK_PORT = os.environ.get("WEBHOOK_PORT", "8080")
WORKER_WEB_PORT = os.environ.get("STREAMS_WEB_PORT", "6066")


def local_broker_dir() -> Path:
    """The state directory of the local broker localkafka.py starts in this environment."""
    sys.path.insert(0, str(ROOT))
    try:
        from dev.kafka.localkafka import Layout
    finally:
        sys.path.remove(str(ROOT))
    return Layout.from_env().root


def local_client_settings() -> dict[str, str]:
    """The KAFKA_* settings of the local broker's client.env (its security: the worker and the
    bridge connect as `make tail` does), empty when it wrote none."""
    try:
        text = (local_broker_dir() / "client.env").read_text()
    except FileNotFoundError:
        return {}
    settings = {}
    for line in text.splitlines():
        name, separator, value = line.partition("=")
        if separator and name.startswith("KAFKA_") and not line.startswith("#"):
            settings[name] = " ".join(shlex.split(value))
    return settings


def tail_command(environ: dict[str, str]) -> str:
    """`make tail` as typed in another terminal to follow this run's broker: with the
    settings that moved it (they may have been given to `make run` alone)."""
    if environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        moved = ["KAFKA_BOOTSTRAP_SERVERS"]
    else:
        moved = ["LOCAL_KAFKA_DIR", "LOCAL_KAFKA_PORT"]
    given = [f"{name}={shlex.quote(environ[name])}" for name in moved if environ.get(name)]
    return " ".join([*given, "make tail"])


def say(message: str) -> None:
    # Never let a closed terminal (or a dead `| tee`) stop the clean-up that follows.
    with contextlib.suppress(OSError):
        print(f"[make run] {message}", flush=True)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def wait_until(
    url: str, process: subprocess.Popen[bytes], what: str, log: Path, timeout_s: float = 120.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while not answers(url):
        if process.poll() is not None:
            raise SystemExit(f"[make run] {what} exited with {process.returncode}; see {log}")
        if time.monotonic() > deadline:
            raise SystemExit(f"[make run] {what} not ready after {timeout_s:.0f} s; see {log}")
        time.sleep(0.3)


def spawn(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        # Own session: Ctrl-C reaches only this script, which then stops each child in order.
        return subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop(process: subprocess.Popen[bytes] | None, what: str) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    say(f"stopped the {what}")


def main() -> int:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    started_broker = False
    worker = bridge = None
    interrupted = False

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        if not env.get("KAFKA_BOOTSTRAP_SERVERS"):
            status = subprocess.run(
                [sys.executable, str(LOCAL_KAFKA), "status"], capture_output=True, check=False
            )
            started = subprocess.run(
                [sys.executable, str(LOCAL_KAFKA), "start"],
                stdout=subprocess.PIPE,
                text=True,
                check=False,
            )
            if started.returncode != 0:
                return started.returncode
            started_broker = status.returncode != 0
            env["KAFKA_BOOTSTRAP_SERVERS"] = started.stdout.strip().splitlines()[-1]
            env.setdefault("STREAMS_DATA_DIR", str(local_broker_dir() / "worker-state"))
            for name, value in local_client_settings().items():
                env.setdefault(name, value)
        bootstrap = env["KAFKA_BOOTSTRAP_SERVERS"]
        say(f"Kafka at {bootstrap}")
        subprocess.run(
            [str(BIN / "python"), "-m", "streams", "create-topics"], env=env, check=True, cwd=ROOT
        )
        env.setdefault("STREAMS_DATA_DIR", str(RUN_DIR / "worker-state"))
        env.setdefault("STREAMS_WEB_PORT", WORKER_WEB_PORT)
        env.setdefault("WEBHOOK_PORT", WEBHOOK_PORT)
        env.setdefault("WEBHOOK_INSECURE_SOURCES", "s3")
        worker_log, bridge_log = RUN_DIR / "worker.log", RUN_DIR / "webhook.log"
        worker = spawn(
            [str(BIN / "faust"), "-A", "streams", "worker", "-l", "info"], env, worker_log
        )
        bridge = spawn([str(BIN / "python"), "-m", "connectors", "webhook"], env, bridge_log)
        wait_until(
            f"http://127.0.0.1:{env['STREAMS_WEB_PORT']}/ready", worker, "worker", worker_log
        )
        wait_until(
            f"http://127.0.0.1:{env['WEBHOOK_PORT']}/healthz", bridge, "webhook bridge", bridge_log
        )
        say(
            f"worker ready (log {worker_log}, metrics "
            f"http://127.0.0.1:{env['STREAMS_WEB_PORT']}/metrics)"
        )
        say(f"webhook bridge ready on http://127.0.0.1:{env['WEBHOOK_PORT']} (log {bridge_log})")
        print(
            f"""
Send a test S3 notification (key "photos/red+flower.jpg", form-encoded):

    curl -X POST --data-binary @examples/s3-put.json http://127.0.0.1:{env["WEBHOOK_PORT"]}/hooks/s3

Sent again, it is the same change: dropped as a duplicate, by design. For a new change each time:

    {"WEBHOOK_PORT=" + env["WEBHOOK_PORT"] + " " if env["WEBHOOK_PORT"] != "8080" else ""}make send

Watch the canonical events of the default instance, in another terminal:

    {tail_command(dict(os.environ))}

Ctrl-C here stops the bridge, the worker{" and the broker" if started_broker else ""}.
""",
            flush=True,
        )
        while True:
            for process, what, log in (
                (worker, "worker", worker_log),
                (bridge, "webhook bridge", bridge_log),
            ):
                if process.poll() is not None:
                    say(f"the {what} exited with {process.returncode}; see {log}")
                    return 1
            time.sleep(1)
    except KeyboardInterrupt:
        interrupted = True
        return 0
    finally:
        # Ctrl-C reaches this script again while it waits: finish the clean-up regardless.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if interrupted:
            say("stopping")
        stop(bridge, "webhook bridge")
        stop(worker, "worker")
        if started_broker:
            subprocess.run(
                [sys.executable, str(LOCAL_KAFKA), "stop"],
                check=False,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            say("stopped the Kafka broker")


if __name__ == "__main__":
    sys.exit(main())
