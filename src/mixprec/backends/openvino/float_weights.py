"""The OpenVINO constant forms of the float weight formats NF4, MXFP4 and FP8 (``compressed.py``'s table).

OpenVINO has each as an element type of a compressed constant that its CPU plugin's FullyConnected reads::

    nf4:   Constant nf4 [N, G, g]    -> Convert -> Multiply scale [N, G, 1]              -> Reshape [N, K]
    mxfp4: Constant f4e2m1 [N, G, 32] -> Convert -> Multiply (Constant f8e8m0 [N, G, 1] -> Convert) -> Reshape
    fp8:   Constant f8e4m3 [N, G, g]  -> Convert -> Multiply scale [N, G, 1]              -> Reshape [N, K]

(NNCF's NF4 / E2M1 / FP8 patterns.) OpenVINO's PyTorch frontend reads none of these element types from a torch
tensor, so the lowering writes the codes as u8 constants whose Convert carries a marker, and ``finish`` retypes them
bit for bit: the nf4 and f4e2m1 codes are the indices the formats store (OpenVINO's tables are NF4's and E2M1's),
f8e4m3 the bytes of ``torch.float8_e4m3fn`` (stored as uint8). MXFP4's E8M0 bytes are lowered as u8 too, but the
frontend folds a small constant's Convert, so ``finish`` reads the exponents from the Multiply's other input and
puts ``Convert(f8e8m0 constant)`` there. Whether the CPU
plugin then runs a layer on the compressed weight or decompresses it is read from its runtime model
(``weight_runs.py``) and said in ``runs_as``.
"""

from __future__ import annotations

import torch

from ...ops import int4_storage
from .compressed import Builder, Form, constant_reshapes, marked_constants, register, retype, typed_constant


def _codes(b: Builder, codes: torch.Tensor, group: int, marker: str):
    """u8 codes [N, K] as a constant [N, G, group], converted (and marked for ``finish``)."""
    n, k = codes.shape
    return b.convert(b.constant(marker, codes.reshape(n, k // group, group).contiguous()), marker=marker)


def _lower_nf4(b: Builder, stored, literals):
    u = int4_storage.from_nibbles(stored["weight"]).to(torch.uint8)
    scales = stored["scales"].float()
    n, k = u.shape
    return b.scaled(_codes(b, u, k // scales.shape[1], "nf4_codes"), scales, n, k)


def _finish_nf4(model, names) -> int:
    import openvino as ov

    constant_reshapes(model, names, "nf4_codes")
    return retype(model, names, "nf4_codes", ov.Type.nf4)


def _lower_mxfp4(b: Builder, stored, literals):
    u = int4_storage.from_nibbles(stored["weight"]).to(torch.uint8)
    exponents = stored["scales"]
    n, k = u.shape
    values = _codes(b, u, k // exponents.shape[1], "mxfp4_codes")
    scales = b.convert(b.constant("mxfp4_scales", exponents[..., None].contiguous()))  # f8e8m0 once finished
    return b.scaled(values, scales, n, k)


def _finish_mxfp4(model, names) -> int:
    """The codes as f4e2m1, and the Multiply's scale as ``Convert(f8e8m0 constant)``: the frontend may have folded the
    scales' u8 -> float Convert into a float constant of the exponents, so they are read from whichever it left."""
    import openvino as ov
    from openvino import opset13

    constant_reshapes(model, names, "mxfp4_codes")
    for convert, _ in list(marked_constants(model, names, "mxfp4_codes")):
        multiply = next(iter(convert.output(0).get_target_inputs())).get_node()
        other = next(i for i in multiply.inputs() if i.get_source_output().get_node() is not convert)
        source = other.get_source_output().get_node()
        if source.get_type_name() == "Convert":  # not folded: the u8 constant behind it
            source = source.input(0).get_source_output().get_node()
        exponents = _float_data(source)
        scales = opset13.convert(typed_constant(ov.Type.f8e8m0, exponents.astype("uint8")),
                                 multiply.get_output_element_type(0))
        other.replace_source_output(scales.output(0))
    return retype(model, names, "mxfp4_codes", ov.Type.f4e2m1)


def _float_data(constant):
    """A constant's values as numpy float32 (bf16 read from its bits)."""
    import numpy as np
    import openvino as ov

    data = np.ascontiguousarray(constant.get_data())
    if constant.get_element_type() == ov.Type.bf16:
        return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return data.astype(np.float32)


def _lower_fp8(b: Builder, stored, literals):
    q, scales = stored["weight"], stored["scales"].float()
    n, k = q.shape
    return b.scaled(_codes(b, q, k // scales.shape[1], "fp8_codes"), scales, n, k)


def _finish_fp8(model, names) -> int:
    import openvino as ov

    constant_reshapes(model, names, "fp8_codes")
    return retype(model, names, "fp8_codes", ov.Type.f8e4m3)


register("nf4", Form(_lower_nf4, lambda b, k: k // b["scales"].shape[1], _finish_nf4))
register("mxfp4", Form(_lower_mxfp4, lambda b, k: k // b["scales"].shape[1], _finish_mxfp4))
register("fp8", Form(_lower_fp8, lambda b, k: k // b["scales"].shape[1], _finish_fp8))
