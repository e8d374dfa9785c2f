"""mixprec.search over the weight-only types (issue 32): "w8a16" / "w4a16" beside bf16, costed in the decode shape.

The cost model is measured per machine (``searching/latency.py``); these tests give it a table shaped like a
decoder's memory-bound Linears (int4 weights fastest, then int8 weights, then bf16) so that what they test does
not depend on this CPU's speed, and check that it is asked for the decode shape when the search is told so.
"""

import json
import math

import pytest
import torch
import torch.utils._pytree as pytree

import mixprec
from mixprec.cli import main
from mixprec.measure import costs as cost_models
from mixprec.errors import ConfigError
from mixprec.searching import SearchResult, latency
from mixprec.searching.options import low_types
from mixprec.dtypes import dtype_name

transformers = pytest.importorskip("transformers")

F32, BF16, F16, I8 = torch.float32, torch.bfloat16, torch.float16, torch.int8
INT4_OP = torch.ops.mixprec.linear_int4_weight.default
INT8_OP = torch.ops.mixprec.linear_int8_weight.default
# seconds per GFLOP of a decoder's Linears: int4 weights an eighth of fp32's bytes, int8 a quarter, bf16 half
DECODE_TABLE = {"float32": 10.0, "bfloat16": 5.0, "w8a16": 3.0, "w4a16": 1.5, "int8": 4.0}
LLAMA = dict(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.1, use_cache=False)


def use_costs(monkeypatch, table=DECODE_TABLE) -> list:
    """The cost model answers from ``table``; returns the (class, types) it was asked to time."""
    asked = []
    monkeypatch.setattr(cost_models, "COSTS", cost_models.CostModels())
    monkeypatch.setattr(latency, "measure_costs", lambda backend, kind, dtypes, device: asked.append(
        (kind, names(dtypes))) or {d: table[dtype_name(d)] for d in dtypes})
    return asked


def names(types) -> tuple:
    """Search types by name (the weight-only ones are not dtypes; ``dtype_name`` names them too)."""
    return tuple(dtype_name(t) for t in types)


def rel_l2(got, expected) -> float:
    a = [t.double() for t in pytree.tree_leaves(got) if isinstance(t, torch.Tensor)]
    b = [t.double() for t in pytree.tree_leaves(expected) if isinstance(t, torch.Tensor)]
    return math.sqrt(sum((x - y).pow(2).sum().item() for x, y in zip(a, b))) / math.sqrt(
        sum(y.pow(2).sum().item() for y in b))


class TokenMLP(torch.nn.Module):
    """Token ids -> embedding -> two Linears (128 input channels: int4's group of 128) with a GELU between."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 128)
        self.up = torch.nn.Linear(128, 256)
        self.down = torch.nn.Linear(256, 64)

    def forward(self, ids):
        return self.down(torch.nn.functional.gelu(self.up(self.embed(ids))))


def token_batches(rows: int, length: int, count: int = 3) -> list:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 64, (rows, length), generator=generator),) for _ in range(count)]


def test_the_weight_only_spellings_are_search_types():
    three = low_types(("w4a16", "w8a16", "bf16"))
    assert three == low_types("w4a16, w8a16 ,bf16") and names(three) == ("w4a16", "w8a16", "bfloat16")
    assert low_types({"bf16", "W4A16"}) == (three[0], BF16) and low_types("w8a16") == (three[1],)
    assert names(low_types(("w8a16", "int8"))) == ("int8", "w8a16")  # the int8 family first, then the floats
    # "a16": the weight-only layers compute in bf16, or in fp16 when the search's float type is fp16
    assert [t.activation for t in low_types(("w4a16", "w8a16", "bf16"))[:2]] == [BF16, BF16]
    assert low_types(("w4a16", "fp16"))[0].activation == F16
    for wrong in ("w2a16", ("w4a16", "int4"), "w4a8"):
        with pytest.raises(ConfigError, match="'w8a16', 'w4a16'") as e:
            low_types(wrong)
        assert "'bf16', 'fp16', 'int8'" in str(e.value)


def test_every_registered_weight_format_is_a_search_type_by_its_w_name():
    from mixprec.formats import WEIGHT_FORMATS, default_format
    from mixprec.searching import types

    for name in WEIGHT_FORMATS:
        (t,) = low_types(f"w-{name}")
        assert t.format == default_format(name) and names((t,)) == (f"w-{name}",)
        assert types.type_from_name(f"w-{name}") == t
        decision = types.decision(t, "searched")
        assert decision.weights == default_format(name) and decision.precision == BF16
    assert names(low_types(("w-nf4", "w-mxfp4", "w-fp8", "bf16"))) == ("w-nf4", "w-mxfp4", "w-fp8", "bfloat16")


def test_a_three_type_search_of_a_tiny_llama_picks_weight_only_linears_and_compile_runs_them(monkeypatch):
    asked = use_costs(monkeypatch)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    data = token_batches(1, 8)  # a decoder's steps: 8 tokens a batch -> costed in the decode shape
    tolerance = 0.2
    result = mixprec.search(model, data[0], low_precision_type=("w4a16", "w8a16", "bf16"), tolerance=tolerance,
                            eval_dataloader=data, cache=False)
    assert {kind for kind, _ in asked} == {"decode"}  # the model's classes only: no convolution stack
    asked.clear()
    latency.flop_costs(None, low_types("w4a16,w8a16,bf16"), torch.device("cpu"), decode=True,
                       ops=("aten.convolution.default",))
    assert asked == [("conv", ("float32", "bfloat16"))]  # convolutions take no weight-only type: not timed in them
    assert names(result.low_precision_type) == ("w4a16", "w8a16", "bfloat16") and result.met
    assert result.chosen.metric <= tolerance and result.held_out_metric is not None
    by_type = {}
    for g in result.groups:
        by_type.setdefault(str(g.precision), []).append(g.name)
        if g.op != "aten.linear.default":  # only Linears take the weight-only types
            assert set(g.by_type) <= {"bfloat16"}
    assert by_type.get("w4a16") and by_type.get("w8a16"), by_type  # both weight-only types where they fit
    for name in by_type["w4a16"]:
        decision = result.plan[name]
        assert (decision.precision, decision.weights.name, decision.weights.group) == (BF16, "int4", 128)
    for name in by_type["w8a16"]:
        decision = result.plan[name]
        assert (decision.precision, decision.weights.name, decision.weights.group) == (BF16, "int8", None)
    # the result names the types: text, mix, JSON (and reads them back)
    text = str(result)
    assert "low types w4a16, w8a16, bfloat16" in text and "in the decode shape" in text
    assert set(result.chosen.mix) == {"w4a16", "w8a16", "bfloat16"} and result.chosen.lowered_by_type["w4a16"] >= 1
    data_json = json.loads(result.to_json())
    assert data_json["low_precision_type"] == ["w4a16", "w8a16", "bfloat16"]
    assert {g["precision"] for g in data_json["groups"]} >= {"w4a16", "w8a16"}
    again = SearchResult.from_json(result.to_json())
    assert again.low_precision_type == result.low_precision_type and again.groups == result.groups
    # compile(plan=...) runs the weight-only ops on those layers, within the tolerance
    program = mixprec.compile(model, data[0], plan=result.plan)
    targets = [n.target for n in program.exported_program.graph.nodes if n.op == "call_function"]
    assert targets.count(INT4_OP) == len(by_type["w4a16"]) and targets.count(INT8_OP) == len(by_type["w8a16"])
    with torch.no_grad():  # batch 2 is the held-out one: the plan's program is the one the search confirmed there
        got, expected = program(*data[2]), model(*data[2])
    assert math.isclose(rel_l2(got.logits, expected.logits), result.held_out_metric, rel_tol=1e-3)
    assert result.held_out_metric <= tolerance


def test_w4a16_alone_lowers_only_linears_as_far_as_the_tolerance_allows():
    torch.manual_seed(0)
    model, data = TokenMLP().eval(), token_batches(2, 4)
    result = mixprec.search(model, data[0], low_precision_type="w4a16", tolerance=1.0, eval_dataloader=data,
                            cache=False)
    assert str(result.low_precision_type) == "w4a16"
    assert [g.name for g in result.groups] == ["linear", "linear_1"]  # embedding, gelu: no weight-only kernel
    assert [str(g.precision) for g in result.groups] == ["w4a16", "w4a16"]
    assert "gelu" not in result.plan and "linear" in result.plan and result.plan["linear"].weights.name == "int4"
    assert "low type w4a16" in str(result)


def test_a_search_lowers_linears_to_a_registered_format_by_its_w_name():
    torch.manual_seed(0)
    model, data = TokenMLP().eval(), token_batches(2, 4)
    result = mixprec.search(model, data[0], low_precision_type="w-nf4", tolerance=1.0, eval_dataloader=data,
                            cache=False)
    assert [str(g.precision) for g in result.groups] == ["w-nf4", "w-nf4"]
    assert result.plan["linear"].weights.name == "nf4"


def test_decode_costing_when_the_caller_says_so_or_the_eval_batches_are_token_steps(monkeypatch):
    asked = use_costs(monkeypatch)
    model = TokenMLP().eval()

    def kinds(**kwargs):
        asked.clear()
        monkeypatch.setattr(cost_models, "COSTS", cost_models.CostModels())
        result = mixprec.search(model, kwargs.pop("data")[0], low_precision_type=("w4a16", "bf16"), tolerance=1.0,
                                cache=False, **kwargs)
        return {kind for kind, _ in asked}, result

    # the model's one class, Linears (no convolutions: not timed), in the decode shape or not
    assert kinds(data=token_batches(2, 4), eval_dataloader=token_batches(2, 4))[0] == {"decode"}
    prefill, result = kinds(data=token_batches(2, 16), eval_dataloader=token_batches(2, 16))
    assert prefill == {"matmul"} and "decode shape" not in str(result)
    assert kinds(data=token_batches(2, 16), eval_dataloader=token_batches(2, 16), decode=True)[0] == {"decode"}
    assert kinds(data=token_batches(1, 4), eval_dataloader=token_batches(1, 4), decode=False)[0] == {"matmul"}
    with pytest.raises(ConfigError, match="decode must be True, False or None"):
        mixprec.search(model, token_batches(1, 4)[0], low_precision_type="w4a16,bf16", decode="yes")


def test_the_decode_class_is_timed_on_one_row_through_linears_larger_than_a_cores_caches(monkeypatch):
    model, (x,) = latency._stack(latency.DECODE, torch.device("cpu"))
    assert x.shape == (1, 2048) and [m.weight.shape for m in model if isinstance(m, torch.nn.Linear)] == [
        (2048, 2048), (2048, 2048)]
    # measured for real (smaller, for the test's time): the weight-only programs build and run
    # this process's cost model keeps no measurement of the small stack
    monkeypatch.setattr(cost_models, "COSTS", cost_models.CostModels())
    monkeypatch.setattr(latency, "DECODE_FEATURES", 256)
    monkeypatch.setattr(latency, "COST_ROUNDS", 2)
    monkeypatch.setattr(latency, "SAMPLE_SECONDS", 0.001)
    w8a16, w4a16 = low_types("w8a16,w4a16")[::-1]
    seconds = latency.measure_costs("eager", latency.DECODE, (F32, w8a16, w4a16), torch.device("cpu"))
    assert names(seconds) == ("float32", "w8a16", "w4a16") and all(0 < s < math.inf for s in seconds.values())
    model = latency.flop_costs(None, (w4a16,), torch.device("cpu"), decode=True)
    assert model.kind("aten.linear.default") == "decode" and model.kind("aten.conv2d.default") == "conv"
    assert model.speedup("conv", w4a16) == 1.0  # not timed: no gain
    assert set(model.speedups(["aten.linear.default"], (w4a16,))) == {"w4a16"}


def test_the_command_line_takes_weight_only_types_and_decode(tmp_path, monkeypatch):
    asked = use_costs(monkeypatch)
    spec = tmp_path / "spec.py"
    spec.write_text(
        "import torch\n"
        "def model():\n"
        "    torch.manual_seed(0)\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)).eval()\n"
        "    return m, (torch.randn(4, 128),)\n"
        "def eval_data():\n"
        "    torch.manual_seed(1)\n"
        "    return [(torch.randn(4, 128),) for _ in range(2)]\n"
    )
    out = tmp_path / "result.json"
    assert main(["search", f"{spec}:model", "--eval-data", f"{spec}:eval_data", "--low", "w4a16,bf16", "--decode",
                 "--tolerance", "1.0", "--json", str(out), "-q"]) == 0
    result = json.loads(out.read_text())
    assert result["low_precision_type"] == ["w4a16", "bfloat16"] and {k for k, _ in asked} == {"decode"}
    assert {g["precision"] for g in result["groups"] if g["op"] == "aten.linear.default"} == {"w4a16"}
