"""How a program's calls reach an OpenVINO model and come back: inputs bound to the model's ports, shapes,
tensors converted both ways, the output structure put back.

OpenVINO takes flat tensors and returns flat tensors: the runner (``runner.py``) flattens a call with the
program's own call signature, binds the user input tensors to the model's inputs (by position, or by name
where OpenVINO dropped unused ones), and rebuilds the program's output structure, putting back the outputs
that are not tensors (``return y, 3``), which the converted program does not return (``convert.py``).
bf16 has no numpy type: it crosses as int16 bits.
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

from ...errors import UnsupportedModelError


def check_no_mutations(exported_program) -> None:
    mutating = [
        s.target for s in exported_program.graph_signature.output_specs
        if s.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION, OutputKind.USER_INPUT_MUTATION)
    ]
    if mutating:
        raise UnsupportedModelError(
            f"this program writes into {', '.join(map(str, mutating))} when it runs; OpenVINO runs stateless "
            "programs only. Run it with backend='eager' or 'inductor'."
        )


def user_input_names(exported_program) -> list[str]:
    """Placeholder names of the user input tensors, in the order of the flattened call's tensors."""
    user = {s.arg.name for s in exported_program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    return [
        n.name for n in exported_program.graph.nodes
        if n.op == "placeholder" and n.name in user and isinstance(n.meta.get("val"), torch.Tensor)
    ]


def user_outputs(exported_program) -> list[tuple[str, object]]:
    """("tensor", None) or ("constant", value) for every user output, in order."""
    out = []
    for spec in exported_program.graph_signature.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            continue
        if isinstance(spec.arg, TensorArgument):
            out.append(("tensor", None))
        else:
            out.append(("constant", getattr(spec.arg, "value", None)))
    return out


def bind_inputs(model, names: list[str], state: int = 0) -> list[tuple[int, int]]:
    """(OpenVINO input index, position among the call's tensors) for every input the model kept.

    OpenVINO keeps the program's input order; when it dropped inputs (unused ones), the others are
    matched by name (OpenVINO may name an input after the argument, "input", where fx says "input_1").
    The last ``state`` inputs are the program's written tensors (``state.py``), none of the call's."""
    inputs = list(model.inputs)[:len(model.inputs) - state]
    if len(inputs) == len(names):
        return [(i, i) for i in range(len(names))]
    position = {name: i for i, name in enumerate(names)}
    ports = []
    for index, port in enumerate(inputs):
        hits = [position[n] for n in port.get_names() if n in position]
        if not hits:
            raise UnsupportedModelError(
                f"OpenVINO's model has an input {sorted(port.get_names())} that is none of the program's inputs "
                f"({', '.join(names)}); run it with backend='eager' or 'inductor'."
            )
        ports.append((index, hits[0]))
    return ports


def set_input_shapes(ov, model, ports, specs) -> None:
    shapes = {}
    for index, position in ports:
        dims = []
        for d in specs[position].dims:
            if isinstance(d, int):
                dims.append(ov.Dimension(d))
            else:
                low, high = d
                dims.append(ov.Dimension(int(low), int(high) if high is not None else -1))
        shapes[model.inputs[index]] = ov.PartialShape(dims)
    if shapes:
        model.reshape(shapes)

def to_ov_tensor(tensor: torch.Tensor):
    import openvino as ov

    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return ov.Tensor(t.view(torch.int16).numpy(), ov.Shape(list(t.shape)), ov.Type.bf16)
    if t.dtype == torch.bool:
        return ov.Tensor(t.numpy())
    return ov.Tensor(t.numpy(), shared_memory=True)


def to_torch(ov_tensor) -> torch.Tensor:
    import numpy as np
    import openvino as ov

    data = np.array(ov_tensor.data, copy=True)  # the request's buffer is reused by its next inference
    if ov_tensor.element_type == ov.Type.bf16:
        return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(data)

