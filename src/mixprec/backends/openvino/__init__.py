"""The OpenVINO backend: run the rewritten program on OpenVINO's CPU runtime.

``backend="openvino"`` (``pip install 'mixprec[openvino]'``) converts the rewritten, strongly typed
ExportedProgram with ``openvino.convert_model`` and compiles it for OpenVINO's ``"CPU"`` device. One
concern per module:

* ``convert.py`` — the program prepared the way OpenVINO must read it (contiguous stored tensors; int8
  regions as FakeQuantize patterns for OpenVINO's int8 kernels where they are exact on this CPU, as float32
  fake quantization elsewhere; a flat tuple of output tensors), then converted;
* ``runner.py`` — the compiled program: :class:`~.runner.OpenVINORunner`, callable like the model, a pool of
  infer requests so that calls from several threads run concurrently;
* ``audit.py`` — what OpenVINO's CPU plugin really computes each layer in. A program without bf16 layers is
  compiled with ``INFERENCE_PRECISION_HINT=f32``, under which the plugin keeps the element types the program
  states instead of lowering f32 layers to its default bf16. A layer computed in a *wider* float type than
  planned is accepted and reported (``runs_as``), a narrower one is refused with UnsupportedModelError naming
  the report's nodes and modules;
* ``io.py`` — a call's tensors to OpenVINO's ports and back, the output structure put back.
* ``float_form.py`` — a program with bf16 layers is compiled in NNCF's form instead: an f32 graph without float
  Converts, ``INFERENCE_PRECISION_HINT=bf16``, the plan's f32 layers pinned; the audit judges it against the
  plan, and a pin that does not hold makes the runner compile the stated types as above.

Save/load: a saved program is the ExportedProgram; loading with this backend converts and compiles it
again (no OpenVINO blob is stored: it is tied to the OpenVINO version and the CPU it was compiled on).
"""

from __future__ import annotations

from ..registry import register_backend
from .runner import OpenVINORunner


@register_backend("openvino")
def build(exported_program, options=None):  # backends.options.BackendOptions
    """Convert ``exported_program`` with OpenVINO and compile it for the CPU."""
    group = options.weight_only_dynamic_activations if options is not None else None
    return OpenVINORunner(exported_program, dynamic_activations=group)
