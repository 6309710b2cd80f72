#!/usr/bin/env bash
# The fast suites (tests/unit, tests/normalizers: no broker) on the other Pythons the project
# supports, each in its own virtualenv (.venv-3.X, the core interpreted): the full suite runs
# on the one `make test` made .venv with. A Python that is not on this machine is named in one
# line and skipped; a failing suite fails the run. Usage: dev/other_pythons.sh 3.12 3.13
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
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
    echo "make test: python$version is not on this machine: its fast suites are skipped"
    continue
  fi
  venv=".venv-$version"
  if [ ! -e "$venv/.installed-test" ] || [ pyproject.toml -nt "$venv/.installed-test" ] \
      || [ fileevents/pyproject.toml -nt "$venv/.installed-test" ]; then
    echo "make test: installing the project and its test tools for Python $version into $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv" || { status=1; continue; }
    "$venv/bin/pip" install --quiet --upgrade pip
    PYTHONWARNINGS=ignore::Warning:setuptools.command.editable_wheel \
      "$venv/bin/pip" install --quiet -e ./fileevents -e '.[test]' || { rm -rf "$venv"; status=1; continue; }
    touch "$venv/.installed-test"
  fi
  echo "make test: the fast suites (tests/unit, tests/normalizers) on Python $version"
  STORAGE_EVENTS_PURE=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    -m "not kafka and not slow" tests/unit tests/normalizers || status=1
done
exit $status
