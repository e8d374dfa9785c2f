"""The inductor backend: run the rewritten graph as TorchInductor's fused kernels.

``backend="inductor"`` compiles the rewritten ExportedProgram's module with
``torch.compile(backend="inductor")``. The factory needs nothing but the
ExportedProgram, so a saved program is rebuilt on load by compiling again (the
ExportedProgram is what gets saved). We chose recompiling over an AOTInductor
package: inductor's on-disk cache makes a second compile cheap while an AOTI package
is rebuilt in full each time, and an AOTI shared library is tied to the torch build
and CPU ISA it was made on, while the ExportedProgram loads wherever the same torch runs.

Numerics: the plan decides where values are rounded to fp16/bf16, and the report
measured the error of exactly those roundings, so the program is compiled to round
where eager PyTorch does (:data:`INDUCTOR_OPTIONS`), not once at the end of a fused chain.

Dynamic shapes: dimensions captured as dynamic are marked dynamic with the same bounds
before the first compile, so other batch sizes run without recompiling. Threads:
``torch.compile``'s compiler is not thread-safe, so a call with unseen input shapes
compiles under a lock (:class:`InductorRunner`).
"""

from __future__ import annotations

import threading
from types import MappingProxyType

import torch
import torch.utils._pytree as pytree

from ..errors import InputMismatchError, UnsupportedModelError
from ..ir.graph_info import size_hint
from ..ir.input_check import InputCheck
from ..ir import unlift
from .registry import register_backend
from .lowering import run_passes
from .lowering.qdq import INT8_LINEARS, QDQ_ATEN

# Inductor settings every mixprec program is compiled with. When inductor fuses a chain of low-precision
# elementwise ops it by default keeps the intermediates in fp32 and rounds once at the end (sixteen bf16 ops in a row
# drifted up to two bf16 steps from eager): more accurate, but not the program the plan describes, nor what the eager
# backend or a GPU running the ops one by one computes. With ``emulate_precision_casts`` every op whose output (or an
# input) is fp16/bf16 rounds as eager PyTorch does, and explicit casts are never folded away (that chain is then
# bit-identical to eager). What may still differ: fp32 reductions (layer norm, softmax) summed in another order, and
# scalar constants that inductor rounds to the tensor's dtype before use (one step of that dtype) — float rounding,
# not precision.
INDUCTOR_OPTIONS = MappingProxyType({"emulate_precision_casts": True})

# Input signatures remembered for the lock-free path; past this, unseen ones keep taking the lock.
_MAX_SIGNATURES = 256


@register_backend("inductor")
def build(exported_program, options=None):  # backends.options.BackendOptions: nothing here reads them
    """Compile ``exported_program`` with TorchInductor and warm it up on its example inputs."""
    return InductorRunner(exported_program)


class InductorRunner(torch.nn.Module):
    """The compiled program: callable like the model, safe to call from several threads.

    ``torch.compile``'s compiler is not thread-safe (pytorch/pytorch#118260; here, four threads making the first
    call at once each compiled their own graph). The program is compiled at build time on the example inputs, and
    any call whose input shapes/strides were not seen before runs under a lock, so at most one thread compiles at a
    time while calls with known shapes run concurrently.
    """

    def __init__(self, exported_program):
        super().__init__()
        self.module = unlift.of_exported(exported_program)
        # int8 layers on the int8 GEMM where this CPU computes it exactly (same numerics), then the other
        # quantize/dequantize as ATen ops, which inductor fuses (backends/lowering/qdq.py)
        run_passes(self.module, (INT8_LINEARS, QDQ_ATEN))
        self._inputs = _user_input_metas(exported_program)
        self._check = InputCheck.of(exported_program)  # what a call's inputs are checked against, prepared once
        self._ranges = {str(k): (v.lower, v.upper) for k, v in exported_program.range_constraints.items()}
        # the module's forward, not the module: a call then skips nn.Module's and GraphModule's call wrappers, as
        # torch.compile(model) does (a few microseconds per call of a small model); kept out of the module tree
        self.__dict__["_compiled"] = torch.compile(
            self.module.forward, backend="inductor", fullgraph=True, options=dict(INDUCTOR_OPTIONS)
        )
        self._lock = threading.Lock()
        self._seen: set = set()
        self._warm_up(exported_program)

    def forward(self, *args, **kwargs):
        self._check.tensors(args, kwargs)  # before compiling for new shapes
        return self.run_checked(*args, **kwargs)

    def run_checked(self, *args, **kwargs):
        """The call, its inputs already checked against the program (``MixedPrecisionModule`` checks them once)."""
        leaves = self._check.leaves(args, kwargs)
        key = _signature(leaves)
        if key is not None and key in self._seen:
            if not torch.is_grad_enabled():
                return self._compiled(*args, **kwargs)
            with torch.no_grad():
                return self._compiled(*args, **kwargs)
        with torch.no_grad(), self._lock:
            out = self._compiled(*args, **kwargs)
            if key is not None and len(self._seen) < _MAX_SIGNATURES:
                self._seen.add(key)
            return out

    def _warm_up(self, exported_program) -> None:
        """The first compile, on the example inputs. Dimensions the program was captured with as dynamic (its
        ``range_constraints``) are marked dynamic with the same bounds first, so other batch sizes run without
        recompiling (dynamo still specialises size 1, which compiles once more on first use)."""
        args, kwargs = _warm_up_inputs(exported_program, self._inputs)
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        for tensor, (_, val) in zip(tensors, self._inputs):
            for dim, size in enumerate(val.shape):
                bounds = self._bounds(size)
                if bounds is not None:
                    torch._dynamo.mark_dynamic(tensor, dim, min=bounds[0], max=bounds[1])
        try:
            self.forward(*args, **kwargs)
        except (InputMismatchError, UnsupportedModelError):
            raise
        except Exception as e:  # inductor raises many types; all mean "could not compile this graph"
            raise UnsupportedModelError(
                f"TorchInductor could not compile this program: {_first_line(e)}\n"
                "Compile with backend='eager' (same numerics, no fused kernels); inductor needs a working C++ "
                "compiler on CPU.",
                reason=str(e),
            ) from e

    def _bounds(self, size) -> tuple[int, int | None] | None:
        """(min, max) of a dynamic dimension whose size is a plain symbol; None for static ones."""
        if not isinstance(size, torch.SymInt):
            return None
        lower, upper = self._ranges.get(str(size.node.expr), (None, None))
        if lower is None:
            return None
        return int(lower), (int(upper) if upper.is_finite else None)


def _user_input_metas(exported_program) -> list[tuple[str, torch.Tensor]]:
    """(name, fake value) of every user input tensor, in the order of the flattened call arguments."""
    from torch.export.graph_signature import InputKind

    user = {s.arg.name for s in exported_program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    return [
        (n.name, n.meta["val"])
        for n in exported_program.graph.nodes
        if n.op == "placeholder" and n.name in user and isinstance(n.meta.get("val"), torch.Tensor)
    ]


def _warm_up_inputs(exported_program, inputs) -> tuple[tuple, dict]:
    """Copies of the example inputs (copies, so marking dimensions dynamic leaves the originals alone).

    A program without example inputs (built by hand) gets inputs made from its placeholders' metadata.
    """
    example = exported_program.example_inputs
    if example is not None:
        args, kwargs = example
        return pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone(), (tuple(args), dict(kwargs or {})))
    made = []
    for _, val in inputs:
        shape = [size_hint(s) for s in val.shape]
        if val.dtype.is_floating_point:
            made.append(torch.randn(shape, dtype=val.dtype, device=val.device))
        else:
            made.append(torch.zeros(shape, dtype=val.dtype, device=val.device))
    return tuple(made), {}


def _signature(leaves):
    """What decides whether a call can reuse compiled code: tensor shapes and strides (dtypes and devices are the
    program's: the call passed its InputCheck), and whether they require grad.

    None (always take the lock) when the call has non-tensor arguments, which dynamo guards on by value.
    """
    key = []
    for leaf in leaves:
        if type(leaf) is not torch.Tensor:
            return None
        key.append((leaf.shape, leaf.stride(), leaf.requires_grad))
    return (tuple(key), torch.is_inference_mode_enabled())


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
