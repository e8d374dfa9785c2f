"""The crafted-file fuzzing matrix (``fuzz.py``) in a fresh process: no payload runs, no file is written,
no module the file names is imported, memory stays bounded, no plain load takes 20 s or runs on a backend the file
names, and every load either raises
FileFormatError or gives a program."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FUZZ = Path(__file__).with_name("fuzz.py")
JSON_BUDGET = 360  # sampled (seeded) from the full matrix of JSON mutations; the member mutations all run


def test_crafted_file_matrix(tmp_path):
    # inductor (the string cases load with backend="inductor" too) keeps its cache beside the sandbox, not in it
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-cache")}
    run = subprocess.run(
        [sys.executable, str(FUZZ), str(tmp_path / "sandbox"), str(JSON_BUDGET)],
        capture_output=True, text=True, timeout=1800, env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    print(json.dumps({k: v for k, v in summary.items() if k != "run_errors"}, indent=1))
    assert summary["failures"] == [], summary["failures"][:20]
    assert summary["passing"] == summary["cases"] >= 600
    assert summary["round_two_cases"]["symbolic"] >= 50 and summary["round_two_cases"]["strings"] >= 40
    assert summary["round_two_cases"]["backend"] >= 20 and summary["round_two_cases"]["specs"] >= 20
    assert set(summary["outcomes"]) <= {"FileFormatError", "loaded and ran", "loaded, run raised torch's RuntimeError"}
    assert summary["outcomes"]["FileFormatError"] > summary["cases"] // 2  # the matrix reaches the checks
    assert summary["rss_growth_mib"] < 256, "a crafted file made loading allocate what it declared"
