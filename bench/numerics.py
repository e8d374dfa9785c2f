"""Cost of the one error measurement (mixprec/numerics.py) against the report's previous one.

    python bench/numerics.py [--rev REV]

The report's ``output_errors`` before numerics.py (read from git at REV, default 0dda8b8) and
``numerics.output_errors`` now, interleaved in one process (medians of rounds), on logits-sized
outputs: 4 x 128 x 32000 values (16.4 M; a GPT-2-sized vocabulary), the mixed output being the
fp32 reference rounded through bf16; once all finite, once with one inf in every chunk on both
sides (numerics' slow path). Both return the same numbers on these inputs (checked).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import interleaved, machine, stamp, table  # noqa: E402

from mixprec.output import numerics  # noqa: E402


def previous_output_errors(rev: str):
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(
        ["git", "-C", str(root), "show", f"{rev}:src/mixprec/report/summary.py"], check=True, capture_output=True, text=True
    ).stdout
    source = source.replace("from ..dtypes import", "from mixprec.dtypes import").replace(
        "from .records import", "from mixprec.output.report.records import"
    )
    namespace: dict = {}
    exec(compile(source, f"{rev}:report/summary.py", "exec"), namespace)  # noqa: S102 - our own file from git
    return namespace["output_errors"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rev", default="0dda8b8")
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/{Path(__file__).name} --rev {args.rev}")
    before = previous_output_errors(args.rev)
    reference = torch.randn(4, 128, 32000)
    mixed = reference.bfloat16().float()
    with_inf = reference.clone().reshape(-1)
    with_inf[:: numerics.CHUNK] = math.inf
    with_inf = with_inf.reshape(reference.shape)
    mixed_inf = with_inf.bfloat16().float()
    rows = []
    for label, got, ref in (("all finite", mixed, reference), ("an inf per chunk", mixed_inf, with_inf)):
        old, new = before(got, ref), numerics.output_errors(got, ref)
        assert all(math.isclose(old[k], new[k], rel_tol=1e-9) for k in old), (old, new)
        seconds = interleaved(
            {"before": lambda: before(got, ref), "numerics": lambda: numerics.output_errors(got, ref)},
            rounds=7,
            warmup=1,
        )
        rows.append({"outputs": label, "values": f"{got.numel() / 1e6:.1f} M", "before ms": seconds["before"] * 1e3,
                     "numerics ms": seconds["numerics"] * 1e3, "numerics / before": seconds["numerics"] / seconds["before"],
                     "rel-L2": new["rel_l2_error"]})  # fmt: skip
    print(table(rows, ["outputs", "values", "before ms", "numerics ms", "numerics / before", "rel-L2"]))


if __name__ == "__main__":
    main()
