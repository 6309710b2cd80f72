#!/usr/bin/env bash
# Runs a side job beside a main one, so that `make test`'s suites on the other Pythons do not
# add their minutes to the main suite's: the main suite waits on its broker much of the time,
# and the side job (niced, so the main suite keeps priority for the CPU) takes that slack.
# The side job's output is kept in a file and printed once the main command has ended, so the
# main suite's output reads as before; the exit status is the main command's if it failed,
# else the side job's. Interrupted, both stop.
# Usage: dev/beside.sh "<side shell command>" <main command> [args...]
set -uo pipefail
side_command="$1"
shift
side_log="$(mktemp "${TMPDIR:-/tmp}/make-test-side.XXXXXX")"
# The side job in a process group of its own, so that an interruption stops all of it
# (its brokers included: their scripts' traps run on TERM).
set -m
nice -n 19 bash -c "$side_command" >"$side_log" 2>&1 &
side_pid=$!
set +m
stop_side() {
  kill -TERM -- "-$side_pid" 2>/dev/null
  wait "$side_pid" 2>/dev/null
  rm -f "$side_log"
}
trap 'stop_side; exit 130' INT TERM
echo "make test: the other Pythons' suites run beside this one (niced); their output follows it"
"$@"
main_status=$?
wait "$side_pid"
side_status=$?
trap - INT TERM
cat "$side_log"
rm -f "$side_log"
if [ "$main_status" -ne 0 ]; then
  exit "$main_status"
fi
exit "$side_status"
