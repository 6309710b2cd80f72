"""A fault proxy in front of one Kafka listener: faults as the network makes them, not only
as processes die.

It reads the protocol's frames both ways (a request: size, api key, version, correlation id;
an answer: size, correlation id), so a test can say which request a fault hits:

* `lose_answer(api, refuse_s)`: the next request of `api` reaches the broker (which acts on
  it), its answer never reaches the client, whose connection is then reset; for `refuse_s`
  afterwards every new connection is reset at once (a broker that died after writing);
* `delay_answer(api, seconds)`: the next answer to `api` is held for `seconds`;
* `refuse(seconds)`, `reset_all()`: refuse new connections, reset the open ones.

Use it with a broker that advertises the proxy's port (`PrivateBroker(proxied=True)`), so
that every connection a client opens after bootstrap goes through it too. It runs its own
event loop on a daemon thread; `start()` and `stop()` from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

PRODUCE = 0
FIND_COORDINATOR = 10
INIT_PRODUCER_ID = 22
ADD_PARTITIONS_TO_TXN = 24
ADD_OFFSETS_TO_TXN = 25
END_TXN = 26
TXN_OFFSET_COMMIT = 28

API_NAMES = {
    PRODUCE: "Produce",
    FIND_COORDINATOR: "FindCoordinator",
    INIT_PRODUCER_ID: "InitProducerId",
    ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxn",
    ADD_OFFSETS_TO_TXN: "AddOffsetsToTxn",
    END_TXN: "EndTxn",
    TXN_OFFSET_COMMIT: "TxnOffsetCommit",
}


@dataclass
class _Fault:
    api: int
    kind: str  # "lose" | "delay"
    seconds: float
    remaining: int = 1


@dataclass(eq=False)  # kept in a set, by identity
class _Connection:
    client: asyncio.StreamWriter
    broker: asyncio.StreamWriter
    pending: dict[int, _Fault] = field(default_factory=dict)
    """Correlation ids whose answers a fault takes."""


class FaultProxy:
    """Forwards 127.0.0.1:`listen_port` to 127.0.0.1:`target_port`, frame by frame."""

    def __init__(self, listen_port: int, target_port: int) -> None:
        self.listen_port = listen_port
        self.target_port = target_port
        self.requests: Counter[int] = Counter()
        """Requests forwarded to the broker, by api key."""
        self.hit: Counter[int] = Counter()
        """Faults done, by api key."""
        self._faults: list[_Fault] = []
        self._refuse_until = 0.0
        self._connections: set[_Connection] = set()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for connection in list(self._connections):
                _reset(connection.client)
                _reset(connection.broker)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # What a test asks for.

    def lose_answer(self, api: int, refuse_s: float = 0.0, count: int = 1) -> None:
        """The next `count` requests of `api` reach the broker; their answers are lost, the
        client's connection reset, and new connections refused for `refuse_s`."""
        with self._lock:
            self._faults.append(_Fault(api, "lose", refuse_s, count))

    def delay_answer(self, api: int, seconds: float, count: int = 1) -> None:
        """The answers to the next `count` requests of `api` are held for `seconds`."""
        with self._lock:
            self._faults.append(_Fault(api, "delay", seconds, count))

    def refuse(self, seconds: float) -> None:
        """Reset every new connection for `seconds`."""
        with self._lock:
            self._refuse_until = max(self._refuse_until, time.monotonic() + seconds)

    def reset_all(self) -> None:
        """Reset every open connection (the clients reconnect)."""

        async def reset() -> None:
            for connection in list(self._connections):
                _reset(connection.client)
                _reset(connection.broker)

        asyncio.run_coroutine_threadsafe(reset(), self._loop).result(10)

    def clear(self) -> None:
        """Forget the faults not yet done, and the counts."""
        with self._lock:
            self._faults.clear()
            self._refuse_until = 0.0
            self.requests.clear()
            self.hit.clear()

    def wait_hit(self, api: int, count: int = 1, timeout_s: float = 30.0) -> bool:
        """Whether `count` faults on `api` were done within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.hit[api] >= count:
                return True
            time.sleep(0.01)
        return False

    # The proxy.

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.listen_port, reuse_address=True
        )

    async def _serve(
        self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter
    ) -> None:
        with self._lock:
            refusing = time.monotonic() < self._refuse_until
        if refusing:
            _reset(client)
            return
        try:
            broker_reader, broker = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            _reset(client)
            return
        connection = _Connection(client, broker)
        self._connections.add(connection)
        try:
            await asyncio.gather(
                self._requests(client_reader, connection), self._answers(broker_reader, connection)
            )
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._connections.discard(connection)
            _reset(client)
            _reset(broker)

    async def _requests(self, reader: asyncio.StreamReader, connection: _Connection) -> None:
        while True:
            frame = await _frame(reader)
            api, _version, correlation = struct.unpack_from(">hhi", frame, 4)
            with self._lock:
                for fault in self._faults:
                    if fault.api == api and fault.remaining > 0:
                        fault.remaining -= 1
                        connection.pending[correlation] = fault
                        break
                self._faults = [fault for fault in self._faults if fault.remaining > 0]
            self.requests[api] += 1
            connection.broker.write(frame)
            await connection.broker.drain()

    async def _answers(self, reader: asyncio.StreamReader, connection: _Connection) -> None:
        while True:
            frame = await _frame(reader)
            (correlation,) = struct.unpack_from(">i", frame, 4)
            fault = connection.pending.pop(correlation, None)
            if fault is not None and fault.kind == "lose":
                with self._lock:
                    self._refuse_until = max(self._refuse_until, time.monotonic() + fault.seconds)
                self.hit[fault.api] += 1
                raise OSError("answer lost")  # resets both sides
            if fault is not None:
                self.hit[fault.api] += 1
                await asyncio.sleep(fault.seconds)
            connection.client.write(frame)
            await connection.client.drain()


async def _frame(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(4)
    (size,) = struct.unpack(">i", head)
    return head + await reader.readexactly(size)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST, as a dead peer or a dropped route leaves it."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()
