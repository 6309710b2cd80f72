# syntax=docker/dockerfile:1
# One image for the worker and every bridge; k8s/ sets the command of each pod:
#   faust -A streams worker                 the stream (the default command)
#   python -m connectors <bridge>           webhook, sqs, azure-queue, pubsub, reconcile
#   python -m streams <command>             topics, replay-dead-letters, ...
# Build: docker build -t storage-events:0.1.0 .
# The base image is pinned by its full version tag; pin its digest as well where you build
# (python:3.11.17-slim-trixie@sha256:...), and bump both together.

FROM python:3.11.17-slim-trixie AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY streams ./streams
COPY connectors ./connectors
COPY fileevents ./fileevents
# A regular (non-editable) install: the runtime stage gets the venv and nothing of /src. The
# consumer library's distribution (fileevents/, a dependency of the project on no index) with it.
RUN pip install --no-cache-dir ./fileevents . \
    && pip check

FROM python:3.11.17-slim-trixie AS runtime
LABEL org.opencontainers.image.title="storage-events" \
      org.opencontainers.image.description="Object-storage notifications as one clean Kafka topic per storage instance: Faust worker and bridges"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    STREAMS_DATA_DIR=/var/lib/storage-events \
    STREAMS_WEB_HOST=0.0.0.0
# A fixed, unprivileged uid/gid, matched by runAsUser/runAsGroup/fsGroup in k8s/.
RUN groupadd --system --gid 10001 storage-events \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin storage-events \
    && mkdir -p /var/lib/storage-events \
    && chown 10001:10001 /var/lib/storage-events
COPY --from=build /opt/venv /opt/venv
WORKDIR /var/lib/storage-events
USER 10001:10001
# worker /ready and /metrics; webhook; pull bridges' --metrics-port (k8s/ uses 9102)
EXPOSE 6066 8080 9102
CMD ["faust", "-A", "streams", "worker", "-l", "info"]
