"""The worker process (`faust -A streams worker`): the Faust app that hosts the two stages.

    raw topics --normalize--> repartition topic (key = instance/bucket/key) --emit--> outputs

The stages themselves (their group members, producers, transactions and state) are
streams.stages; this module is the process around them: settings and start-up checks, the
topics created before anything else starts, the service that runs the stages and stops the
worker when one fails, the timers (progress line, state sweep, stall watch), the web pages
(`/metrics`, `/ready`) and signals (SIGTERM: stop within `STOP_GRACE_S`; SIGUSR1: stop and
leave the groups for good). Faust's own consumer reads nothing: the stages consume with their
own group members, in batches, because Faust's per-event stream machinery costs several
times the work itself (BENCHMARKS.md).

Guarantees (streams.stages): `normalize` commits its input offsets after Kafka acknowledged
the batch's keyed and dead-letter records (at least once; a repeat is a duplicate the emit
stage drops). `emit` with `exactly_once` (the default) commits a batch's outputs, changelog
records and offsets in one transaction of the emit member (exactly-once v2); with
`at_least_once` it writes outputs, then the changelog, then commits.

No record stops a stage: one Kafka refuses (too large for its topic) is replaced by a dead
letter of the input it came from and the batch goes on. A stage that cannot make progress
(Kafka away) says so in the log and on `/ready` (503, with the stage and why:
streams.progress). SIGTERM stops the worker within `STOP_GRACE_S`: batches that cannot finish
are abandoned uncommitted (read again on the next start); exit 0, or `EXIT_STOP_TIMEOUT` if
even closing the clients ran out of time.

With `stream.stage_processes = 2` this process runs the normalize stage and a child process
the emit stage (streams.stages.child, supervised by streams.stages.supervisor): SIGTERM
reaches both, the child's end stops the worker with the child's exit code, and `/ready`,
`/metrics`, the progress line and the ready line cover both processes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import faust
from aiokafka.errors import KafkaError
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from streams.config import ConfigError, Settings, load_settings
from streams.core.rules import open_instances_warning
from streams.engine.librdkafka.group_config import kip848_refusal, versions_by_broker
from streams.engine.store import STATE_DIR_MODE, private
from streams.engine.topics import ensure_topics, names_line, resolve_repartition_topic, topology
from streams.exposition import merge, snapshot
from streams.kafka_settings import KafkaAccessError, KafkaRefusalWording
from streams.logs import install_kafka_log_filter, plain_unless_terminal
from streams.progress import STOP_GRACE_S, arm_stop_watchdog
from streams.stages.channel import StageView
from streams.stages.pipeline import STAGE_NAMES, Pipeline
from streams.stages.supervisor import StageProcess
from streams.status import ProgressReporter

log = logging.getLogger(__name__)

CHILD_STAGES = ("emit",)
"""The stages a child process runs when the worker runs a stage per process (the heavier one,
with the state, its sweep and the transactions: the worker's process has Faust, the pages and
the timers besides its stage; BENCHMARKS.md, "Issue 22: a process per stage")."""


def _load() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        # A configuration mistake stops start-up with one line naming the field.
        print(f"storage-events: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _check_data_dir(path: Path) -> None:
    """The RocksDB state directory must be a writable directory, private to the worker's
    user (STATE_DIR_MODE, whatever the umask). Say so in one line and stop (exit 2) rather
    than failing deep inside RocksDB with a traceback."""
    try:
        path.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
        private(path)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        print(
            f"storage-events: the state directory {str(path)!r} (STREAMS_DATA_DIR, "
            f"stream.data_dir) is not a writable directory: {exc.strerror or exc}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


def _stop_now(message: str) -> None:
    """Stop start-up with one line (fd 2 itself: Faust redirects sys.stderr into its logger)."""
    os.write(2, f"storage-events: {message}\n".encode())
    os._exit(2)


class StreamsWorker(faust.Worker):
    """Faust's worker, without its start-up spinner when its output is not a terminal (the
    spinner writes cursor escape codes into a log file or a pipe)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        isatty = getattr(self.stdout, "isatty", None)
        if isatty is None or not isatty():
            self.spinner = None


class StreamsApp(faust.App):
    """A Faust app carrying the stream's settings and, once started, its pipeline; it creates
    the stream's topics before anything else starts."""

    def __init__(self, settings: Settings) -> None:
        stream = settings.stream
        super().__init__(
            stream.app_id,
            **settings.kafka.faust_args(),  # broker URLs and broker_credentials (TLS, SASL)
            datadir=str(stream.data_dir),
            web_port=stream.web_port,
            web_bind=stream.web_host,  # the address the web server listens on
            # Faust's canonical URL host, which its own group's static members carry: as it
            # always was, so that an upgraded member's URL does not change.
            web_host="0.0.0.0",
            # Only the product's pages (`/metrics`, `/ready`; Faust's index answers `/` with
            # {"status": "OK"}): not Faust's router, table, graph or statistics pages, which
            # would show partition owners and table contents to whoever reaches the port.
            web_router_enabled=False,
            web_tables_enabled=False,
            web_graph_enabled=False,
            web_stats_enabled=False,
            web_metrics_enabled=False,
            consumer_auto_offset_reset="earliest",
            # Faust's own consumer reads nothing, but the worker starts the stages only once
            # it has joined its group: static membership and a short session let a restarted
            # worker rejoin at once instead of waiting out its previous life's session.
            consumer_group_instance_id=stream.group_instance_id,
            broker_session_timeout=stream.session_timeout_s,
            # The one topic Faust creates itself (`<app id>-__assignor-__leader`, which its
            # consumer reads): as many replicas as the stream's own, or it is lost with one
            # broker.
            topic_replication_factor=stream.replication_factor,
            broker_heartbeat_interval=stream.session_timeout_s / 5,
            Worker=StreamsWorker,
        )
        self.settings = settings
        self.pipeline: Pipeline | None = None
        """The worker's pipeline once started (its clients are made inside the event loop)."""
        self.stage_process: StageProcess | None = None
        """The child process running CHILD_STAGES, with `stream.stage_processes = 2`."""
        self.reporter: ProgressReporter | None = None
        """The progress line's counters (both processes')."""
        self.ready_announced = False
        """Whether the one `ready:` line was logged (the first time both stages had their
        partitions and the state was restored)."""
        self.started_at = time.monotonic()
        """For the ready line's start-up time (from the app's construction)."""

    def announce_ready(self) -> None:
        """One line once the worker first serves: what runs, on how many partitions, where
        its pages are. At WARNING, so that Faust's default level (WARN) shows it: the one
        sign of life at that level, besides Faust's banner."""
        pipeline = self.pipeline
        child = self.stage_process
        view = child.last if child is not None else None
        if self.ready_announced or pipeline is None or not pipeline.ready:
            return
        if child is not None and (view is None or not view.ready):
            return
        self.ready_announced = True
        stream = self.settings.stream
        stages = ", ".join(
            f"{loop.name} ({len(loop.owned)} partitions)" for loop in pipeline.stages
        )
        if child is not None and view is not None:
            stages += "".join(
                f", {name} ({owned} partitions; process {child.pid})"
                for name, owned in view.owned.items()
            )
        log.warning(
            "ready: stages %s; state in RocksDB at %s (Faust's banner `store` is its own "
            "table store, unused); web http://%s:%d; started in %.1f s",
            stages,
            os.path.abspath(pipeline.store.directory),  # a relative data_dir: of the checkout
            stream.web_host,
            stream.web_port,
            time.monotonic() - self.started_at,
        )

    async def child_view(self) -> StageView | None:
        """The child process' view now (None: no child, or it does not answer)."""
        child = self.stage_process
        return await child.view() if child is not None else None

    def read_sample(self, name: str, labels: dict[str, str]) -> float | None:
        """A sample's value, both processes' (the child's as of its latest view)."""
        value = REGISTRY.get_sample_value(name, labels)
        child = self.stage_process
        if child is None:
            return value
        theirs = child.last_samples.get((name, tuple(sorted(labels.items()))))
        if theirs is None:
            return value
        return theirs if value is None else value + theirs

    def stage_status(self, view: StageView | None) -> tuple[bool, dict[str, dict[str, object]]]:
        """Whether every stage serves (its partitions, the state restored, stuck on
        nothing), and each stage's state: this process' and its child's."""
        pipeline = self.pipeline
        if pipeline is None:
            return False, {}
        stages = pipeline.status()
        ready = pipeline.ready
        child = self.stage_process
        if child is not None:
            if view is None:
                ready = False
                if child.exit_code is not None:
                    why = "its process ended"
                elif child.started:
                    why = "its process does not answer"
                else:
                    why = "its process is starting"
                stages.update({name: {"assigned": False, "why": why} for name in child.stages})
            else:
                ready = ready and view.ready
                stages.update(view.status)
        stuck = any("why" in stage for stage in stages.values())
        return ready and not stuck, stages

    async def on_first_start(self) -> None:
        # Retries (and says so) while Kafka is unreachable: a worker started before its
        # broker waits for it. Refused credentials or an untrusted certificate stop it with
        # one line naming the setting (exit 2): waiting would not change them. Later, the
        # clients' own lines about them are reworded (KafkaRefusalWording).
        if self.settings.stream.stage_processes == 2:
            # Its imports meanwhile; it starts its stages once PipelineService hands it the
            # settings, the repartition topic resolved.
            self.stage_process = StageProcess(CHILD_STAGES)
            await self.stage_process.spawn()
        KafkaRefusalWording(self.settings.kafka).install()
        log.info("Kafka: %s", self.settings.kafka.describe())
        try:
            settings = self.settings = await resolve_repartition_topic(self.settings)
            created = await ensure_topics(settings.kafka, topology(settings))
        except KafkaAccessError as exc:
            _stop_now(str(exc))
        if created:
            log.info("created %d topic(s): %s", len(created), names_line(created))
        if settings.stream.group_protocol == "consumer":
            try:
                refusal = kip848_refusal(await versions_by_broker(settings.kafka))
            except (KafkaError, OSError, TimeoutError) as exc:  # not known: start anyway
                log.warning("could not read the brokers' API versions (%r)", exc)
                refusal = None
            if refusal is not None:
                _stop_now(refusal)
        await super().on_first_start()


def create_app(settings: Settings) -> StreamsApp:
    """The worker's Faust app: its service, timers and pages, all reading `settings`."""
    app = StreamsApp(settings)

    @app.service
    class PipelineService(faust.Service):
        """Runs the two stages as long as the worker runs; a stage failing stops the worker."""

        _failed = False
        _stages: tuple[asyncio.Future[None], ...] = ()

        async def on_start(self) -> None:
            plain_unless_terminal()  # Faust's handlers are set up by now: no escape codes
            open_instances = open_instances_warning(app.settings.instances)
            if open_instances is not None:
                log.warning("%s", open_instances)
            child = app.stage_process
            runs = tuple(name for name in STAGE_NAMES if child is None or name not in child.stages)
            pipeline = app.pipeline = Pipeline(app.settings, self._stop_on_failure, runs)
            app.reporter = ProgressReporter(app.read_sample)
            # SIGUSR1 = stop and leave the groups for good (in place of mode's stack dump);
            # with a child, once it has stopped (Pipeline.stop after wait_stopped).
            asyncio.get_running_loop().add_signal_handler(
                signal.SIGUSR1, pipeline.departure.on_signal
            )
            if child is not None:
                await child.start(app.settings)
            await pipeline.start()
            self._stages = tuple(asyncio.ensure_future(self._run(loop)) for loop in pipeline.stages)

        async def on_stop(self) -> None:
            """Within STOP_GRACE_S of now, whatever Kafka does: let each stage finish the
            batch in hand for the first FINISH_SHARE of it (streams.progress), then abandon
            what did not finish (uncommitted, so read again on the next start), stop the
            stages and close the clients (Pipeline.shut_down); a child process stops alike
            meanwhile, and is awaited before the clients close. A watchdog ends the process
            at the deadline (EXIT_STOP_TIMEOUT) should anything still hang there."""
            arm_stop_watchdog(STOP_GRACE_S)
            child = app.stage_process
            if child is not None:
                child.stop()
            pipeline = app.pipeline
            if pipeline is None:
                for stage in self._stages:
                    stage.cancel()
                return
            await pipeline.shut_down(
                self._stages, STOP_GRACE_S, child.wait_stopped if child is not None else None
            )

        async def _run(self, loop: Any) -> None:
            try:
                await loop.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self._stop_on_failure(loop.name, exc)
                raise

        async def _stop_on_failure(self, stage: str, exc: BaseException) -> None:
            # A stage never fails on bad input (that is dead-lettered) nor on Kafka being
            # away (that is retried): this is a bug or a broken disk. Stop rather than stall
            # silently.
            pipeline = app.pipeline
            if pipeline is not None and pipeline.progress.stopping:
                log.info("the %s stage ended while stopping: %r", stage, exc)
                return
            if self._failed:
                return
            self._failed = True
            log.error("the %s stage failed; stopping the worker", stage, exc_info=exc)
            if pipeline is not None:
                await pipeline.close_consumers()  # a dying worker is assigned nothing
            await app.crash(exc)

    @app.timer(interval=settings.stream.progress_interval_s)  # type: ignore[untyped-decorator]
    async def log_progress() -> None:
        """One line per interval: records/s per stage, lag, dead letters (streams.status)."""
        pipeline = app.pipeline
        if pipeline is None or pipeline.progress.stopping or app.reporter is None:
            return
        log.info("%s", app.reporter.line())

    @app.timer(interval=settings.stream.dedupe_sweep_interval_s)  # type: ignore[untyped-decorator]
    async def sweep_expired_ids() -> None:
        """The state sweep, where this process runs the emit stage (Pipeline.sweep)."""
        pipeline = app.pipeline
        if pipeline is not None:
            await pipeline.sweep()

    @app.timer(interval=1.0)  # type: ignore[untyped-decorator]
    async def watch_stalls() -> None:
        """A stage that handles nothing while records wait, or that Kafka does not answer,
        is reported (log, `storage_events_stage_stuck`, `/ready`). A child process watches
        its own stages; its view is read here, for the progress and ready lines."""
        pipeline = app.pipeline
        if pipeline is not None and not pipeline.progress.stopping:
            await pipeline.watch_stalls()
            await app.child_view()
            app.announce_ready()

    @app.page("/metrics")
    async def metrics_page(web: Any, request: Any) -> Any:
        """This process' metrics, merged with its child's (streams.exposition): a child
        that does not answer is served as of its latest view, so counters never go back."""
        child = app.stage_process
        view = (await child.view() or child.last) if child is not None else None
        text = merge([snapshot(), view.metrics]) if view is not None else generate_latest()
        return web.bytes(text, content_type=CONTENT_TYPE_LATEST.split(";")[0])

    @app.page("/ready")
    async def ready_page(web: Any, request: Any) -> Any:
        """200 once both stages have their partitions and the state is restored, and no
        stage has been unable to make progress for streams.progress.STUCK_AFTER_S; else 503,
        with each stage's state and what it is stuck on (`why`, `for_s`)."""
        ready, stages = app.stage_status(await app.child_view())
        body = {
            "ready": ready,
            "tables_recovered": bool(stages.get("emit", {}).get("assigned")),
            "stages": stages,
        }
        return web.json(body, status=200 if ready else 503)

    return app


def _worker_app() -> StreamsApp:
    """The app `faust -A streams worker` runs: settings loaded and checked first (a mistake
    stops start-up naming the field), then the log filter, then the app."""
    settings = _load()
    _check_data_dir(settings.stream.data_dir)
    install_kafka_log_filter()  # an outage: one line per cause every few seconds (streams.logs)
    return create_app(settings)


app = _worker_app()
