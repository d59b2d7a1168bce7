# Sourced by scripts/test and scripts/demo: make sure $venv exists with the package and its
# dev extras installed (again only when pyproject.toml changed).
# VENV picks the folder (.venv), PYTHON the interpreter for a new one (python3),
# EXTRA_PIP more pip arguments (CI's Django 6 run).
venv="${VENV:-.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "pgbus-workflows needs Python 3.11+: set PYTHON=python3.12 (or another 3.11+)" >&2
    exit 1
  fi
  echo "Creating $venv and installing pgbus-workflows with its dev extras (first run only)..."
  "$python" -m venv "$venv"
fi
stamp="$venv/.pgbus-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  # shellcheck disable=SC2086 # EXTRA_PIP is a list of words
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[dev]" ${EXTRA_PIP:-}
  touch "$stamp"
fi
