"""The matrix of bad inputs (issue 7): every misuse gives the right error of API.md §6, naming what,
where and what to do — never a raw traceback from deep inside torch, never a silently wrong program."""

import json
import math
import warnings

import pytest
import torch
from models import DataDependent, SeedExplicit, ThreeLinears

import mixprec
from mixprec import CalibrationError, ConfigError, InputMismatchError, UnsupportedModelError
from mixprec.plan.precision_plan import NodePrecision, PrecisionPlan

X = (torch.randn(1, 10),)


def _compile(**settings):
    return lambda: mixprec.compile(ThreeLinears().eval(), X, **settings)


def _autocast(**settings):
    return _compile(enable_autocast=True, **settings)


def _call(*args, **kwargs):
    prog = mixprec.compile(ThreeLinears().eval(), X)
    return lambda: prog(*args, **kwargs)


def _plan_json(text):
    return lambda: mixprec.compile(ThreeLinears().eval(), X, plan=PrecisionPlan.from_json(text))


_FOREIGN_PLAN = json.dumps({"format": "mixprec.plan", "version": 1, "nodes": {"conv2d_7": {"precision": "float16"}}})

CASES = [
    # settings: wrong types and strings for every keyword
    ("use_explicit_typing", _compile(use_explicit_typing="yes"), ConfigError, "use_explicit_typing must be True or False"),
    ("enable_autocast", _compile(enable_autocast=1), ConfigError, "enable_autocast must be True or False"),
    ("low type string", _autocast(autocast_low_precision_type="fp8"), ConfigError, "autocast_low_precision_type='fp8'"),
    ("low type dtype", _autocast(autocast_low_precision_type=torch.int32), ConfigError, "autocast_low_precision_type"),
    ("pattern", _autocast(autocast_excluded_nodes={"linear(["}), ConfigError, "not a valid regular expression"),
    ("pattern type", _autocast(autocast_excluded_nodes={3}), ConfigError, "not a string or re.Pattern"),
    ("op name", _autocast(autocast_excluded_ops={"aten.flattn"}), ConfigError, "names no operator.*aten.flatten"),
    ("op type", _autocast(autocast_excluded_ops={3.0}), ConfigError, "neither an op"),
    ("threshold negative", _autocast(autocast_max_output_threshold=-1), ConfigError, "positive number"),
    ("threshold NaN", _autocast(autocast_max_output_threshold=math.nan), ConfigError, "positive number"),
    ("threshold text", _autocast(autocast_max_output_threshold="inf"), ConfigError, "math.inf or None"),
    ("depth", _autocast(autocast_max_depth_of_reduction=-4), ConfigError, "positive integer"),
    ("dataloader type", _autocast(autocast_calibration_dataloader=3), ConfigError, "iterable of input tuples"),
    ("fp32_acc", _compile(use_fp32_acc="true"), ConfigError, "use_fp32_acc must be True or False"),
    ("enabled_precisions", _compile(enabled_precisions={"fp8"}), ConfigError, "enabled_precisions"),
    ("keep_io_types", _compile(keep_io_types=None), ConfigError, "keep_io_types must be True or False"),
    ("plan type", _compile(plan={"linear": "fp16"}), ConfigError, "mixprec.PrecisionPlan"),
    ("backend", _compile(backend="tensorrt"), ConfigError, "backends are: eager, inductor"),
    ("debug", _compile(debug="no"), ConfigError, "debug must be True or False"),
    ("unknown keyword", _compile(use_fp32_accum=True), ConfigError, "did you mean 'use_fp32_acc'"),
    ("autocast setting alone", _compile(autocast_excluded_nodes={"^linear1$"}), ConfigError, "enable_autocast=True"),
    ("weak typing without low type", _compile(use_explicit_typing=False), ConfigError, "at least one low type"),
    # calibration data that does not fit
    ("calibration arity", _autocast(autocast_calibration_dataloader=[(torch.randn(1, 10), torch.randn(1, 10))]),
     CalibrationError, "batch 0"),
    ("calibration shape", _autocast(autocast_calibration_dataloader=[(torch.randn(1, 11),)]), CalibrationError, "11"),
    ("calibration dtype", _autocast(autocast_calibration_dataloader=[(torch.randn(1, 10).double(),)]),
     CalibrationError, "float64"),
    ("calibration empty", _autocast(autocast_calibration_dataloader=[]), CalibrationError, "no batches"),
    ("calibration dict key", _autocast(autocast_calibration_dataloader=[{"y": torch.randn(1, 10)}]), CalibrationError,
     "batch 0.*'y'"),
    # models and example inputs
    ("not a model", lambda: mixprec.compile(lambda x: x, X), ConfigError, "torch.nn.Module or a torch.export"),
    ("inputs arity", lambda: mixprec.compile(ThreeLinears(), (torch.randn(1, 10),) * 2), ConfigError, "do not fit"),
    ("inputs type", lambda: mixprec.compile(ThreeLinears(), {"x": X[0]}), ConfigError, "tuple or list"),
    ("cannot capture", lambda: mixprec.compile(DataDependent(), DataDependent.example_inputs()), UnsupportedModelError,
     "torch.export could not capture"),
    ("fails in eager", lambda: mixprec.compile(SeedExplicit(), (torch.randn(1, 10).half(),)), UnsupportedModelError,
     "does not run in eager PyTorch.*layer 'linear'"),
    ("bad dynamic_shapes", lambda: mixprec.compile(ThreeLinears(), X, dynamic_shapes=({0: "batch"},)),
     ConfigError, "dynamic_shapes"),
    # call time
    ("call dtype", _call(torch.randn(1, 10).double()), InputMismatchError, "input 0 \\('x'\\) has dtype torch.float64"),
    ("call rank", _call(torch.randn(10)), InputMismatchError, "rank 1"),
    ("call size", _call(torch.randn(2, 10)), InputMismatchError, "size 2 in dimension 0"),
    ("call device", _call(torch.empty(1, 10, device="meta")), InputMismatchError, "device meta"),
    ("call arity", _call(torch.randn(1, 10), torch.randn(1, 10)), InputMismatchError, "does not fit the model's forward"),
    # a keyword the program does not take: refused as a ConfigError naming it, never dropped (issue 42)
    ("call keyword", _call(torch.randn(1, 10), scale=2.0), ConfigError, "gives argument 'scale'"),
    ("call keyword is an input mismatch too", _call(torch.randn(1, 10), cache=object()), InputMismatchError,
     "gives argument 'cache'"),
    # plans that do not fit the model
    ("plan JSON for another model", _plan_json(_FOREIGN_PLAN), ConfigError, "conv2d_7"),
    ("plan JSON broken", _plan_json("{"), ConfigError, "not valid JSON"),
    ("plan JSON not a plan", _plan_json("[]"), ConfigError, "not a mixprec plan"),
    ("plan entry", lambda: NodePrecision("fp16"), ConfigError, "must be a torch dtype"),
]


@pytest.mark.parametrize("case, action, error, message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_the_right_error(case, action, error, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error, match=message) as info:
            action()
    assert isinstance(info.value, mixprec.MixedPrecisionError)
    assert len(str(info.value)) > 30  # a sentence, not a bare token


def test_patterns_that_match_nothing_warn_with_near_misses():
    with pytest.warns(mixprec.MixedPrecisionWarning, match="near misses: 'linear2'"):
        mixprec.compile(ThreeLinears().eval(), X, enable_autocast=True, autocast_excluded_nodes={"^linaer2$"})
    with pytest.warns(mixprec.MixedPrecisionWarning, match="no layer of this model uses"):
        mixprec.compile(ThreeLinears().eval(), X, enable_autocast=True, autocast_excluded_ops={"aten.conv2d"})


def test_the_matrix_is_large():
    assert len(CASES) >= 40
