"""AIMET's manual-mixed-precision unit tests (aimet_torch v2 ``test_manual_mixed_precision.py``, mp_1 .. mp_46), ported
as tests of mixprec's contract (API.md §4): each makes AIMET's calls on AIMET's test models, and asserts that every
layer of a requested module computes in the precision asked for (and stores its weights so), that the model
inputs/outputs carry theirs, and that nothing else changed.

Where AIMET asserts its own machinery (a request propagated to the producer's output quantizer, a "contention" error
between sibling requests, a backend-awareness config), the port asserts what mixprec promises instead: requests resolve
on graph layers, each layer gets what its latest request says, and a value read by layers of different precisions is
converted for each reader — so the requests AIMET refuses (mp_14, mp_33 strict, mp_43's refused kernel, mp_45) are
honoured, each layer as asked. Precisions mixprec has no kernel for (int16, int4) are simulated, as AIMET's QuantSim.
"""

import io

import pytest
import torch
from helpers import FixedSpeed
from torch import nn

import mixprec
from mixprec.weak_typing import speed


# ---- AIMET's elementwise modules (aimet_torch's custom Add, Permute, Concat, MatMul, Reshape) -----------------------
class Add(nn.Module):
    def forward(self, x, y):
        return x + y


class Permute(nn.Module):
    def forward(self, x, dims):
        return x.permute(*dims)


class Concat(nn.Module):
    def forward(self, *x):
        return torch.cat(x, 0)


class MatMul(nn.Module):
    def forward(self, x, y):
        return torch.matmul(x, y)


class Reshape(nn.Module):
    def forward(self, x, shape):
        return x.reshape(shape)


# ---- AIMET's test models --------------------------------------------------------------------------------------------
class SingleResidual(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=2, stride=2, padding=2, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.relu1 = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=2, stride=2, padding=1)
        self.conv2 = nn.Conv2d(32, 16, kernel_size=2, stride=2, padding=2, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv3 = nn.Conv2d(16, 8, kernel_size=2, stride=2, padding=2, bias=False)
        self.add = Add()
        self.relu3 = nn.ReLU(inplace=True)
        self.avgpool = nn.AvgPool2d(3, stride=1)
        self.conv4 = nn.Conv2d(32, 8, kernel_size=2, stride=2, padding=2, bias=True)
        self.ada = nn.AdaptiveAvgPool2d(5)
        self.fc = nn.Linear(72, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu1(self.bn1(self.conv1(x))))
        residual = x
        x = self.conv3(self.relu2(self.bn2(self.conv2(x))))
        residual = self.ada(self.conv4(residual))
        x = self.relu3(self.add(x, residual))
        x = self.avgpool(x)
        return self.fc(x.view(x.size(0), -1))


class ModelWithTwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1_a, self.maxpool1_a, self.relu1_a = nn.Conv2d(1, 10, kernel_size=5), nn.MaxPool2d(2), nn.ReLU()
        self.conv1_b, self.maxpool1_b, self.relu1_b = nn.Conv2d(1, 10, kernel_size=5), nn.MaxPool2d(2), nn.ReLU()
        self.add = Add()
        self.conv2, self.maxpool2, self.relu2 = nn.Conv2d(10, 20, kernel_size=5), nn.MaxPool2d(2), nn.LeakyReLU()
        self.flatten = nn.Flatten()
        self.fc1, self.relu3, self.dropout, self.fc2 = nn.Linear(320, 50), nn.ReLU(), nn.Dropout(), nn.Linear(50, 10)
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, x1, x2):
        x1 = self.relu1_a(self.maxpool1_a(self.conv1_a(x1)))
        x2 = self.relu1_b(self.maxpool1_b(self.conv1_b(x2)))
        x = self.relu2(self.maxpool2(self.conv2(self.add(x1, x2))))
        x = self.dropout(self.relu3(self.fc1(self.flatten(x))))
        return self.softmax(self.fc2(x))


class ModelWithMultiInputMultiOutput(nn.Module):
    def __init__(self):
        super().__init__()
        for s in "abc":
            setattr(self, f"conv1_{s}", nn.Conv2d(1, 10, kernel_size=5))
            setattr(self, f"maxpool1_{s}", nn.MaxPool2d(2))
            setattr(self, f"relu1_{s}", nn.ReLU())
        self.add_ab, self.add_bc = Add(), Add()
        for s in "ab":
            setattr(self, f"conv2_{s}", nn.Conv2d(10, 20, kernel_size=5))
            setattr(self, f"maxpool2_{s}", nn.MaxPool2d(2))
            setattr(self, f"relu2_{s}", nn.LeakyReLU())
        self.softmax_1, self.softmax_2 = nn.LogSoftmax(dim=1), nn.LogSoftmax(dim=1)

    def forward(self, x1, x2, x3):
        x1 = self.relu1_a(self.maxpool1_a(self.conv1_a(x1)))
        x2 = self.relu1_b(self.maxpool1_b(self.conv1_b(x2)))
        x3 = self.relu1_c(self.maxpool1_c(self.conv1_c(x3)))
        y1, y2 = self.add_ab(x1, x2), self.add_bc(x2, x3)
        y1 = self.softmax_1(self.relu2_a(self.maxpool2_a(self.conv2_a(y1.transpose(2, 3)))))
        y2 = self.softmax_2(self.relu2_b(self.maxpool2_b(self.conv2_b(y2))))
        return y1, y2, x1, x2, x3


class ModelWithIntermediateOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc_1, self.relu_1, self.fc_2, self.relu_2 = nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 2), nn.ReLU()

    def forward(self, x):
        int_out = x = self.relu_1(self.fc_1(x))
        return self.relu_2(self.fc_2(x)), int_out


class ModelWithIntermediateInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc_1, self.relu_1, self.add = nn.Linear(10, 10), nn.ReLU(), Add()
        self.fc_2, self.relu_2 = nn.Linear(10, 2), nn.ReLU()

    def forward(self, x1, x2):
        return self.relu_2(self.fc_2(self.add(self.relu_1(self.fc_1(x1)), x2)))


class ModelWithExplicitDataMovementOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc_1, self.relu_1, self.transpose = nn.Linear(10, 10), nn.ReLU(), Permute()
        self.fc_2, self.relu_2 = nn.Linear(10, 2), nn.ReLU()

    def forward(self, x):
        x = self.transpose(self.relu_1(self.fc_1(x)), [0, 1, 3, 2])
        return self.relu_2(self.fc_2(x))


class ModelWithSeveralTransposes(nn.Module):
    def __init__(self):
        super().__init__()
        self.transpose_1, self.transpose_2 = Permute(), Permute()
        self.fc = nn.Linear(10, 10)
        self.transpose_3, self.transpose_4 = Permute(), Permute()

    def forward(self, x):
        x = self.transpose_2(self.transpose_1(x, [0, 1, 3, 2]), [0, 1, 3, 2])
        return self.transpose_4(self.transpose_3(self.fc(x), [0, 1, 3, 2]), [0, 1, 3, 2])


class SingleLayerModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 10)

    def forward(self, x):
        return self.fc(x)


class ModelWithSwappedInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.matmul = MatMul()

    def forward(self, x, y):
        return self.matmul(y, x)


torch.manual_seed(0)
RESIDUAL_INPUT = (torch.randn(1, 3, 32, 32),)
TWO_INPUTS = (torch.randn(1, 1, 28, 28), torch.randn(1, 1, 28, 28))
THREE_INPUTS = (torch.randn(1, 1, 28, 28), torch.randn(1, 1, 28, 28), torch.randn(1, 1, 28, 28))
SMALL_INPUT = (torch.randn(1, 1, 10, 10),)
INT_NAMES = {"int16": torch.int16, "int8": torch.int8, "int4": torch.int4, "fp16": torch.float16}


# ---- helpers: the plan's layers per module, as AIMET's tests look at quantizers per module ---------------------------
def configurator(model, inputs):
    return mixprec.MixedPrecisionConfigurator(model.eval(), inputs)


def modules_of(plan) -> dict[str, set]:
    """module path -> {(activation, stored weights)} of its requested layers (the plan apply() returns holds those)."""
    info = plan.origin.captured.info
    out: dict[str, set] = {}
    for name, d in plan.items():
        out.setdefault(info[name].module, set()).add((d.precision, d.stored_param_dtype))
    return out


def precision_of(plan, module):
    (pair,) = modules_of(plan)[module]
    return pair


def compiled(model, inputs, plan, **kw):
    return mixprec.compile(model, inputs, plan=plan, **kw)


def only(plan, *modules):
    """The plan requests the layers of ``modules`` and nothing else."""
    assert set(modules_of(plan)) == set(modules), modules_of(plan)


# ---- the ported tests ---------------------------------------------------------------------------------------------
def test_mp_1_workflow_writes_the_log_to_an_open_file_and_the_latest_request_wins():
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    cfg.set_precision(model.conv1, "int16", {"weight": "int16"})
    cfg.set_precision(torch.nn.Conv2d, "int8", {"weight": "int8"})
    log = io.StringIO()
    plan = cfg.apply(log)  # AIMET's apply(f)
    assert log.getvalue() == plan.log and "#2  set_precision" in plan.log
    for conv in ("conv1", "conv2", "conv3", "conv4"):
        assert precision_of(plan, conv) == (torch.int8, torch.int8)
    prog = compiled(model, RESIDUAL_INPUT, plan)
    assert {r.precision for r in prog.report.layers if r.op == "aten.conv2d.default"} == {torch.int8}


def test_mp_2_a_precision_mixprec_does_not_know_is_refused_at_the_call():
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    cfg.set_precision(model.conv1, "int16", {"weight": "int16"})
    with pytest.raises(mixprec.ConfigError, match="'int2'"):
        cfg.set_precision(model.maxpool, activation="int2")


def test_mp_4_every_conv2d_int8_over_an_earlier_int16_request():
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    cfg.set_precision(model.conv1, "int16", {"weight": "int16"})
    cfg.set_precision(torch.nn.Conv2d, "int8", {"weight": "int8"})
    plan = cfg.apply()
    convs = {m: precision_of(plan, m) for m in ("conv1", "conv2", "conv3", "conv4")}
    assert convs == dict.fromkeys(convs, (torch.int8, torch.int8))
    # the residual add of an int8 convolution's output is int8 too, as NNCF quantizes it; its reason says so
    info = plan.origin.captured.info
    extra = [n for n in plan if info[n].module not in convs]
    assert all("residual add" in plan[n].reason for n in extra)


def test_mp_5_the_whole_model_fp16_over_earlier_requests():
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    cfg.set_precision(model.conv1, "int16", {"weight": "int16"})
    cfg.set_precision(torch.nn.Conv2d, "int8", {"weight": "int8"})
    cfg.set_precision(model, "fp16", {"weight": "fp16"})
    plan = cfg.apply()
    assert {pair for pairs in modules_of(plan).values() for pair in pairs} == {(torch.float16, torch.float16)}
    prog = compiled(model, RESIDUAL_INPUT, plan)
    assert {r.precision for r in prog.report.layers if r.kind == "compute"} == {torch.float16}


def test_mp_6_conv2d_int8_over_the_whole_model_fp16_is_kept_even_where_int8_is_slower(monkeypatch):
    """Issue 42's case: every conv came out fp32 because the int8 speed gate measured int8 slower on eager."""
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    cfg.set_precision(model, "fp16", {"weight": "fp16"})
    cfg.set_precision(torch.nn.Conv2d, "int8", {"weight": "int8"})
    plan = cfg.apply()
    for module, pairs in modules_of(plan).items():
        want = (torch.int8, torch.int8) if module.startswith("conv") else (torch.float16, torch.float16)
        assert pairs == {want}, module
    monkeypatch.setattr(speed, "MEASURER", FixedSpeed(0.7))
    with pytest.warns(mixprec.MixedPrecisionWarning, match="stay int8 as requested"):
        prog = compiled(model, RESIDUAL_INPUT, plan)
    for r in prog.report.layers:
        if r.kind == "compute":
            assert r.precision == (torch.int8 if r.module.startswith("conv") else torch.float16), r.name


@pytest.mark.parametrize("candidate", ["int16", "fp16"])
def test_mp_7_one_leaf_conv_at_the_requested_precision(candidate):
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    cfg.set_precision(model.conv1, candidate, {"weight": candidate})
    plan = cfg.apply()
    only(plan, "conv1")
    assert precision_of(plan, "conv1") == (INT_NAMES[candidate],) * 2
    prog = compiled(model, RESIDUAL_INPUT, plan)
    assert {r.precision for r in prog.report.layers if r.kind == "compute" and r.module != "conv1"} == {torch.float32}


@pytest.mark.parametrize("candidate", ["int16", "fp16"])
def test_mp_8_a_wider_request_on_conv3(candidate):
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    cfg.set_precision(model.conv3, candidate, {"weight": candidate})
    plan = cfg.apply()
    only(plan, "conv3")
    assert precision_of(plan, "conv3") == (INT_NAMES[candidate],) * 2


def test_mp_9_a_narrower_request_on_conv3():
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    cfg.set_precision(model.conv3, "int8", {"weight": "int8"})
    plan = cfg.apply()
    assert precision_of(plan, "conv3") == (torch.int8, torch.int8)
    assert all(p == {(torch.int8, torch.int8)} for m, p in modules_of(plan).items() if m == "conv3")


@pytest.mark.parametrize("candidate", ["int16", "fp16"])
def test_mp_10_a_module_whose_input_comes_from_an_add(candidate):
    model = ModelWithTwoInputs()
    cfg = configurator(model, TWO_INPUTS)
    cfg.set_precision(model.conv2, candidate, {"weight": candidate})
    plan = cfg.apply()
    only(plan, "conv2")
    assert precision_of(plan, "conv2") == (INT_NAMES[candidate],) * 2


@pytest.mark.parametrize("candidate", ["int16", "fp16"])
def test_mp_11_and_13_an_add_module_of_three_branches(candidate):
    for param in (None, {"weight": candidate}):  # mp_13 gives a weight precision to a module without weights
        model = ModelWithMultiInputMultiOutput()
        cfg = configurator(model, THREE_INPUTS)
        cfg.set_precision(model.add_ab, candidate, param)
        plan = cfg.apply()
        only(plan, "add_ab")
        assert precision_of(plan, "add_ab")[0] == INT_NAMES[candidate]


def test_mp_12_int8_on_one_branch_of_a_multi_output_model():
    model = ModelWithMultiInputMultiOutput()
    cfg = configurator(model, THREE_INPUTS)
    cfg.set_precision(model.conv2_a, "int8", {"weight": "int8"})
    plan = cfg.apply()
    only(plan, "conv2_a")
    assert precision_of(plan, "conv2_a") == (torch.int8, torch.int8)


@pytest.mark.parametrize("candidate", ["int16", "fp16"])
def test_mp_14_sibling_requests_are_each_honoured(candidate):
    """AIMET raises: add_ab and add_bc read x2 at different precisions. mixprec converts x2 for each reader."""
    model = ModelWithMultiInputMultiOutput()
    cfg = configurator(model, THREE_INPUTS)
    cfg.set_precision(model.add_ab, candidate)
    cfg.set_precision(model.add_bc, "int8")
    plan = cfg.apply()
    assert precision_of(plan, "add_ab")[0] == INT_NAMES[candidate] and precision_of(plan, "add_bc")[0] == torch.int8
    prog = compiled(model, THREE_INPUTS, plan)
    assert prog.report.by_module("add_ab")[0].precision == INT_NAMES[candidate]
    assert prog.report.by_module("add_bc")[0].precision == torch.int8


@pytest.mark.parametrize("candidate", ["int16", "fp16"])
def test_mp_15_the_output_layer_at_a_wider_precision(candidate):
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    cfg.set_precision(model.fc, candidate, {"weight": candidate})
    plan = cfg.apply()
    only(plan, "fc")
    assert precision_of(plan, "fc") == (INT_NAMES[candidate],) * 2


@pytest.mark.parametrize("candidate", ["int16", "fp16"])
def test_mp_16_an_add_of_a_layer_and_a_model_input(candidate):
    model = ModelWithIntermediateInput()
    inputs = (torch.randn(1, 1, 10, 10), torch.randn(1, 1, 10, 10))
    cfg = configurator(model, inputs)
    cfg.set_precision(model.add, candidate)
    plan = cfg.apply()
    only(plan, "add")
    assert precision_of(plan, "add")[0] == INT_NAMES[candidate]


@pytest.mark.parametrize("candidate", ["int16", "fp16"])
def test_mp_17_a_layer_whose_output_is_also_a_model_output(candidate):
    model = ModelWithIntermediateOutput()
    cfg = configurator(model, SMALL_INPUT)
    cfg.set_precision(model.relu_1, candidate)
    plan = cfg.apply()
    only(plan, "relu_1")
    assert precision_of(plan, "relu_1")[0] == INT_NAMES[candidate]
    prog = compiled(model, SMALL_INPUT, plan)
    assert [o.dtype for o in prog(*SMALL_INPUT)] == [torch.float32, torch.float32]  # keep_io_types


@pytest.mark.parametrize("candidate", ["int16", "fp16"])
def test_mp_20_a_conv_of_a_conv_batchnorm_relu_group(candidate):
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    cfg.set_precision(model.conv2, candidate, {"weight": candidate})
    plan = cfg.apply()
    only(plan, "conv2")
    assert precision_of(plan, "conv2") == (INT_NAMES[candidate],) * 2


def test_mp_22_int16_conv_and_int4_relu_in_non_strict_mode():
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    cfg.set_precision(model.conv3, "int16", {"weight": "int16"})
    cfg.set_precision(model.relu3, "int4")
    plan = cfg.apply(strict=False)
    assert precision_of(plan, "conv3") == (torch.int16, torch.int16)
    assert precision_of(plan, "relu3")[0] == torch.int4
    prog = compiled(model, RESIDUAL_INPUT, plan)
    assert prog.report.by_module("relu3")[0].runs_as == "simulated int4 (runs f32)"


def test_mp_23_an_int_request_turns_into_a_float_one():
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    cfg.set_precision(model.conv1, "fp16", {"weight": "fp16"})
    plan = cfg.apply()
    only(plan, "conv1")
    assert precision_of(plan, "conv1") == (torch.float16, torch.float16)


@pytest.mark.parametrize("candidate", ["int16", "fp16"])
def test_mp_24_a_layer_after_a_data_movement_module(candidate):
    model = ModelWithExplicitDataMovementOp()
    cfg = configurator(model, SMALL_INPUT)
    cfg.set_precision(model.fc_2, candidate, {"weight": candidate})
    plan = cfg.apply()
    only(plan, "fc_2")
    assert precision_of(plan, "fc_2") == (INT_NAMES[candidate],) * 2


def test_mp_25_a_list_of_activation_precisions_is_refused():
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    with pytest.raises(mixprec.ConfigError, match="activation"):
        cfg.set_precision(model.conv3, ["int16", "int16"])


@pytest.mark.parametrize("candidate", ["int16", "fp16"])
def test_mp_26_and_27_every_model_input(candidate):
    for model, inputs in ((SingleResidual(), RESIDUAL_INPUT), (ModelWithMultiInputMultiOutput(), THREE_INPUTS)):
        cfg = configurator(model, inputs)
        cfg.set_model_input_precision(candidate)
        plan = cfg.apply()
        assert dict(plan.inputs) == dict.fromkeys(range(len(inputs)), INT_NAMES[candidate]) and not list(plan)
        prog = compiled(model, inputs, plan)
        name = "int16 (simulated)" if candidate == "int16" else "float16"
        assert prog.report.summary["model_inputs"] == [name] * len(inputs)


def test_mp_28_some_model_inputs_int16_and_int4():
    model = ModelWithMultiInputMultiOutput()
    cfg = configurator(model, THREE_INPUTS)
    cfg.set_model_input_precision(["int16", None, "int4"])
    plan = cfg.apply()
    assert dict(plan.inputs) == {0: torch.int16, 2: torch.int4}
    prog = compiled(model, THREE_INPUTS, plan)
    assert prog.report.summary["model_inputs"] == ["int16 (simulated)", "float32", "int4 (simulated)"]


@pytest.mark.parametrize("candidate", ["int16", "fp16"])
def test_mp_29_and_30_every_model_output(candidate):
    for model, inputs, n in ((SingleResidual(), RESIDUAL_INPUT, 1),
                             (ModelWithMultiInputMultiOutput(), THREE_INPUTS, 5)):
        cfg = configurator(model, inputs)
        cfg.set_model_output_precision(candidate)
        plan = cfg.apply()
        assert dict(plan.outputs) == dict.fromkeys(range(n), INT_NAMES[candidate])
        outputs = compiled(model, inputs, plan)(*inputs)
        dtypes = [o.dtype for o in (outputs if isinstance(outputs, tuple) else (outputs,))]
        assert dtypes == [torch.float32 if candidate == "int16" else torch.float16] * n  # int16: simulated in f32


def test_mp_31_some_model_outputs():
    model = ModelWithMultiInputMultiOutput()
    cfg = configurator(model, THREE_INPUTS)
    cfg.set_model_output_precision(["int16", None, "int16", None, "int16"])
    plan = cfg.apply()
    assert dict(plan.outputs) == {0: torch.int16, 2: torch.int16, 4: torch.int16}
    prog = compiled(model, THREE_INPUTS, plan)
    assert prog.report.summary["model_outputs"] == ["int16 (simulated)", "float32"] * 2 + ["int16 (simulated)"]


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("input_first", [True, False])
def test_mp_32_and_33_an_input_precision_and_the_first_layers_precision(strict, input_first):
    """AIMET shares one quantizer between the model input and conv1's input (mp_33 strict raises). In mixprec they
    are two values: the input carries int4 at the boundary, conv1 quantizes what it reads on its int16 grid."""
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    calls = [lambda: cfg.set_model_input_precision("int4"), lambda: cfg.set_precision(model.conv1, activation="int16")]
    for call in calls if input_first else calls[::-1]:
        call()
    plan = cfg.apply(strict=strict)
    assert dict(plan.inputs) == {0: torch.int4} and precision_of(plan, "conv1")[0] == torch.int16
    only(plan, "conv1")


@pytest.mark.parametrize("output_first", [True, False])
def test_mp_34_and_35_an_output_precision_and_the_last_layers_precision(output_first):
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    calls = [lambda: cfg.set_model_output_precision("int4"), lambda: cfg.set_precision(model.fc, activation="int16")]
    for call in calls if output_first else calls[::-1]:
        call()
    plan = cfg.apply()
    assert dict(plan.outputs) == {0: torch.int4} and precision_of(plan, "fc")[0] == torch.int16


def test_mp_36_an_output_precision_past_data_movement():
    model = ModelWithSeveralTransposes()
    cfg = configurator(model, SMALL_INPUT)
    cfg.set_model_output_precision("int16")
    plan = cfg.apply()
    assert dict(plan.outputs) == {0: torch.int16} and not list(plan)
    prog = compiled(model, SMALL_INPUT, plan)
    assert prog.report.summary["model_outputs"] == ["int16 (simulated)"]


@pytest.mark.parametrize("output_first", [True, False])
def test_mp_37_and_38_input_and_output_precisions_of_a_single_layer(output_first):
    model = SingleLayerModel()
    inputs = (torch.randn(1, 3, 10, 10),)
    cfg = configurator(model, inputs)
    calls = [lambda: cfg.set_model_output_precision("int16"), lambda: cfg.set_model_input_precision("int4")]
    for call in calls if output_first else calls[::-1]:
        call()
    plan = cfg.apply()
    assert dict(plan.inputs) == {0: torch.int4} and dict(plan.outputs) == {0: torch.int16} and not list(plan)
    prog = compiled(model, inputs, plan)
    (fc,) = prog.report.by_module("fc")
    assert fc.precision == torch.float32 and fc.weights is None  # the layer itself as it was (8-bit weights: AIMET's)


@pytest.mark.parametrize("wanted, expected", [(["int4", "int16"], {0: torch.int4, 1: torch.int16}),
                                              ([None, "int16"], {1: torch.int16})])
def test_mp_39_and_40_input_precisions_follow_the_inputs_not_their_use(wanted, expected):
    model = ModelWithSwappedInputs()
    inputs = (torch.randn(1, 3, 10, 10), torch.randn(1, 3, 10, 10))
    cfg = configurator(model, inputs)
    cfg.set_model_input_precision(wanted)
    plan = cfg.apply()
    assert dict(plan.inputs) == expected


def test_mp_41_a_layer_after_a_reshape():
    class TestModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.reshape1, self.fc2 = nn.Linear(10, 10), Reshape(), nn.Linear(5, 5)

        def forward(self, x):
            return self.fc2(self.reshape1(self.fc1(x), [20, 5]))

    model, inputs = TestModel(), (torch.randn(10, 10),)
    cfg = configurator(model, inputs)
    cfg.set_precision(model.fc2, "int16", {"weight": "int16"})
    plan = cfg.apply()
    only(plan, "fc2")
    assert precision_of(plan, "fc2") == (torch.int16, torch.int16)


@pytest.mark.parametrize("reverse", [True, False])
def test_mp_42_two_readers_of_a_reshape_at_different_precisions(reverse):
    class TestModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.reshape1 = nn.Linear(10, 10), Reshape()
            self.fc2, self.fc3, self.add = nn.Linear(5, 5), nn.Linear(5, 5), Add()

        def forward(self, x):
            x = self.reshape1(self.fc1(x), [20, 5])
            return self.add(self.fc2(x), self.fc3(x))

    model, inputs = TestModel(), (torch.randn(10, 10),)
    cfg = configurator(model, inputs)
    first, second = ("int16", "int8") if reverse else ("int8", "int16")
    cfg.set_precision(model.fc2, first, {"weight": first})
    cfg.set_precision(model.fc3, second, {"weight": second})
    plan = cfg.apply()
    assert precision_of(plan, "fc2") == (INT_NAMES[first],) * 2
    assert precision_of(plan, "fc3") == (INT_NAMES[second],) * 2
    prog = compiled(model, inputs, plan)
    assert prog.report.by_module("fc2")[0].precision == INT_NAMES[first]
    assert prog.report.by_module("fc3")[0].precision == INT_NAMES[second]


@pytest.mark.parametrize("module", ["conv2", "fc"])
def test_mp_43_int16_activations_with_int8_weights(module):
    """AIMET refuses fc's int16 x int8 under its backend config; mixprec has no such config: both as asked."""
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    cfg.set_precision(getattr(model, module), "int16", {"weight": "int8"})
    plan = cfg.apply(strict=True)
    only(plan, module)
    assert precision_of(plan, module) == (torch.int16, torch.int8)


def test_mp_44_a_concat_between_int16_layers():
    class TestModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = nn.Linear(10, 10), nn.Linear(10, 10), nn.Linear(10, 10)
            self.concat = Concat()

        def forward(self, x):
            return self.fc3(self.concat(self.fc1(x), self.fc2(x)))

    model, inputs = TestModel(), (torch.randn(5, 10),)
    cfg = configurator(model, inputs)
    for m in (model.fc1, model.fc2, model.fc3):
        cfg.set_precision(m, activation="int16", param={"weight": "int16"})
    cfg.set_precision(model.concat, activation="int16")
    plan = cfg.apply()
    assert {m: {p[0] for p in pairs} for m, pairs in modules_of(plan).items()} == dict.fromkeys(
        ("fc1", "fc2", "concat", "fc3"), {torch.int16})


def test_mp_45_linears_between_functionals():
    """AIMET raises: its functional softmax and add have no quantizers. In mixprec the Linears are int16 as asked and
    the functionals, which no request names, stay as the model computes them."""
    class TestModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = nn.Linear(10, 10), nn.Linear(10, 10), nn.Linear(10, 10)

        def forward(self, x):
            return self.fc3(self.fc2(torch.softmax(self.fc1(x), -1)) + 5)

    model, inputs = TestModel(), (torch.randn(5, 10),)
    cfg = configurator(model, inputs)
    cfg.set_precision(torch.nn.Linear, "int16", param={"weight": "int16"})
    plan = cfg.apply()
    only(plan, "fc1", "fc2", "fc3")
    prog = compiled(model, inputs, plan)
    assert {r.module: r.precision for r in prog.report.layers if r.kind == "compute"} == {
        "fc1": torch.int16, "fc2": torch.int16, "fc3": torch.int16, "": torch.float32}


def test_mp_46_int8_convolutions_quantize_weights_per_channel_and_activations_per_tensor():
    model = SingleResidual()
    cfg = configurator(model, RESIDUAL_INPUT)
    cfg.set_precision(torch.nn.Conv2d, "int8", {"weight": "int8"})
    prog = compiled(model, RESIDUAL_INPUT, cfg.apply(), int8_require_speedup=False)
    graph = prog.exported_program.graph
    convs = [n for n in graph.nodes if n.target is torch.ops.aten.conv2d.default]
    assert len(convs) == 4
    for conv in convs:
        x, w = conv.args[0], conv.args[1]
        assert w.target is torch.ops.mixprec.dequantize_per_channel.default  # symmetric, one scale per channel
        assert "per_tensor" in str(x.target)  # the activation: one scale


# ---- AIMET's documented example (Docs/snippets/torch/apply_mmp.py) on a MobileNetV2-shaped model ---------------------
class InvertedResidual(nn.Module):
    def __init__(self, c_in, c_out, expand):
        super().__init__()
        hidden = c_in * expand
        self.conv = nn.Sequential(
            nn.Sequential(nn.Conv2d(c_in, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()),
            nn.Sequential(nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
                          nn.ReLU6()),
            nn.Conv2d(hidden, c_out, 1, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        return self.conv(x)


class MobileNetLike(nn.Module):
    """The module structure the example indexes: features[1].conv[0][0] (a leaf), features[3].conv[1] (a non-leaf)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU6()),
            InvertedResidual(8, 8, 2), InvertedResidual(8, 16, 2), InvertedResidual(16, 16, 2))
        self.pool = nn.AvgPool2d(8)
        self.classifier = nn.Linear(16, 10)

    def forward(self, x):
        return self.classifier(self.pool(self.features(x)).flatten(1))


def test_aimets_documented_example_runs_as_written_and_the_report_says_int16_at_the_boundary():
    torch.manual_seed(0)
    model, inputs = MobileNetLike().eval(), (torch.randn(1, 3, 16, 16),)
    mp_configurator = mixprec.MixedPrecisionConfigurator(model, inputs)
    mp_configurator.set_precision(model.features[1].conv[0][0], activation="int16", param={"weight": "int16"})
    mp_configurator.set_precision(model.features[3].conv[1], activation="int16", param={"weight": "int16"})
    mp_configurator.set_precision(torch.nn.AvgPool2d, activation="int16")
    mp_configurator.set_model_input_precision(activation="int16")
    mp_configurator.set_model_output_precision(activation="int16")
    plan = mp_configurator.apply()
    assert precision_of(plan, "features.1.conv.0.0") == (torch.int16, torch.int16)
    assert set(modules_of(plan)) == {"features.1.conv.0.0", "features.3.conv.1.0", "features.3.conv.1.1",
                                     "features.3.conv.1.2", "pool"}
    assert all(p == {(torch.int16, torch.int16)} for m, p in modules_of(plan).items() if m.startswith("features.3"))
    assert dict(plan.inputs) == {0: torch.int16} and dict(plan.outputs) == {0: torch.int16}
    prog = mixprec.compile(model, inputs, plan=plan)
    report = prog.report
    assert report.summary["model_inputs"] == ["int16 (simulated)"] == report.summary["model_outputs"]
    assert "model inputs: int16 (simulated); outputs: int16 (simulated)" in str(report)
    assert all(r.runs_as == "simulated int16 (runs f32)" for r in report.layers if r.precision == torch.int16)
    with torch.no_grad():
        ref = model(*inputs)
        assert float((prog(*inputs) - ref).norm() / ref.norm()) < 0.05


def test_aimets_documented_subset_forms_for_inputs_and_outputs():
    """"activation=[None, P1]" for the second of two inputs; "[None, P1, None]" for the second of three outputs."""
    model = ModelWithTwoInputs()
    cfg = configurator(model, TWO_INPUTS)
    cfg.set_model_input_precision(activation=[None, "int16"])
    assert dict(cfg.apply().inputs) == {1: torch.int16}

    class ThreeOutputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(10, 10)

        def forward(self, x):
            y = self.fc(x)
            return y, y * 2, y - 1

    model = ThreeOutputs()
    cfg = configurator(model, (torch.randn(2, 10),))
    cfg.set_model_output_precision(activation=[None, "int16", None])
    plan = cfg.apply()
    assert dict(plan.outputs) == {1: torch.int16}
    prog = compiled(model, (torch.randn(2, 10),), plan)
    assert prog.report.summary["model_outputs"] == ["float32", "int16 (simulated)", "float32"]
