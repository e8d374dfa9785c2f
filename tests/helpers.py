"""Assertions shared by tests."""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree


def assert_same_outputs(got, expected, *, atol=0.0, rtol=0.0):
    """Same structure, same dtypes, values equal within the given tolerance (exact by default)."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    assert got_spec == exp_spec, f"output structure differs: {got_spec} vs {exp_spec}"
    for i, (a, b) in enumerate(zip(got_leaves, exp_leaves)):
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"output {i} is {type(a)}"
            assert a.dtype == b.dtype, f"output {i}: dtype {a.dtype} vs {b.dtype}"
            assert a.shape == b.shape, f"output {i}: shape {a.shape} vs {b.shape}"
            torch.testing.assert_close(a, b, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"output {i}: {m}")
        else:
            assert a == b


def snapshot(model: torch.nn.Module) -> dict:
    """Everything compile must not change: tensors (values, dtypes, ids) and training flags."""
    return {
        "state": {k: (v.dtype, v.clone(), v.data_ptr()) for k, v in model.state_dict(keep_vars=True).items()},
        "training": {name: m.training for name, m in model.named_modules()},
    }


def assert_unchanged(model: torch.nn.Module, before: dict) -> None:
    after = snapshot(model)
    assert after["training"] == before["training"]
    assert after["state"].keys() == before["state"].keys()
    for key, (dtype, value, ptr) in before["state"].items():
        dtype2, value2, ptr2 = after["state"][key]
        assert dtype2 == dtype, f"{key} dtype changed"
        assert ptr2 == ptr, f"{key} storage replaced"
        assert torch.equal(value2, value), f"{key} values changed"


def plan_lowering(model, inputs, dtype, *, select=lambda record: True, accumulate=None):
    """A PrecisionPlan that puts the fp32 compute layers chosen by ``select`` (a LayerRecord predicate)
    in ``dtype``, made from a strong-typing compile of the same model."""
    import mixprec
    from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan

    records = mixprec.compile(model, inputs).report.layers
    return PrecisionPlan(
        {
            r.name: NodePrecision(dtype, accumulate, "plan", f"test: {r.name} in {dtype}")
            for r in records
            if r.kind == "compute" and r.precision == torch.float32 and select(r)
        }
    )


def captured(model, inputs):
    """(WorkProgram, GraphInfo) of a model as the compiler sees it: captured, normalised, analysed
    (ir/captured.py's CapturedModel; the tests may change the WorkProgram, it is theirs)."""
    from mixprec.ir.captured import CapturedModel

    model = CapturedModel(model, inputs)
    return model.base, model.info


# ---- issue 5b: inductor backend and ONNX export -------------------------------------------------


def lowered_plan(prog, dtype, *, accumulate=None, every: int = 1):
    """A plan that moves every ``every``-th fp32 layer of ``prog`` to ``dtype`` (others keep their precision)."""
    from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan

    nodes = {}
    for i, (name, decision) in enumerate(prog.plan.items()):
        if decision.precision == torch.float32 and i % every == 0:
            nodes[name] = NodePrecision(dtype, accumulate, "plan", f"test: lowered to {dtype}")
        else:
            nodes[name] = NodePrecision(decision.precision, None, "plan", "test: kept")
    return PrecisionPlan(nodes)


def lowest_precision(prog) -> torch.dtype:
    """The least precise float dtype any layer of ``prog`` computes in (decides what 'rounding' means)."""
    floats = [d.precision for d in prog.plan.values() if d.precision.is_floating_point]
    return max(floats, key=lambda d: torch.finfo(d).eps, default=torch.float32)


def assert_within_rounding(got, expected, dtype: torch.dtype, *, ulps: float = 4.0):
    """Same structure and dtypes; float values within ``ulps`` rounding steps of ``dtype`` of each other,
    relative to the largest expected magnitude of that output (two correct evaluations that round in a
    different order differ by a few rounding steps, a wrong one by far more)."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    assert got_spec == exp_spec, f"output structure differs: {got_spec} vs {exp_spec}"
    eps = torch.finfo(dtype).eps
    for i, (a, b) in enumerate(zip(got_leaves, exp_leaves)):
        assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, f"output {i} differs in kind"
        if not b.dtype.is_floating_point:
            assert torch.equal(a, b), f"output {i} (non-float) differs"
            continue
        scale = max(b.float().abs().max().item(), torch.finfo(torch.float32).tiny)
        torch.testing.assert_close(
            a.float(), b.float(), atol=ulps * eps * scale, rtol=ulps * eps, msg=lambda m: f"output {i}: {m}"
        )


def run_in_threads(work, workers: int, *, start_together: bool = False) -> None:
    """Run ``work(i)`` for i in range(workers) on that many threads; re-raise the first error a thread hit.

    ``start_together``: the threads wait at a barrier so their calls overlap."""
    import threading

    errors = []
    barrier = threading.Barrier(workers) if start_together else None

    def run(i):
        if barrier is not None:
            barrier.wait()
        try:
            work(i)
        except BaseException as e:  # collected here, re-raised in the calling thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise AssertionError(f"{len(errors)} of {workers} threads failed; the first: {errors[0]!r}") from errors[0]


class FixedSpeed:
    """An autocast speed measurer (``mixprec.weak_typing.speed``'s interface) that answers a fixed speed-up of the low
    type over fp32: ``by_op`` per op packet ("aten.linear"), ``default`` for the rest. ``asked`` records each
    call (layer name, low type, backend of the cost model asked with), so a test sees what the check measured."""

    def __init__(self, default: float | None = 2.0, by_op: dict | None = None):
        self.default, self.by_op, self.asked = default, dict(by_op or {}), []

    def speedups(self, nodes, low, costs, grids=None):
        from mixprec.ops.names import op_name, packet_name

        self.asked += [(node.name, low, costs.target.backend) for node in nodes]
        return [self.by_op.get(packet_name(op_name(node.target)), self.default) for node in nodes]


def with_payload(report_json: dict, payload: str) -> dict:
    """A copy of a report's JSON with ``payload`` added to every free-text field the reader accepts (layer names,
    ops, modules, sources, reasons, runs_as, tensor names, timing keys; graph node names, ops, modules and roles):
    what a crafted file can put wherever a report is printed or drawn."""
    import copy

    data = copy.deepcopy(report_json)
    for layer in data["layers"]:
        for key in ("name", "op", "module", "module_type", "source", "reason"):
            layer[key] += payload
        layer["runs_as"] = (layer.get("runs_as") or "f32 on ") + payload
        for tensor in layer["inputs"] + layer["outputs"]:
            tensor["name"] += payload
        layer["timings"] = {"bfloat16" + payload: {"note" + payload: payload}}
    for node in data["graph"]["nodes"]:
        for key in ("name", "op", "module"):
            node[key] += payload
        node["role"] = (node.get("role") or "") + payload
    return data
