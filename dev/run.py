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
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streams import localstack  # noqa: E402  (standard library only)

BIN = Path(sys.executable).parent
RUN_DIR = localstack.run_dir()
LOCAL_KAFKA = ROOT / "dev" / "kafka" / "localkafka.py"
WEBHOOK_PORT = os.environ.get("WEBHOOK_PORT", "8080")
WORKER_WEB_PORT = os.environ.get("STREAMS_WEB_PORT", "6066")
DEAD_LETTER_LINE = re.compile(r"dead-lettered (?:a delivery|an unreadable record)\b.*")
DEAD_LETTER_EVERY_S = 10.0
"""At most one console line per this many seconds about dead letters (the rest counted)."""


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


def port_taken(port: int) -> bool:
    """Whether something already answers on 127.0.0.1:`port`."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def taken_ports(env: dict[str, str]) -> str | None:
    """One line naming a port of the worker or the bridge that another process holds (and
    the variable that moves it), or None: checked before anything starts."""
    for variable, what in (
        ("WEBHOOK_PORT", "the webhook bridge"),
        ("STREAMS_WEB_PORT", "the worker"),
    ):
        port = int(env[variable])
        if port_taken(port):
            return (
                f"port {port} ({variable}, {what}) on 127.0.0.1 is used by another process; "
                f"stop it, or move {what}: {variable}=<free port> make run"
            )
    return None


def last_line(log: Path, offset: int) -> str:
    """The last non-empty line `log` got after `offset`: a child's own reason for exiting."""
    try:
        with log.open("rb") as out:
            out.seek(offset)
            lines = out.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if line.strip():
            return line.strip()
    return ""


class DeadLetterWatch:
    """The worker log's dead-letter lines, as rate-limited console lines: the first at once,
    then at most one per DEAD_LETTER_EVERY_S with how many more there were."""

    def __init__(self, log: Path, offset: int) -> None:
        self.log = log
        self.offset = offset
        self.last_said = float("-inf")
        self.unsaid = 0
        self.latest = ""

    def poll(self, now: float) -> str | None:
        """A console line to print now, or None."""
        try:
            with self.log.open("rb") as out:
                out.seek(self.offset)
                chunk = out.read()
        except OSError:
            return None
        complete = chunk.rfind(b"\n") + 1
        self.offset += complete
        for line in chunk[:complete].decode(errors="replace").splitlines():
            match = DEAD_LETTER_LINE.search(line)
            if match:
                self.unsaid += 1
                self.latest = match.group(0)
        if not self.unsaid or now - self.last_said < DEAD_LETTER_EVERY_S:
            return None
        more = f" (and {self.unsaid - 1} more since the last such line)" if self.unsaid > 1 else ""
        line = f"{self.latest[:300]}{more}; `make dead-letters` shows each with its reason"
        self.last_said, self.unsaid = now, 0
        return line


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


def exited(what: str, process: subprocess.Popen[bytes], log: Path, offset: int) -> str:
    """The line saying that a child exited: its code, its own last line, its log."""
    reason = last_line(log, offset)
    return f"the {what} exited with {process.returncode}" + (
        f": {reason} (log {log})" if reason else f"; see {log}"
    )


def wait_until(
    url: str,
    process: subprocess.Popen[bytes],
    what: str,
    log: Path,
    offset: int,
    timeout_s: float = 120.0,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not answers(url):
        if process.poll() is not None:
            raise SystemExit(f"[make run] {exited(what, process, log, offset)}")
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
    env.setdefault("STREAMS_WEB_PORT", WORKER_WEB_PORT)
    env.setdefault("WEBHOOK_PORT", WEBHOOK_PORT)
    other = localstack.running()
    if other is not None and other.pid != os.getpid():
        say(f"already running: {other.describe()}; Ctrl-C in its terminal stops it")
        return 1
    busy = taken_ports(env)
    if busy is not None:
        say(busy)
        return 2
    started_broker = False
    worker = bridge = None
    interrupted = False

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        local: dict[str, str] = {}
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
            broker_dir = local_broker_dir()
            env.setdefault("STREAMS_DATA_DIR", str(broker_dir / "worker-state"))
            for name, value in local_client_settings().items():
                env.setdefault(name, value)
            local = {"LOCAL_KAFKA_PORT": broker_port(env), "LOCAL_KAFKA_DIR": str(broker_dir)}
        bootstrap = env["KAFKA_BOOTSTRAP_SERVERS"]
        say(f"Kafka at {bootstrap}")
        subprocess.run(
            [str(BIN / "python"), "-m", "streams", "create-topics"], env=env, check=True, cwd=ROOT
        )
        env.setdefault("STREAMS_DATA_DIR", str(RUN_DIR / "worker-state"))
        env.setdefault("WEBHOOK_INSECURE_SOURCES", "s3")
        # Where this stack is, for every command of it typed in another shell (`make send`,
        # `make tail`, `make status`, `make dead-letters`, fileevents): streams.localstack.
        localstack.write(
            localstack.Stack(
                pid=os.getpid(),
                kafka={name: value for name, value in env.items() if name.startswith("KAFKA_")},
                webhook_port=int(env["WEBHOOK_PORT"]),
                worker_port=int(env["STREAMS_WEB_PORT"]),
                local_kafka=local,
            )
        )
        worker_log, bridge_log = RUN_DIR / "worker.log", RUN_DIR / "webhook.log"
        worker_from, bridge_from = log_size(worker_log), log_size(bridge_log)
        worker = spawn(
            [str(BIN / "faust"), "-A", "streams", "worker", "-l", "info"], env, worker_log
        )
        bridge = spawn([str(BIN / "python"), "-m", "connectors", "webhook"], env, bridge_log)
        wait_until(
            f"http://127.0.0.1:{env['WEBHOOK_PORT']}/healthz",
            bridge,
            "webhook bridge",
            bridge_log,
            bridge_from,
            timeout_s=60,
        )
        wait_until(
            f"http://127.0.0.1:{env['STREAMS_WEB_PORT']}/ready",
            worker,
            "worker",
            worker_log,
            worker_from,
        )
        say(
            f"worker ready (log {worker_log}, state {env['STREAMS_DATA_DIR']}, metrics "
            f"http://127.0.0.1:{env['STREAMS_WEB_PORT']}/metrics)"
        )
        say(f"webhook bridge ready on http://127.0.0.1:{env['WEBHOOK_PORT']} (log {bridge_log})")
        print(
            f"""
Send a test S3 notification (key "photos/red+flower.jpg", form-encoded):

    curl -X POST --data-binary @examples/s3-put.json http://127.0.0.1:{env["WEBHOOK_PORT"]}/hooks/s3

Sent again, it is the same change: dropped as a duplicate, by design. For a new change each time:

    make send

In another terminal (each command finds this stack: {localstack.stack_file()}):

    make tail            # the canonical events of the default instance
    make status          # the stage groups, lag, duplicates, stale events, dead letters
    make dead-letters    # what could not be processed, with the reason

Ctrl-C here stops the bridge, the worker{" and the broker" if started_broker else ""}.
""",
            flush=True,
        )
        dead_letters = DeadLetterWatch(worker_log, worker_from)
        while True:
            for process, what, log, offset in (
                (worker, "worker", worker_log, worker_from),
                (bridge, "webhook bridge", bridge_log, bridge_from),
            ):
                if process.poll() is not None:
                    say(exited(what, process, log, offset))
                    return 1
            line = dead_letters.poll(time.monotonic())
            if line is not None:
                say(line)
            time.sleep(1)
    except KeyboardInterrupt:
        interrupted = True
        return 0
    finally:
        # Ctrl-C reaches this script again while it waits: finish the clean-up regardless.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if interrupted:
            say("stopping")
        localstack.remove(os.getpid())
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


def log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except FileNotFoundError:
        return 0


def broker_port(env: dict[str, str]) -> str:
    """The local broker's port, from the address its start printed."""
    return env["KAFKA_BOOTSTRAP_SERVERS"].rsplit(":", 1)[-1]


if __name__ == "__main__":
    sys.exit(main())
