#!/usr/bin/env bash
# The fileevents distribution alone, as a service installs it: for each Python version given,
# a virtualenv of its own (.venv-fileevents-3.X) holding `pip install ./fileevents[test]` and
# nothing of storage-events, and the distribution's suite (tests/fileevents-alone) run there,
# from outside the repository (so that `streams` cannot be imported from the working
# directory), against one local broker this script starts and stops (dev/kafka/localkafka.py).
# A Python that is not on this machine is named in one line and skipped; a failing suite fails
# the run. Usage: dev/fileevents-alone.sh 3.10 3.13
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
host_python="${HOST_PYTHON:-$root/.venv/bin/python}"
status=0

pythons=()
for version in "$@"; do
  python=""
  # On the PATH, else one pyenv installed without making it global (its shim then refuses).
  for candidate in "$(command -v "python$version" || true)" \
      "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version"*/bin/"python$version"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" -c 'import venv' >/dev/null 2>&1; then
      python="$candidate"
      break
    fi
  done
  if [ -z "$python" ]; then
    echo "make test: python$version is not on this machine: the fileevents distribution is not tested on it"
    continue
  fi
  pythons+=("$version=$python")
done
[ ${#pythons[@]} -gt 0 ] || exit 0

# One broker for every version, on a free pair of ports, removed when this script ends.
port="$(cd "$root" && "$host_python" -c 'from dev.kafka.private import free_port_pair; print(free_port_pair())')" || exit 1
broker_dir="$(mktemp -d "${TMPDIR:-/tmp}/fileevents-dist-kafka.XXXXXX")"
workdir="$(mktemp -d "${TMPDIR:-/tmp}/fileevents-dist-run.XXXXXX")"
export LOCAL_KAFKA_DIR="$broker_dir" LOCAL_KAFKA_PORT="$port"
cleanup() {
  "$host_python" "$root/dev/kafka/localkafka.py" stop >/dev/null 2>&1
  rm -rf "$broker_dir" "$workdir"
}
trap cleanup EXIT
bootstrap="$("$host_python" "$root/dev/kafka/localkafka.py" start --fresh | tail -n 1)" || {
  echo "make test: the fileevents distribution's suites need a broker, and it did not start" >&2
  exit 1
}

# setuptools builds a non-editable install in the source tree (fileevents/build): removed after
# each, so that no stale copy of a module outlives its source.
trap 'cleanup; rm -rf "$root/fileevents/build"' EXIT

for entry in "${pythons[@]}"; do
  version="${entry%%=*}"
  python="${entry#*=}"
  venv="$root/.venv-fileevents-$version"
  if [ ! -e "$venv/.installed" ] || [ fileevents/pyproject.toml -nt "$venv/.installed" ]; then
    echo "make test: a fresh virtualenv for Python $version with the fileevents distribution alone: $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv" || { status=1; continue; }
    "$venv/bin/pip" install --quiet --upgrade pip setuptools || { rm -rf "$venv"; status=1; continue; }
    "$venv/bin/pip" install --quiet "./fileevents[test]" || { rm -rf "$venv"; status=1; continue; }
    touch "$venv/.installed"
  else
    # The dependencies are there: the distribution itself again, built from the working tree.
    "$venv/bin/pip" install --quiet --no-deps --no-build-isolation --force-reinstall ./fileevents \
      || { status=1; continue; }
  fi
  echo "make test: the fileevents distribution's suite on Python $version, installed alone"
  (cd "$workdir" && FILEEVENTS_DIST_ALONE=1 FILEEVENTS_TEST_BOOTSTRAP="$bootstrap" \
    "$venv/bin/python" -m pytest -q -c "$root/tests/fileevents-alone/alone.ini" \
      --rootdir "$root/tests/fileevents-alone" "$root/tests/fileevents-alone") || status=1
done
exit $status
