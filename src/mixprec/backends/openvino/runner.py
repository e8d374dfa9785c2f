"""The compiled OpenVINO program: a callable like the model, a pool of infer requests, and what it computes in.

``OpenVINORunner`` converts the program (``convert.py``), reshapes the model to the program's input specs (static
sizes static, dynamic dimensions bounded by their ranges), compiles it for OpenVINO's ``"CPU"`` device and audits
the runtime model (``audit.py``): a layer the plugin computes in a *wider* float type than planned is accepted and
reported (``computes_in``, the records' ``runs_as``), a narrower one refused with UnsupportedModelError. Which model
is compiled (``form``): a program with bf16 layers in NNCF's form (``float_form.py``) when the audit accepts it;
otherwise the stated types with :data:`COMPILE_CONFIG` (f32 inference precision). After compiling only the compiled
model is kept; ``converted_model``/``stated_model`` convert again on demand.

Dynamic int8 activations (``weight_only_dynamic_activations=N``, opt-in; ``backends/options.py``): both forms are
compiled with ``DYNAMIC_QUANTIZATION_GROUP_SIZE=N``, and OpenVINO quantizes the activations of its weight-compressed
FullyConnected layers (the program's weight-only layers) to int8 per group of N input channels at run time; which
layers it applies to is :func:`dynamic_layers`'s, said in their ``runs_as``.

Weight-only layers: what each runs as is read from the runtime model (``weight_runs.py``). Where OpenVINO
decompressed weights read by 16-bit activations, the program is converted once more with those layers' patterns in
f32 and compiled again; the layers then run compressed keep that form, and their ``runs_as`` says why they compute
in f32; when none does, the first compile stays. Decided by what the runtime reports, never by the CPU's name.

Threads: each inference runs on ``torch.get_num_threads()`` threads as the runner is built. An infer request runs one
inference at a time; the runner keeps a pool, takes one per call (creating one when all are busy) and gives it back
after copying the outputs out, so calls from several threads run concurrently on one compiled model.
"""

from __future__ import annotations

import logging
import queue
import threading
import warnings

import torch
import torch.utils._pytree as pytree

from ...errors import MixedPrecisionWarning, UnsupportedModelError
from ..lowering.cpu import has_int8_dot_product
from ...ir.input_check import input_specs_of
from .audit import NATIVE_CAPABILITY, audit, declared_precisions, int8_nodes, node_types, refusal, runtime_layers
from .compressed import weight_groups, weight_only_formats
from .weight_runs import cast_sources, decompressed_low, weight_runs
from .float_form import FLOAT_FORM_CONFIG, float_form
from .convert import Converted, convert_program, first_line, import_openvino, version_of
from .state import initial_values, make_stateful, variable_index
from .io import (
    bind_inputs, check_no_mutations, set_input_shapes, to_ov_tensor, to_torch, user_input_names, user_outputs,
)

DEVICE = "CPU"
# Compile settings of every mixprec program (see the package docstring).
# f32: keep the element types the program states; no dynamic quantization of the activations of layers
# with int8 weights (weight-only int8 computes in float32 activations, as planned) unless the caller opts in
# (``dynamic_activations``: the group size replaces the 0 in both forms' settings).
COMPILE_CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
DYNAMIC_QUANTIZATION = "DYNAMIC_QUANTIZATION_GROUP_SIZE"

# which model was compiled (``OpenVINORunner.form``): float_form.py's, or the program's stated types
FORM_FLOAT, FORM_STATED = "f32 graph, bf16 inference precision", "stated types, f32 inference precision"

# OpenVINO's element type names -> torch dtypes (what the runner's computes_in holds)
_TORCH_TYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}

log = logging.getLogger(__name__)


class OpenVINORunner(torch.nn.Module):
    """The compiled program: callable like the model, safe to call from several threads.

    ``computes_in``: program node name -> the torch dtype OpenVINO computes it in, for the nodes it runs
    otherwise than the program states (wider float types; int8 layers in float32 without int8 kernels).
    The report reads it into ``LayerRecord.runs_as``; a weight-only layer with dynamic int8 activations maps to
    the text "int8 dynamic activations (group N)".

    ``dynamic_activations``: None, or the group size of OpenVINO's int8 dynamic activations of the weight-only
    layers (:func:`dynamic_layers`). ``weight_runs_as``: weight-only node -> what OpenVINO runs it as (the module
    docstring)."""

    def __init__(self, exported_program, *, dynamic_activations: int | None = None):
        super().__init__()
        self.dynamic_activations = dynamic_activations
        ov = import_openvino()
        self.__dict__["_program"] = exported_program  # not a submodule: the runner holds no torch state
        self._specs = input_specs_of(exported_program)
        check_no_mutations(exported_program)
        self._user_inputs = user_input_names(exported_program)
        self._outputs = user_outputs(exported_program)
        self._out_spec = exported_program.call_spec.out_spec
        self._formats = weight_only_formats(exported_program)  # weight-only node -> its format's name
        self._f32_layers: frozenset = frozenset()  # weight-only layers OpenVINO runs on f32 activations
        core = ov.Core()
        converted = self._build(ov, core, exported_program, frozenset())
        # weight-only layers whose weights OpenVINO decompressed under 16-bit activations: asked for in f32, which
        # keeps them compressed where the plugin allows (weight_runs.py); kept so only if the runtime then says so
        decompressed = decompressed_low(self.weight_runs)
        if decompressed:
            first = (converted, self.form, self._compiled, self.computes_in, self.weight_runs, self._carried_positions)
            converted = self._build(ov, core, exported_program, decompressed)
            kept = {n for n in decompressed if n in self.weight_runs and self.weight_runs[n].compressed}
            if kept:
                log.info("OpenVINO decompressed the weights of %d weight-only layer(s) read by 16-bit activations; "
                         "they get f32 activations, on which it keeps them compressed: %s", len(kept),
                         ", ".join(sorted(kept)[:20]))
                self._f32_layers = frozenset(kept)
                if kept != decompressed:
                    converted = self._build(ov, core, exported_program, self._f32_layers)
            else:
                (converted, self.form, self._compiled, self.computes_in, self.weight_runs,
                 self._carried_positions) = first
        self.weight_runs_as = {n: r.text(self._formats[n], asked_f32=n in self._f32_layers)
                               for n, r in self.weight_runs.items()}
        if dynamic_activations:
            layers = dynamic_layers(exported_program, dynamic_activations, vnni=has_int8_dot_product())
            self.computes_in.update(dict.fromkeys(layers, f"int8 dynamic activations (group {dynamic_activations})"))
        # Only the compiled model is kept: it holds its own copy of the weights, and the openvino.Models (the float
        # form read back from IR holds another copy) are rebuilt on demand by converted_model and stated_model.
        self.__dict__["_models"] = {}
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._idle.put(self._compiled.create_infer_request())
        self._stateful = converted.state > 0
        self._state_lock = threading.Lock()
        self._carried: list = []  # (input index, value) of the written tensors carried from call to call
        # the written tensors' values as the program holds them now (state.py): where every reset_state() starts
        self.__dict__["_initial"] = [t.detach().clone() for t in initial_values(exported_program)]
        self.reset_state()

    def _build(self, ov, core, exported_program, f32_layers: frozenset) -> Converted:
        """Convert the program (``f32_layers``: weight-only layers in f32, ``compressed.py``), fit its inputs, compile
        it (``_compile``) and read what its weight-only layers run as; returns the conversion."""
        converted = convert_program(exported_program, f32_layers=f32_layers)
        model = converted.model
        # OpenVINO's constants point into the prepared program's tensors: they must outlive the compiled model
        self.__dict__["_prepared"] = converted.prepared
        self._input_ports = bind_inputs(model, self._user_inputs, state=converted.state)
        set_input_shapes(ov, model, self._input_ports, self._specs)
        n_tensors = sum(1 for kind, _ in self._outputs if kind == "tensor")
        self._n_outputs = n_tensors
        if len(model.outputs) != n_tensors + converted.state:
            raise UnsupportedModelError(
                f"OpenVINO made {len(model.outputs)} outputs of this program's {n_tensors} output tensors "
                "(it merges outputs that are the same value); run it with backend='eager' or 'inductor'."
            )
        self.form = self._compile(ov, core, exported_program, converted, model)
        self.weight_runs = weight_runs(runtime_layers(self._compiled), converted.names, self._formats,
                                       cast_sources(converted.prepared.graph)) if self._formats else {}
        return converted

    def reset_state(self) -> None:
        """Put the state of a program that writes its own tensors (a KV cache) back to its values when the runner was
        built, as the compiler does with the program's tensors before each of its runs; nothing for other programs."""
        if not self._stateful:
            return
        values = self._initial
        with self._state_lock:
            request = self._idle.get()
            for variable in request.query_state():
                variable.state = to_ov_tensor(values[variable_index(variable.name)].clone())
            self._idle.put(request)
            self._carried = [[len(self._input_ports) + j, to_ov_tensor(values[i].clone())]
                             for j, i in enumerate(self._carried_positions)]

    def _compile(self, ov, core, exported_program, converted: Converted, stated):
        """Compile the float form (``float_form.py``: an f32 graph with bf16 inference precision, NNCF's form) where
        the program has bf16 layers and the audit accepts it, else the stated types with f32 inference precision.
        Sets ``_compiled`` and ``computes_in``; returns which form was compiled."""
        declared = declared_precisions(stated)
        form = float_form(ov, stated, declared, names=converted.names, int8_nodes=int8_nodes(exported_program),
                          int8_kernels=converted.int8_kernels)
        if form is not None:
            self._carried_positions = make_stateful(ov, form.model, converted.state)
            compiled = _compile_model(core, form.model, self._config(FLOAT_FORM_CONFIG))
            result = _judge(core, exported_program, converted, compiled, form.declared)
            if not result.narrower:
                self.__dict__["_compiled"] = compiled
                self.computes_in = _computes_in(result, optimization_capabilities(core))
                return FORM_FLOAT
            log.info("OpenVINO ran %d layer(s) of the f32 form narrower than planned (%s); compiling the stated "
                     "types with f32 inference precision instead", len(result.narrower),
                     ", ".join(f"{m.layer}: {m.planned} -> {m.runs}" for m in result.narrower[:5]))
        self._carried_positions = make_stateful(ov, stated, converted.state)
        compiled = _compile_model(core, stated, self._config(COMPILE_CONFIG))
        result = _judge(core, exported_program, converted, compiled, declared)
        if result.narrower:
            raise UnsupportedModelError(
                refusal(result.narrower, converted.names, capabilities=optimization_capabilities(core),
                        version=version_of(ov)),
                reason="; ".join(f"{m.layer}: {m.planned} -> {m.runs}" for m in result.narrower),
            )
        self.__dict__["_compiled"] = compiled
        self.computes_in = _computes_in(result, optimization_capabilities(core))
        return FORM_STATED

    def _config(self, config) -> dict:
        """A form's compile settings with the caller's dynamic activations, if any."""
        return {**config, DYNAMIC_QUANTIZATION: self.dynamic_activations or 0}

    def forward(self, *args, **kwargs):
        from ...ir.call_signature import flat_user_inputs

        leaves = flat_user_inputs(self._program, args, kwargs)
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        feed = {}
        for port, position in self._input_ports:
            feed[port] = to_ov_tensor(tensors[position])
        if self._stateful:
            with self._state_lock:  # the state is the one request's: calls take turns
                request = self._idle.get()
                try:
                    feed.update(self._carried)
                    results = _infer(request, feed, self._n_outputs)
                    for j, entry in enumerate(self._carried):  # the written integers' new values, for the next call
                        entry[1] = to_ov_tensor(to_torch(request.get_output_tensor(self._n_outputs + j)))
                finally:
                    self._idle.put(request)
        else:
            try:
                request = self._idle.get_nowait()
            except queue.Empty:
                request = self._compiled.create_infer_request()
            try:
                results = _infer(request, feed, self._n_outputs)
            finally:
                self._idle.put(request)
        flat, it = [], iter(results)
        for kind, value in self._outputs:
            flat.append(next(it) if kind == "tensor" else value)
        return pytree.tree_unflatten(flat, self._out_spec)

    @property
    def compiled_model(self):
        """The ``openvino.CompiledModel`` (its ``get_runtime_model()`` shows what runs in which precision)."""
        return self._compiled

    @property
    def converted_model(self):
        """The ``openvino.Model`` it was compiled from: the float form (``form == FORM_FLOAT``) or the stated types.
        Rebuilt from the program on first use (the runner keeps only the compiled model), then kept."""
        return self._rebuilt(self.form)

    @property
    def stated_model(self):
        """The ``openvino.Model`` with the element types the program states (converted before any float form).
        Rebuilt from the program on first use, then kept."""
        return self._rebuilt(FORM_STATED)

    def _rebuilt(self, form: str):
        """The model of ``form`` converted again from the program, as __init__ built it (same conversion, same
        input shapes, same float form: each is a function of the program and this CPU)."""
        if form not in self._models:
            ov = import_openvino()
            converted = convert_program(self._program, f32_layers=self._f32_layers)
            model = converted.model
            set_input_shapes(ov, model, bind_inputs(model, self._user_inputs, state=converted.state), self._specs)
            if form == FORM_FLOAT:
                model = float_form(ov, model, declared_precisions(model), names=converted.names,
                                   int8_nodes=int8_nodes(self._program), int8_kernels=converted.int8_kernels).model
            make_stateful(ov, model, converted.state)
            self._models[form] = (converted.prepared, model)  # its constants share the prepared program's memory
        return self._models[form][1]


def dynamic_layers(exported_program, group: int, *, vnni: bool | None) -> list[str]:
    """The weight-only layers whose activations OpenVINO's CPU plugin quantizes to int8 per ``group`` input channels
    on a CPU with VNNI or not (``vnni``: mixprec's one probe, ``backends/lowering/cpu.has_int8_dot_product``; None:
    unknown, taken as yes); the others are logged with why they keep float activations.

    Where the plugin applies it (its FullyConnected executor; each condition checked by the numbers on OpenVINO
    2026.4.1, an AVX-512 VNNI CPU): ``group`` a multiple of 16 (``settings.py`` refuses others); a layer with grouped
    weights only where ``group`` divides its weight group, a per-channel one where ``group`` <= its input channels;
    f32 and bf16 activations alike; by the plugin's source, only with VNNI (AVX2-VNNI, AVX-512 VNNI; AMX counts).
    Other layers are not touched (f32 layers with float weights give the same numbers, int8 layers already run on
    int8 kernels). The runtime graph does not show it per layer; the compiled model's property and the numbers do."""
    kept, layers = {}, []
    for name, in_features, weight_group in weight_groups(exported_program):
        if vnni is False:
            kept[name] = "this CPU has no VNNI"
        elif weight_group < in_features and weight_group % group:
            kept[name] = f"{group} does not divide its weight group of {weight_group}"
        elif group > in_features:
            kept[name] = f"{group} is more than its {in_features} input channels"
        else:
            layers.append(name)
    if layers:
        log.info("OpenVINO quantizes the activations of %d weight-only layer(s) to int8 at run time, per group of %d "
                 "input channels (weight_only_dynamic_activations)", len(layers), group)
    if kept:
        why = ", ".join(f"{n} ({reason})" for n, reason in list(kept.items())[:20])
        log.info("OpenVINO keeps float activations in %d weight-only layer(s) despite weight_only_dynamic_activations="
                 "%d: %s", len(kept), group, why)
        if not layers:  # the request changes nothing: said, not silently dropped
            warnings.warn(f"weight_only_dynamic_activations={group} has no effect here: OpenVINO keeps float "
                          f"activations in every weight-only layer ({why}).", MixedPrecisionWarning, stacklevel=2)
    return layers


def _infer(request, feed, n_outputs: int) -> list[torch.Tensor]:
    request.infer(feed, share_inputs=True)
    return [to_torch(request.get_output_tensor(i)) for i in range(n_outputs)]


# ---- precisions -----------------------------------------------------------------------------


def _compile_model(core, model, config):
    # as many threads as torch's (torch.set_num_threads), not OpenVINO's own default of every core: one setting
    # for both runtimes in one process (and a one-thread decode runs on one thread)
    config = {**config, "INFERENCE_NUM_THREADS": torch.get_num_threads()}
    try:
        return core.compile_model(model, DEVICE, config)
    except RuntimeError as e:
        raise UnsupportedModelError(
            f"OpenVINO could not compile this program for its CPU device: {first_line(e)}\n"
            "Run it with backend='eager' or 'inductor'.",
            reason=str(e),
        ) from e


def _judge(core, exported_program, converted: Converted, compiled, declared):
    """The audit (audit.py) of a compiled model against ``declared``: the types the plan gives its operations."""
    return audit(
        declared, runtime_layers(compiled), names=converted.names, capabilities=optimization_capabilities(core),
        node_types=node_types(exported_program), int8_nodes=int8_nodes(exported_program),
        int8_kernels=converted.int8_kernels,
    )


def _computes_in(result, capabilities) -> dict:
    """Program node -> torch dtype for the nodes the runtime model computes otherwise than the program states."""
    computes_in = {node: _TORCH_TYPES[t] for node, t in result.computes_in.items()}
    if computes_in:
        lacking = [t for t in ("bf16", "f16") if NATIVE_CAPABILITY[t] not in capabilities]
        why = (f"this CPU computes no {'/'.join(lacking)} natively (OpenVINO's capabilities: {'/'.join(capabilities)})"
               if lacking else "OpenVINO has no low-precision kernel or output for them on this CPU")
        log.info("OpenVINO computes %d node(s) in a wider type than the program states (%s): %s", len(computes_in),
                 why, ", ".join(f"{n} in {t}" for n, t in list(result.computes_in.items())[:20]))
    return computes_in


def optimization_capabilities(core) -> list[str]:
    """The CPU's OPTIMIZATION_CAPABILITIES (BF16, FP16, FP32, INT8, ...): which types it computes natively."""
    try:
        return [str(c) for c in core.get_property(DEVICE, "OPTIMIZATION_CAPABILITIES")]
    except Exception:  # an OpenVINO that does not say: nothing is known to be native
        return []
