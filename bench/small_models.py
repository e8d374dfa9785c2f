"""Accuracy figures of the README on the small test models (tests/models.py: bert_small, gpt2_small,
vit_small — random weights, example inputs): autocast in bf16 and fp16, and mixprec.search against it.

    python bench/small_models.py

For each model: autocast's rel-L2 error against fp32, low-precision FLOP share and parameter bytes
after/before, in bf16 and fp16; then search with autocast's (bf16) error as the tolerance, and with half
of it (phase 1 from the cache), with the FLOP share, error and time each reached.
"""

from __future__ import annotations

import importlib.util  # noqa: E402
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import machine, stamp, table  # noqa: E402

_spec = importlib.util.spec_from_file_location("test_models", Path(__file__).resolve().parents[1] / "tests" / "models.py")
_test_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_test_models)  # tests/models.py (bench/models.py has the same module name)
bert_small, gpt2_small, vit_small = _test_models.bert_small, _test_models.gpt2_small, _test_models.vit_small

import mixprec  # noqa: E402
from mixprec.output.numerics import output_errors  # noqa: E402
from mixprec.searching import SearchCache  # noqa: E402


def main():
    torch.set_num_threads(2)
    warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)
    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/{Path(__file__).name}")
    auto_rows, search_rows = [], []
    for build in (bert_small, gpt2_small, vit_small):
        torch.manual_seed(0)
        model, inputs = build()
        with torch.no_grad():
            expected = model(*inputs)
        errors = {}
        for low in (torch.bfloat16, torch.float16):
            prog = mixprec.compile(model, inputs, enable_autocast=True, autocast_low_precision_type=low)
            s = prog.report.summary
            errors[low] = output_errors(prog(*inputs), expected)["rel_l2_error"]
            auto_rows.append({"model": build.__name__, "low": str(low).removeprefix("torch."), "rel-L2": errors[low],
                              "low FLOP share": s["low_precision_flops_fraction"],
                              "param bytes after/before": s["param_bytes_after"] / s["param_bytes_before"]})
        cache = SearchCache()
        for label, tolerance in (("autocast's error", errors[torch.bfloat16]), ("half of it", errors[torch.bfloat16] / 2)):
            start = time.perf_counter()
            result = mixprec.search(model, inputs, tolerance=tolerance, cache=cache)
            seconds = time.perf_counter() - start
            point = result.chosen
            search_rows.append({"model": build.__name__, "tolerance": f"{label} ({tolerance:.2e})",
                                "low FLOP share": point.low_precision_flops_fraction, "rel-L2": point.metric,
                                "groups": len(result.groups), "s": seconds})
    print("\nautocast (enable_autocast=True) on the example inputs:")
    print(table(auto_rows, list(auto_rows[0])))
    print("\nmixprec.search (bf16) against it; the second search reuses phase 1 from the cache:")
    print(table(search_rows, list(search_rows[0])))


if __name__ == "__main__":
    main()
