"""``mixprec compile`` options: one per keyword of ``mixprec.compile`` (API.md §1, §5), as Torch-TensorRT spells them:

    --autocast [TYPE]            enable_autocast=True (+ autocast_low_precision_type=TYPE)
    --exclude-nodes RE           autocast_excluded_nodes (repeatable)
    --exclude-ops OP             autocast_excluded_ops (repeatable)
    --include-nodes RE           autocast_included_nodes (repeatable; mixprec extension)
    --include-ops OP             autocast_included_ops (repeatable; mixprec extension)
    --low-precision-embeddings   autocast_low_precision_embeddings=True (mixprec extension)
    --no-require-speedup         autocast_require_speedup=False (mixprec extension)
    --max-output-threshold X     autocast_max_output_threshold
    --max-depth-of-reduction N   autocast_max_depth_of_reduction
    --calibration-data PT        autocast_calibration_dataloader (a .pt list of input tuples)
    --fp32-acc                   use_fp32_acc=True
    --no-explicit-typing         use_explicit_typing=False (weak typing)
    --enabled-precisions LIST    enabled_precisions (comma separated: fp32,bf16)
    --no-keep-io-types           keep_io_types=False
    --plan PLAN.json             plan=PrecisionPlan.from_json(...)
    --no-int8-require-speedup    int8_require_speedup=False (mixprec extension)
    --backend NAME               backend (the names the backend registry knows)
    --debug                      debug=True

Only options the user gave become keywords, so ``mixprec.compile`` validates exactly what was asked for
(an autocast-only option without ``--autocast`` is an error there, with its message, not silently ignored here).
"""

from __future__ import annotations

import argparse

from ..backends import known_backends
from .spec import UsageError, load_calibration


def add_compile_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("precision options (mirror the keywords of mixprec.compile)")
    g.add_argument(
        "--autocast",
        nargs="?",
        const="",
        default=None,
        metavar="TYPE",
        type=_low_type,
        help="rule-based autocast of the remaining fp32 layers to TYPE (bf16 or fp16; default: bf16 on "
        "CPU, fp16 on CUDA)",
    )
    g.add_argument(
        "--exclude-nodes",
        action="append",
        default=[],
        metavar="RE",
        help="keep layers whose module path or node name matches RE in fp32 (repeatable)",
    )
    g.add_argument(
        "--exclude-ops",
        action="append",
        default=[],
        metavar="OP",
        help="keep layers of this op in fp32, e.g. aten.softmax (repeatable)",
    )
    g.add_argument(
        "--include-nodes",
        action="append",
        default=[],
        metavar="RE",
        help="force layers whose module path or node name matches RE into the low type over the automatic "
        "rules (repeatable; an --exclude-nodes/--exclude-ops match wins)",
    )
    g.add_argument(
        "--include-ops",
        action="append",
        default=[],
        metavar="OP",
        help="force layers of this op into the low type over the automatic rules, e.g. aten.linear (repeatable)",
    )
    g.add_argument(
        "--low-precision-embeddings",
        action="store_true",
        help="store embedding tables in the low type (saves memory; by default they stay fp32, as the residual "
        "stream starts there)",
    )
    g.add_argument(
        "--no-require-speedup",
        action="store_true",
        help="lower layers even where the low type is measured no faster than fp32 on this machine (by default they "
        "stay fp32 and the report quotes the measurement); a preview of the numerics",
    )
    g.add_argument(
        "--max-output-threshold",
        type=_threshold,
        default="default",
        metavar="X",
        help="keep layers with |values| above X on their inputs or outputs in fp32; a number applies to either "
        "low type, 'inf' or 'none' turns the rule off (default: 'default', 512 for fp16 and a guard of bf16's own "
        "overflow, 1e36, for bf16)",
    )
    g.add_argument(
        "--max-depth-of-reduction",
        type=int,
        metavar="N",
        help="keep layers reducing over more than N elements (matmul K, conv C_in*kernel) in fp32",
    )
    g.add_argument(
        "--calibration-data",
        metavar="PT",
        help="calibration batches for the autocast rules (.pt: a list of input tuples)",
    )
    g.add_argument("--fp32-acc", action="store_true", help="fp16/bf16 matmul-class layers accumulate in fp32")
    g.add_argument(
        "--no-explicit-typing", action="store_true", help="weak typing: pick per layer among --enabled-precisions"
    )
    g.add_argument("--enabled-precisions", metavar="LIST", help="comma separated, e.g. fp32,bf16 (weak typing)")
    g.add_argument(
        "--no-keep-io-types",
        action="store_true",
        help="outputs leave in their producing layer's dtype (Torch-TensorRT behaviour)",
    )
    g.add_argument("--plan", metavar="JSON", help="a precision plan (PrecisionPlan JSON) to honour")
    g.add_argument(
        "--no-int8-require-speedup",
        action="store_true",
        help="keep the plan's int8 layers int8 on eager/inductor even where int8 is measured no faster than fp32 "
        "on this machine (by default they stay fp32 and the report quotes the measurement)",
    )
    g.add_argument(
        "--backend",
        choices=sorted(known_backends()),
        metavar="NAME",
        help=f"the backend that runs the program: {', '.join(sorted(known_backends()))} (default eager)",
    )
    add_cost_cache_option(g)


def add_cost_cache_option(group) -> None:
    """--cost-cache PATH|off: the cost_cache keyword of compile and search (measure/cost_file.py)."""
    group.add_argument(
        "--cost-cache",
        metavar="PATH",
        help="where measured speeds are kept between runs, or 'off' (default: $MIXPREC_COST_CACHE, else "
        "~/.cache/mixprec/costs.json)",
    )


_OPTION_OF = {
    "enable_autocast": "--autocast",
    "autocast_low_precision_type": "--autocast TYPE",
    "autocast_excluded_nodes": "--exclude-nodes",
    "autocast_excluded_ops": "--exclude-ops",
    "autocast_included_nodes": "--include-nodes",
    "autocast_included_ops": "--include-ops",
    "autocast_low_precision_embeddings": "--low-precision-embeddings",
    "autocast_require_speedup": "--no-require-speedup",
    "int8_require_speedup": "--no-int8-require-speedup",
    "autocast_max_output_threshold": "--max-output-threshold",
    "autocast_max_depth_of_reduction": "--max-depth-of-reduction",
    "autocast_calibration_dataloader": "--calibration-data",
    "use_fp32_acc": "--fp32-acc",
    "use_explicit_typing": "--no-explicit-typing",
    "enabled_precisions": "--enabled-precisions",
    "keep_io_types": "--no-keep-io-types",
    "cost_cache": "--cost-cache",
}


def option_hint(message: str) -> str:
    """' On the command line, --exclude-nodes sets autocast_excluded_nodes; ...' for keywords a message names."""
    named = [f"{option} sets {keyword}" for keyword, option in _OPTION_OF.items() if keyword in message]
    return f" (On the command line, {'; '.join(named)}.)" if named else ""


def _low_type(text: str) -> str:
    """--autocast's optional TYPE; a SPEC taken for it by argparse gets a message saying what happened."""
    if text.lower().removeprefix("torch.") in ("bf16", "bfloat16", "fp16", "float16", "half", ""):
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a low-precision type (bf16 or fp16); write --autocast=bf16, or put SPEC before --autocast"
    )


def _threshold(text: str):
    """--max-output-threshold: "default", "none" (no IO-range rule, as None) or a number (inf included); mixprec.compile
    judges the number itself."""
    if text.strip().lower() == "default":
        return "default"
    if text.strip().lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number, 'inf', 'none' or 'default'") from None


def compile_kwargs(args: argparse.Namespace) -> dict:
    """The keywords of mixprec.compile that the given options stand for (only those given)."""
    kwargs: dict = {}
    if args.autocast is not None:
        kwargs["enable_autocast"] = True
        if args.autocast:
            kwargs["autocast_low_precision_type"] = args.autocast
    if args.exclude_nodes:
        kwargs["autocast_excluded_nodes"] = tuple(args.exclude_nodes)
    if args.exclude_ops:
        kwargs["autocast_excluded_ops"] = tuple(args.exclude_ops)
    if args.include_nodes:
        kwargs["autocast_included_nodes"] = tuple(args.include_nodes)
    if args.include_ops:
        kwargs["autocast_included_ops"] = tuple(args.include_ops)
    if args.low_precision_embeddings:
        kwargs["autocast_low_precision_embeddings"] = True
    if args.no_require_speedup:
        kwargs["autocast_require_speedup"] = False
    if args.max_output_threshold != "default":  # the default is the keyword's own: passed only when changed
        kwargs["autocast_max_output_threshold"] = args.max_output_threshold
    if args.max_depth_of_reduction is not None:
        kwargs["autocast_max_depth_of_reduction"] = args.max_depth_of_reduction
    if args.calibration_data:
        kwargs["autocast_calibration_dataloader"] = load_calibration(args.calibration_data)
    if args.fp32_acc:
        kwargs["use_fp32_acc"] = True
    if args.no_explicit_typing:
        kwargs["use_explicit_typing"] = False
    if args.enabled_precisions:
        kwargs["enabled_precisions"] = {p.strip() for p in args.enabled_precisions.split(",") if p.strip()}
    if args.no_keep_io_types:
        kwargs["keep_io_types"] = False
    if args.plan:
        kwargs["plan"] = _read_plan(args.plan)
    if args.no_int8_require_speedup:
        kwargs["int8_require_speedup"] = False
    if args.backend:
        kwargs["backend"] = args.backend
    if args.debug:
        kwargs["debug"] = True
    if args.cost_cache is not None:
        kwargs["cost_cache"] = args.cost_cache
    return kwargs


def _read_plan(path: str):
    from ..plan.precision_plan import PrecisionPlan

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as e:
        raise UsageError(f"the plan file {path} cannot be read ({e.strerror}).") from e
    return PrecisionPlan.from_json(text)
