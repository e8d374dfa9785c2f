"""Torch-TensorRT's four autocast tests (tests/py/dynamo/models/test_autocast.py), ported.

The test bodies are Torch-TensorRT's. What changed, and only this: ``torch_tensorrt`` below is a
stand-in that maps its ``compile`` onto ``mixprec.compile`` (``arg_inputs`` are the example inputs;
``min_block_size``/``use_python_runtime``/``Debugger`` are TensorRT's and mean nothing here;
``keep_io_types=False`` is Torch-TensorRT's behaviour), ``.cuda()`` runs on this machine's device,
and two CPU facts are noted where an assertion depends on them.

Each test also runs with a calibration DataLoader of another batch size than the capture
(batch 2; ragged last batches are tested in test_hf.py) when the model given is an nn.Module: calibration batches
may differ from the example inputs (API.md §1).
"""

import contextlib
import warnings

import pytest
import torch
import torch.nn as nn

import mixprec

DEVICE = "cpu"


def _compile(model, arg_inputs=(), min_block_size=None, use_python_runtime=None, **settings):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=mixprec.MixedPrecisionWarning, message=".*float16 on a CPU")
        return mixprec.compile(model, arg_inputs, keep_io_types=False, **settings)


class torch_tensorrt:  # noqa: N801 - stands in for `import torch_tensorrt`
    compile = staticmethod(_compile)

    class dynamo:  # noqa: N801
        compile = staticmethod(_compile)

        @staticmethod
        def Debugger(*args, **kwargs):  # noqa: N802
            return contextlib.nullcontext()


CALIBRATION = [None, 2]  # None: Torch-TensorRT's own loader; 2: another batch size than the capture


def _loader(inputs, own_batch_size, calibration, model):
    if calibration is None:
        batch = own_batch_size
    else:
        # more data than the capture batch, in batches of another size
        inputs = tuple(torch.cat([t, torch.randn_like(t) if t.is_floating_point() else t]) for t in inputs)
        batch = calibration
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*inputs), batch_size=batch, shuffle=False)


class NoPytorchAutocastModel(nn.Module):
    def __init__(self):
        super(NoPytorchAutocastModel, self).__init__()
        self.conv1 = nn.Conv2d(in_channels=3, out_channels=8, kernel_size=3, stride=1, padding=1)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.conv2 = nn.Conv2d(in_channels=8, out_channels=16, kernel_size=3, stride=1, padding=1)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        out1 = self.conv1(x)
        out2 = self.relu1(out1)
        out3 = self.pool1(out2)
        out4 = self.conv2(out3)
        out5 = self.relu2(out4)
        out6 = self.pool2(out5)
        out7 = self.flatten(out6)
        out8 = self.fc1(out7)
        out9 = torch.add(out8, out8)
        return x, out1, out2, out3, out4, out5, out6, out7, out8, out9


@pytest.mark.parametrize("calibration", CALIBRATION)
def test_no_pytorch_autocast(calibration):
    model = NoPytorchAutocastModel().to(DEVICE).eval()
    BS = 8
    inputs = (torch.randn((BS, 3, 32, 32), dtype=torch.float32, device=DEVICE),)
    ep = torch.export.export(model, inputs)
    calibration_dataloader = _loader(inputs, BS, calibration, model)
    # Torch-TensorRT compiles ep.module(); an unlifted module cannot be captured again at other sizes,
    # so the runs with batches of another size compile the nn.Module itself
    compiled = ep.module() if calibration is None else model

    with torch_tensorrt.dynamo.Debugger("graphs", logging_dir=".", engine_builder_monitor=False):
        trt_autocast_mod = torch_tensorrt.compile(
            compiled,
            arg_inputs=inputs,
            min_block_size=1,
            use_python_runtime=True,
            use_explicit_typing=True,
            enable_autocast=True,
            autocast_low_precision_type=torch.float16,
            autocast_excluded_nodes={"^conv1$", "relu"},
            autocast_excluded_ops={"torch.ops.aten.flatten.using_ints"},
            autocast_max_output_threshold=512,
            autocast_max_depth_of_reduction=None,
            autocast_calibration_dataloader=calibration_dataloader,
        )

        autocast_outs = trt_autocast_mod(*inputs)
        pytorch_outs = model(*inputs)

        should_be_fp32 = [autocast_outs[0], autocast_outs[1], autocast_outs[2], autocast_outs[5], autocast_outs[7]]
        should_be_fp16 = [autocast_outs[3], autocast_outs[4], autocast_outs[6], autocast_outs[8], autocast_outs[9]]
        assert all(a.dtype == torch.float32 for a in should_be_fp32), "Some Autocast outputs are not float32!"
        assert all(a.dtype == torch.float16 for a in should_be_fp16), "Some Autocast outputs are not float16!"
        for i, (a, w) in enumerate(zip(autocast_outs, pytorch_outs)):
            assert torch.allclose(
                a.to(torch.float32), w.to(torch.float32), atol=1e-2, rtol=1e-2
            ), f"Autocast and Pytorch outputs do not match! autocast_outs[{i}] = {a}, pytorch_outs[{i}] = {w}"
    expected_batches = 1 if calibration is None else -(-2 * BS // calibration)
    assert trt_autocast_mod.report.summary["calibration_batches"] == expected_batches
    # mixprec's additions: the report says why each layer has its type
    report = trt_autocast_mod.report
    assert report.by_module("conv1")[0].reason == "excluded by pattern '^conv1$'"
    assert report.by_module("relu2")[0].reason == "excluded by pattern 'relu'"
    flatten = report.by_module("flatten")[0]
    assert (flatten.precision, flatten.source) == (torch.float32, "autocast_rule")
    assert flatten.reason == "excluded by op 'aten.flatten.using_ints'"
    assert report.by_module("fc1")[0].reason == "no rule keeps it in float32: lowered to float16"


class WholePytorchAutocastModel(NoPytorchAutocastModel):
    def forward(self, x):
        with torch.autocast(x.device.type, enabled=True, dtype=torch.float16):
            out1 = self.conv1(x)
            out2 = self.relu1(out1)
            out3 = self.pool1(out2)
            out4 = self.conv2(out3)
            out5 = self.relu2(out4)
            out6 = self.pool2(out5)
            out7 = self.flatten(out6)
            out8 = self.fc1(out7)
            out9 = torch.log(torch.abs(out8) + 1)  # log is fp32 due to Pytorch Autocast requirements
            return x, out1, out2, out3, out4, out5, out6, out7, out8, out9


def test_whole_pytorch_autocast():
    model = WholePytorchAutocastModel().to(DEVICE).eval()
    BS = 4
    inputs = (torch.randn((BS, 3, 32, 32), dtype=torch.float32, device=DEVICE),)
    ep = torch.export.export(model, inputs)
    calibration_dataloader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(*inputs), batch_size=BS, shuffle=False
    )

    with torch_tensorrt.dynamo.Debugger("graphs", logging_dir=".", engine_builder_monitor=False):
        trt_autocast_mod = torch_tensorrt.dynamo.compile(
            ep,
            arg_inputs=inputs,
            min_block_size=1,
            use_python_runtime=True,
            use_explicit_typing=True,
            # Torch-TensorRT's autocast doesn't affect layers inside Pytorch autocast
            enable_autocast=True,
            autocast_low_precision_type=torch.bfloat16,
            autocast_excluded_nodes={"^conv1$", "relu"},
            autocast_excluded_ops={"torch.ops.aten.flatten.using_ints"},
            autocast_max_output_threshold=512,
            autocast_max_depth_of_reduction=None,
            autocast_calibration_dataloader=calibration_dataloader,
        )

        autocast_outs = trt_autocast_mod(*inputs)
        pytorch_outs = model(*inputs)

        # CPU fact: CPU torch.autocast has no fp32 entry for log, so out9 is fp16 here (fp32 on CUDA)
        should_be_fp32 = [autocast_outs[0]] + ([autocast_outs[9]] if pytorch_outs[9].dtype == torch.float32 else [])
        should_be_fp16 = [autocast_outs[i] for i in range(1, 9)]
        assert all(a.dtype == torch.float32 for a in should_be_fp32), "Some Autocast outputs are not float32!"
        assert all(a.dtype == torch.float16 for a in should_be_fp16), "Some Autocast outputs are not float16!"
        assert autocast_outs[9].dtype == pytorch_outs[9].dtype
        for i, (a, w) in enumerate(zip(autocast_outs, pytorch_outs)):
            assert torch.allclose(
                a.to(torch.float32), w.to(torch.float32), atol=1e-2, rtol=1e-2
            ), f"Autocast and Pytorch outputs do not match! autocast_outs[{i}] = {a}, pytorch_outs[{i}] = {w}"
    # mixprec's addition: inside the fp16 region the rules change nothing, and the report says whose choice it was
    assert all(r.source == "torch_autocast" for r in trt_autocast_mod.report.layers if r.kind == "compute")


class MixedPytorchAutocastModel(NoPytorchAutocastModel):
    def forward(self, x):
        out1 = self.conv1(x)
        out2 = self.relu1(out1)
        out3 = self.pool1(out2)
        out4 = self.conv2(out3)
        out5 = self.relu2(out4)
        out6 = self.pool2(out5)
        out7 = self.flatten(out6)
        with torch.autocast(x.device.type, enabled=True, dtype=torch.float16):
            out8 = self.fc1(out7)
            out9 = torch.log(torch.abs(out8) + 1)  # log is fp32 due to Pytorch Autocast requirements
        return x, out1, out2, out3, out4, out5, out6, out7, out8, out9


@pytest.mark.parametrize("calibration", CALIBRATION)
def test_mixed_pytorch_autocast(calibration):
    model = MixedPytorchAutocastModel().to(DEVICE).eval()
    BS = 2 if calibration is None else 8
    inputs = (torch.randn((BS, 3, 32, 32), dtype=torch.float32, device=DEVICE),)
    ep = torch.export.export(model, inputs)
    calibration_dataloader = _loader(inputs, BS, calibration, model)
    compiled = ep.module() if calibration is None else model

    with torch_tensorrt.dynamo.Debugger("graphs", logging_dir=".", engine_builder_monitor=False):
        trt_autocast_mod = torch_tensorrt.compile(
            compiled,
            arg_inputs=inputs,
            min_block_size=1,
            use_python_runtime=False,
            use_explicit_typing=True,
            # Torch-TensorRT's autocast doesn't affect layers inside Pytorch autocast
            enable_autocast=True,
            autocast_low_precision_type=torch.bfloat16,
            autocast_excluded_nodes={"^conv1$", "relu"},
            autocast_excluded_ops={"torch.ops.aten.flatten.using_ints"},
            autocast_max_output_threshold=512,
            autocast_max_depth_of_reduction=None,
            autocast_calibration_dataloader=calibration_dataloader,
        )

        autocast_outs = trt_autocast_mod(*inputs)
        pytorch_outs = model(*inputs)

        # CPU fact: log stays in the fp16 region's dtype under CPU torch.autocast (fp32 on CUDA)
        log_fp32 = pytorch_outs[9].dtype == torch.float32
        should_be_fp32 = [autocast_outs[i] for i in (0, 1, 2, 5, 7)] + ([autocast_outs[9]] if log_fp32 else [])
        should_be_fp16 = [autocast_outs[8]] + ([] if log_fp32 else [autocast_outs[9]])
        should_be_bf16 = [autocast_outs[3], autocast_outs[4], autocast_outs[6]]
        assert all(a.dtype == torch.float32 for a in should_be_fp32), "Some Autocast outputs are not float32!"
        assert all(a.dtype == torch.float16 for a in should_be_fp16), "Some Autocast outputs are not float16!"
        assert all(a.dtype == torch.bfloat16 for a in should_be_bf16), "Some Autocast outputs are not bfloat16!"
        for i, (a, w) in enumerate(zip(autocast_outs, pytorch_outs)):
            assert torch.allclose(
                a.to(torch.float32), w.to(torch.float32), atol=1e-2, rtol=1e-2
            ), f"Autocast and Pytorch outputs do not match! autocast_outs[{i}] = {a}, pytorch_outs[{i}] = {w}"    # mixprec's addition: fc1 inside the fp16 region is left to torch.autocast, and the report says so
    assert {r.source for r in trt_autocast_mod.report.layers if r.op == "aten.linear.default"} == {"torch_autocast"}


class NestedPytorchAutocastModel(NoPytorchAutocastModel):
    def forward(self, x, y):
        out1 = self.conv1(x)  # fp32 because of "^conv1$" in `autocast_excluded_nodes`
        out2 = self.relu1(out1)  # fp32 because of "relu" in `autocast_excluded_nodes`
        out3 = self.pool1(out2)  # bf16
        out4 = self.conv2(out3)  # bf16
        out5 = self.relu2(out4)  # fp32 because of "relu" in `autocast_excluded_nodes`
        out6 = self.pool2(out5)  # bf16
        out7 = self.flatten(out6)  # fp32 because of `torch.ops.aten.flatten.using_ints` in `autocast_excluded_ops`
        # Respect the precisions in the pytorch autocast context
        with torch.autocast(x.device.type, enabled=True, dtype=torch.float32):
            out8 = self.fc1(out7)  # fp32
            with torch.autocast(x.device.type, enabled=False):
                out9 = torch.sub(out8.half(), y)  # fp16
                out10 = torch.add(out9, out9)  # fp16
        with torch.autocast(x.device.type, enabled=True, dtype=torch.float16):
            out11 = torch.log(torch.abs(out10) + 1)  # fp32 because Pytorch Autocast requires `log` to be fp32
        return x, out1, out2, out3, out4, out5, out6, out7, out8, out9, out10, out11


@pytest.mark.parametrize("calibration", CALIBRATION)
def test_nested_pytorch_autocast(calibration):
    model = NestedPytorchAutocastModel().to(DEVICE).eval()
    BS = 1 if calibration is None else 8
    inputs = (
        torch.randn((BS, 3, 32, 32), dtype=torch.float32, device=DEVICE),
        torch.randn((1,), dtype=torch.float16, device=DEVICE),
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="In CPU autocast, but the target dtype is not supported")
        ep = torch.export.export(model, inputs)
        if calibration is None:
            calibration_dataloader = torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(*inputs), batch_size=2, shuffle=False
            )
            compiled = ep
        else:  # x in batches of 2, y as it is (the model takes one y)
            xs = torch.cat([inputs[0], torch.randn_like(inputs[0])])
            calibration_dataloader = [(xs[i : i + calibration], inputs[1]) for i in range(0, len(xs), calibration)]
            compiled = model

        with torch_tensorrt.dynamo.Debugger("graphs", logging_dir=".", engine_builder_monitor=False):
            trt_autocast_mod = torch_tensorrt.dynamo.compile(
                compiled,
                arg_inputs=inputs,
                min_block_size=1,
                use_python_runtime=False,
                use_explicit_typing=True,
                # Torch-TensorRT's autocast doesn't affect layers inside Pytorch autocast
                enable_autocast=True,
                autocast_low_precision_type=torch.bfloat16,
                autocast_excluded_nodes={"^conv1$", "relu"},
                autocast_excluded_ops={"torch.ops.aten.flatten.using_ints"},
                autocast_max_output_threshold=512,
                autocast_max_depth_of_reduction=None,
                autocast_calibration_dataloader=calibration_dataloader,
            )

            autocast_outs = trt_autocast_mod(*inputs)
            pytorch_outs = model(*inputs)

    # CPU fact: as above, log follows the fp16 region on CPU
    log_fp32 = pytorch_outs[11].dtype == torch.float32
    should_be_fp32 = [autocast_outs[i] for i in (0, 1, 2, 5, 7, 8)] + ([autocast_outs[11]] if log_fp32 else [])
    should_be_fp16 = [autocast_outs[9], autocast_outs[10]] + ([] if log_fp32 else [autocast_outs[11]])
    should_be_bf16 = [autocast_outs[3], autocast_outs[4], autocast_outs[6]]
    assert all(a.dtype == torch.float32 for a in should_be_fp32), "Some Autocast outputs are not float32!"
    assert all(a.dtype == torch.float16 for a in should_be_fp16), "Some Autocast outputs are not float16!"
    assert all(a.dtype == torch.bfloat16 for a in should_be_bf16), "Some Autocast outputs are not bfloat16!"
    for i, (a, w) in enumerate(zip(autocast_outs, pytorch_outs)):
        assert torch.allclose(
            a.to(torch.float32), w.to(torch.float32), atol=1e-2, rtol=1e-2
        ), f"Autocast and Pytorch outputs do not match! autocast_outs[{i}] = {a}, pytorch_outs[{i}] = {w}"
