import torch
from models import Attention, ConvNet, SeedExplicit, TiedEmbedding

from mixprec.ir.export import capture
from mixprec.ir.graph_info import _clean_path, analyze
from mixprec.ir.normalize import normalize
from mixprec.ir.work_program import WorkProgram


def _info(model_cls):
    work = WorkProgram.from_exported(capture(model_cls(), model_cls.example_inputs()))
    normalize(work)
    return analyze(work.graph)


def test_kinds_modules_precisions():
    info = _info(SeedExplicit)
    assert [(n.kind, n.module, n.precision) for n in info.values()] == [
        ("compute", "linear1", torch.float32),
        ("cast", "", torch.float16),
        ("compute", "linear2", torch.float16),
        ("cast", "", torch.float32),
        ("compute", "linear3", torch.float32),
    ]
    linear2 = info["linear_1"]
    assert linear2.module_type == "torch.nn.modules.linear.Linear"
    assert set(linear2.input_dtypes.values()) == {torch.float16}


def test_flops_of_linear_conv_and_attention():
    info = _info(SeedExplicit)
    assert info["linear"].flops == 2 * 1 * 10 * 10
    assert info["linear_1"].flops == 2 * 1 * 30 * 10

    conv = _info(ConvNet)
    c1 = next(n for n in conv.values() if n.module == "conv1")
    assert c1.flops == 2 * (2 * 8 * 16 * 16) * (3 * 3 * 3)
    c2 = next(n for n in conv.values() if n.module == "conv2")  # groups=2: C_in/groups = 4
    assert c2.flops == 2 * (2 * 8 * 8 * 8) * (4 * 3 * 3)

    att = _info(Attention)
    sdpa = next(n for n in att.values() if n.op == "aten.scaled_dot_product_attention.default")
    b, h, t, e = 2, 4, 8, 8
    assert sdpa.flops == 2 * b * h * t * t * (e + e)
    movement = [n for n in att.values() if n.kind == "movement"]
    assert movement and all(n.flops == 0 for n in movement)


def test_integer_only_nodes_are_not_layers():
    info = _info(TiedEmbedding)
    embedding = next(n for n in info.values() if n.op == "aten.embedding.default")
    assert embedding.precision == torch.float32
    argmax = next(n for n in info.values() if n.op == "aten.argmax.default")
    assert argmax.kind == "compute" and argmax.precision == torch.float32  # float input, int output


def test_module_path_spellings():
    assert _clean_path("L['self'].encoder.layers[0].attn") == "encoder.layers.0.attn"
    assert _clean_path("encoder.layers.0") == "encoder.layers.0"
    assert _clean_path("") == ""


def test_batch_norm_parameters_are_its_fp32_inputs():
    # ops.table.FP32_PARAMETER_INPUTS, bound by the op's schema: weight, bias and running statistics, not the input
    info = _info(ConvNet)
    bn = next(n for n in info.values() if n.module == "bn")
    assert bn.op == "aten.batch_norm.default"
    assert bn.fp32_inputs == {"p_bn_weight", "p_bn_bias", "b_bn_running_mean", "b_bn_running_var"}
    assert all(not n.fp32_inputs for n in info.values() if n.module != "bn")


def test_fp32_inputs_read_keyword_arguments_and_skip_a_value_bound_twice():
    graph = torch.fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    for node in (x, w):
        node.meta["val"] = torch.ones(2, 3)
    bn = graph.call_function(torch.ops.aten.batch_norm.default, (x, w), {
        "bias": w, "running_mean": x, "running_var": w, "training": False, "momentum": 0.1, "eps": 1e-5,
        "cudnn_enabled": False,
    })
    bn.meta["val"] = torch.ones(2, 3)
    graph.output(bn)
    # x is the input and also passed as running_mean: it is not a parameter input
    assert analyze(graph)[bn.name].fp32_inputs == {"w"}
