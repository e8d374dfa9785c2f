"""Hand-built layers and contexts for testing one rule at a time."""

import re

import torch

from mixprec.calibrate.statistics import TensorStats
from mixprec.ir.graph_info import NodeInfo, TensorMeta
from mixprec.plan.rules import ConstantValue, RuleContext


def make_node(name="linear", op="aten.linear.default", *, module="encoder.fc", kind="compute", inputs=None):
    inputs = {"x": torch.float32, "p_w": torch.float32} if inputs is None else inputs
    return NodeInfo(
        name=name, op=op, kind=kind, module=module, module_type="torch.nn.modules.linear.Linear",
        precision=torch.float32, input_dtypes=inputs, outputs=(TensorMeta((2, 4), torch.float32),), flops=0,
    )


def stats(absmax, nonfinite=0):
    return TensorStats(absmax=absmax, min=-absmax, max=absmax, nonfinite=nonfinite, numel=8, shape=(2, 4))


def make_context(low=torch.bfloat16, *, patterns=(), ops=(), constants=None, **kw):
    return RuleContext(
        low=low,
        excluded_nodes=tuple(re.compile(p) for p in patterns),
        excluded_ops=frozenset(ops),
        constants={"p_w": ConstantValue("parameter 'fc.weight'", 1.0), **(constants or {})},
        **kw,
    )
