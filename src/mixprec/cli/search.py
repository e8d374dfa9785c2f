"""``mixprec search SPEC [...]``: find a plan with as many layers in low precision as a budget allows.

``--eval-data``/``--calibration-data`` name a function the same way as SPEC
(``file.py:function``) that returns an iterable of input tuples.
"""

from __future__ import annotations

import argparse

from .options import add_cost_cache_option

HELP = ("find a mixed-precision plan: as many layers in low precision (or the fastest fp32/bf16/int8 mix) as a "
        "tolerance allows")
DESCRIPTION = (
    "Measure every layer group's sensitivity to low precision, then lower groups cumulatively as far as --tolerance "
    "(rel-L2 error against fp32 on the eval data, default 1e-2) allows, or keep --keep-fp32-fraction of the most "
    "sensitive ones in fp32. Writes the plan (for mixprec compile --plan, or "
    "mixprec.compile(..., plan=PrecisionPlan.from_json(text))), the whole result as JSON and a pareto plot."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="path/to/file.py:function returning (model, example_inputs), or a .pt2 file (read with "
        "torch.export.load, which unpickles it: give only .pt2 files you exported yourself)")
    parser.add_argument("--low-precision", "--low", dest="low", metavar="TYPE[,TYPE]", default=None,
                        help="low precision type(s): bf16, fp16, int8, w8a16 or w4a16 (weight-only int8/int4 Linears), "
                        "or several comma-separated (e.g. int8,bf16 or w4a16,w8a16,bf16: "
                        "each layer group stays fp32 or takes the type that saves most time within the budget; "
                        "default: bf16 on CPU, fp16 on CUDA)")
    parser.add_argument("--backend", default=None, help="with several low types: the backend whose speed per type "
                        "the search weighs (e.g. openvino; default: the eager programs it measures)")
    parser.add_argument("--decode", action=argparse.BooleanOptionalAction, default=None,
                        help="with several low types: time Linears in the decode shape (one row, memory-bound), "
                        "where w8a16/w4a16 gain (default: when every eval batch is token ids of at most 8 tokens)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--tolerance", type=float, default=None, help="largest rel-L2 error against fp32 (default 1e-2)")
    budget.add_argument("--keep-fp32-fraction", type=float, default=None, metavar="F", help="keep this share of the most sensitive layer groups in fp32 (0..1)")
    parser.add_argument("--inputs", metavar="PT", help="example inputs (.pt: a tensor or a tuple of them)")
    parser.add_argument("--eval-data", metavar="FILE.py:FUNCTION", default=None, help="function returning the eval batches (default: the example inputs)")
    parser.add_argument("--calibration-data", metavar="FILE.py:FUNCTION", default=None, help="function returning batches for the safety checks (default: the eval data)")
    parser.add_argument("--include-nodes", action="append", default=[], metavar="RE", help="layers (module path or node name, re.match) the safety rules must not pin to fp32 (repeatable)")
    parser.add_argument("--include-ops", action="append", default=[], metavar="OP", help="ops the safety rules must not pin to fp32, e.g. aten.linear (repeatable)")
    parser.add_argument("--ray", metavar="ADDRESS", default=None, help="run the trials on a Ray cluster: local (start one on this machine for the run), auto (join this machine's cluster) or ray://host:port (needs pip install 'mixprec[ray]')")
    parser.add_argument("--workers", type=int, default=None, metavar="N", help="trials that run at once on the Ray cluster (default: its CPUs); needs --ray")
    parser.add_argument("-o", "--plan", metavar="PLAN.json", default=None, help="write the chosen PrecisionPlan as JSON")
    parser.add_argument("--json", metavar="RESULT.json", default=None, help="write the whole search result as JSON")
    parser.add_argument("--plot", metavar="PARETO.png", default=None, help="write the pareto curve and sensitivities as a PNG (needs matplotlib)")
    parser.add_argument("-q", "--quiet", action="store_true", help="do not print the result table")
    add_cost_cache_option(parser)


def search_command(args) -> int:
    import sys

    import mixprec

    from .commands import check_writable, say, write_text
    from .spec import UsageError, call_function, load_inputs, load_spec

    check_writable(args.plan, args.json, args.plot)
    model, inputs, _ = load_spec(args.spec)
    if args.inputs:
        inputs = load_inputs(args.inputs)
    if inputs is None:
        raise UsageError(f"{args.spec} carries no example inputs; pass --inputs FILE.pt (a tensor or a tuple of them).")
    result = mixprec.search(
        model,
        inputs,
        low_precision_type=args.low,
        tolerance=args.tolerance,
        keep_fp32_fraction=args.keep_fp32_fraction,
        eval_dataloader=call_function(args.eval_data, "--eval-data") if args.eval_data else None,
        calibration_dataloader=call_function(args.calibration_data, "--calibration-data") if args.calibration_data else None,
        progress_stream=sys.stderr,
        included_nodes=tuple(args.include_nodes),
        included_ops=tuple(args.include_ops),
        ray_address=args.ray,
        workers=args.workers,
        backend=args.backend,
        decode=args.decode,
        cost_cache=args.cost_cache,
    )
    if args.plan:
        write_text(args.plan, result.plan.to_json())
    if args.json:
        write_text(args.json, result.to_json())
    if args.plot:
        result.save_plot(args.plot)
    if not args.quiet:
        say(str(result))
    return 0
