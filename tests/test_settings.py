"""Every keyword of API.md §1 is accepted, validated once, and bad values say what to change."""

import math
import re
import time

import pytest
import torch

import mixprec
from mixprec.errors import ConfigError
from mixprec.compiler import stage_options
from mixprec.settings import CompileSettings


def test_defaults_match_the_api():
    s = CompileSettings.from_kwargs({})
    assert s.use_explicit_typing is True and s.enable_autocast is False
    assert s.autocast_low_precision_type is None
    assert s.autocast_max_output_threshold == "default"  # 512 for fp16, bf16's own overflow guard for bf16
    assert s.autocast_max_depth_of_reduction is None
    assert s.use_fp32_acc is False and s.keep_io_types is True
    assert s.enabled_precisions == frozenset({torch.float32})
    assert s.backend == "eager" and s.debug is False


@pytest.mark.parametrize(
    "given, stored",
    [("default", "default"), (512, 512.0), (1e4, 1e4), (None, math.inf), (math.inf, math.inf)],
)
def test_max_output_threshold_values(given, stored):
    s = CompileSettings.from_kwargs({"enable_autocast": True, "autocast_max_output_threshold": given})
    assert s.autocast_max_output_threshold == stored and type(s.autocast_max_output_threshold) is type(stored)
    # what a saved file records: the default is not recorded, a number as written, no rule as None (JSON has no inf)
    recorded = s.explicit().get("autocast_max_output_threshold", "default")
    assert recorded == {"default": "default", math.inf: None}.get(stored, stored)
    assert CompileSettings.from_kwargs({"enable_autocast": True, "autocast_max_output_threshold": recorded}) == s


def test_the_default_threshold_needs_no_enable_autocast():
    assert CompileSettings.from_kwargs({"autocast_max_output_threshold": "default"}) == CompileSettings()
    with pytest.raises(ConfigError, match="autocast_max_output_threshold only take"):
        CompileSettings.from_kwargs({"autocast_max_output_threshold": 512})


def test_autocast_require_speedup_defaults_on_and_is_a_boolean_for_autocast():
    assert CompileSettings.from_kwargs({}).autocast_require_speedup is True  # issue 34: never slower by default
    off = CompileSettings.from_kwargs({"enable_autocast": True, "autocast_require_speedup": False})
    assert off.autocast_require_speedup is False and off.explicit()["autocast_require_speedup"] is False
    with pytest.raises(ConfigError, match="autocast_require_speedup must be True or False"):
        CompileSettings.from_kwargs({"enable_autocast": True, "autocast_require_speedup": "no"})
    with pytest.raises(ConfigError, match="autocast_require_speedup only take"):
        CompileSettings.from_kwargs({"autocast_require_speedup": False})


def test_settings_are_frozen():
    s = CompileSettings.from_kwargs({})
    with pytest.raises(AttributeError):
        s.use_fp32_acc = True


def test_unknown_keyword_suggests_the_right_one():
    with pytest.raises(ConfigError, match="did you mean 'use_fp32_acc'"):
        CompileSettings.from_kwargs({"use_fp32_accum": True})


@pytest.mark.parametrize("name", ["use_explicit_typing", "enable_autocast", "use_fp32_acc", "keep_io_types", "debug"])
def test_booleans_must_be_booleans(name):
    with pytest.raises(ConfigError, match=f"{name} must be True or False"):
        CompileSettings.from_kwargs({name: 1})


def test_excluded_ops_every_spelling_parses_to_one_name():
    # parsing happens before the combination check, so test the parser through a valid combination path
    from mixprec.settings import _validated

    with pytest.raises(ConfigError, match="only take effect with enable_autocast=True"):
        _validated({"autocast_excluded_ops": [torch.ops.aten.flatten.using_ints, "flatten"]})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"autocast_low_precision_type": "fp8"}, "autocast_low_precision_type='fp8'"),
        ({"autocast_low_precision_type": torch.float32}, "autocast_low_precision_type"),
        ({"autocast_excluded_nodes": ["linear[0-"]}, "not a valid regular expression"),
        ({"autocast_excluded_nodes": [3]}, "not a string or re.Pattern"),
        ({"autocast_excluded_ops": ["aten.no_such_op"]}, "names no operator"),
        ({"autocast_max_output_threshold": -1.0}, "positive number"),
        ({"autocast_max_output_threshold": float("nan")}, "positive number"),
        ({"autocast_max_output_threshold": "big"}, "positive number"),
        ({"autocast_max_output_threshold": "Default"}, 'must be "default"'),
        ({"autocast_max_output_threshold": True}, "positive number"),
        ({"autocast_max_depth_of_reduction": 0}, "positive integer"),
        ({"autocast_max_depth_of_reduction": 2.5}, "positive integer"),
        ({"autocast_calibration_dataloader": 5}, "iterable of input tuples"),
        ({"autocast_calibration_dataloader": torch.ones(3)}, "iterable of input tuples"),
        ({"enabled_precisions": {"fp8"}}, "enabled_precisions"),
        ({"enabled_precisions": set()}, "must not be empty"),
        ({"plan": {"linear": "fp16"}}, "mixprec.PrecisionPlan"),
        ({"backend": "tensorrt"}, "backends are: eager"),
    ],
)
def test_bad_values_say_what_to_change(kwargs, message):
    """compile validates through stage_options: the keywords, then each stage's options (plan, backend)."""
    with pytest.raises(ConfigError, match=re.escape(message) if "*" not in message else message):
        stage_options(kwargs)


def test_autocast_settings_without_enable_autocast_are_not_ignored():
    with pytest.raises(ConfigError, match="only take effect with enable_autocast=True"):
        CompileSettings.from_kwargs({"autocast_low_precision_type": torch.bfloat16})
    with pytest.raises(ConfigError, match="autocast_excluded_nodes"):
        CompileSettings.from_kwargs({"autocast_excluded_nodes": {"^conv1$"}})


def test_contradictions():
    with pytest.raises(ConfigError, match="enable_autocast=True needs use_explicit_typing=True"):
        CompileSettings.from_kwargs({"enable_autocast": True, "use_explicit_typing": False})
    with pytest.raises(ConfigError, match="use_fp32_acc=True needs use_explicit_typing=True"):
        CompileSettings.from_kwargs({"use_fp32_acc": True, "use_explicit_typing": False})
    with pytest.raises(ConfigError, match="only chooses precisions under weak typing"):
        CompileSettings.from_kwargs({"enabled_precisions": {torch.float32, torch.float16}})
    with pytest.raises(ConfigError, match="needs torch.float32 and at least one low type"):
        CompileSettings.from_kwargs({"use_explicit_typing": False, "enabled_precisions": {torch.float16}})


def test_explicit_lists_only_non_defaults():
    s = CompileSettings.from_kwargs({"use_fp32_acc": True, "keep_io_types": False})
    assert s.explicit() == {"use_fp32_acc": True, "keep_io_types": False}


def test_compile_validates_before_capturing():
    class Exploding(torch.nn.Module):
        def forward(self, x):
            raise AssertionError("compile must not run the model before validating settings")

    with pytest.raises(ConfigError):
        mixprec.compile(Exploding(), (torch.ones(1),), backend="nope")


def test_each_stage_gets_its_share_of_the_keywords():
    options = stage_options({
        "enable_autocast": True, "autocast_low_precision_type": "fp16", "autocast_excluded_ops": {"softmax"},
        "autocast_keep_residual_stream": False, "use_fp32_acc": True, "backend": "inductor",
    })
    rules = options.planning.rules
    assert rules.low_precision_type == torch.float16 and rules.excluded_ops == frozenset({"aten.softmax"})
    assert rules.keep_residual_stream is False and options.planning.use_fp32_acc is True
    assert options.backend.backend == "inductor" and options.backend.runtime_guard is None
    assert options.weak is None  # strong typing
    off = stage_options({})
    assert off.planning.rules is None and off.planning.plan is None
    weak = stage_options({"use_explicit_typing": False, "enabled_precisions": {torch.float32, torch.bfloat16}})
    assert weak.weak.precisions == frozenset({torch.float32, torch.bfloat16}) and weak.weak.planning is weak.planning


def test_a_guard_on_a_compiled_backend_is_refused():
    with pytest.raises(ConfigError, match="runtime_guard checks layer outputs in the eager backend"):
        stage_options({"runtime_guard": "warn", "backend": "inductor"})
    with pytest.raises(ConfigError, match="runtime_guard must be None, 'warn' or 'raise'"):
        stage_options({"runtime_guard": "loud"})


def test_many_unknown_keywords_are_reported_once_in_linear_time():
    """200k unknown names took 56 s (a did-you-mean search each) and a message naming every one."""
    names = {f"use_fp32_acc{i}": True for i in range(200_000)}
    start = time.perf_counter()
    with pytest.raises(ConfigError) as caught:
        CompileSettings.from_kwargs(names)
    assert time.perf_counter() - start < 2
    message = str(caught.value)
    assert "'use_fp32_acc0' (did you mean 'use_fp32_acc'?)" in message and "and 199980 more" in message
    assert len(message) < 2000


def test_a_long_unknown_keyword_is_shown_cut():
    with pytest.raises(ConfigError) as caught:
        CompileSettings.from_kwargs({"x" * 1_000_000: 1})
    assert len(str(caught.value)) < 1000 and "xxx...'" in str(caught.value)


def test_weight_only_dynamic_activations_is_openvinos_runtime_feature():
    """A group size (multiple of 16: OpenVINO's CPU plugin ignores others) for backend='openvino' only; 0/None: off."""
    on = stage_options({"backend": "openvino", "weight_only_dynamic_activations": 32})
    assert on.backend.weight_only_dynamic_activations == 32
    assert on.settings.explicit()["weight_only_dynamic_activations"] == 32
    for off in (0, None):
        options = stage_options({"backend": "openvino", "weight_only_dynamic_activations": off})
        assert options.backend.weight_only_dynamic_activations is None
        assert "weight_only_dynamic_activations" not in options.settings.explicit()
    for backend in ("eager", "inductor"):
        with pytest.raises(ConfigError, match=f"backend='{backend}' has no such runtime feature.*backend='openvino'"):
            stage_options({"backend": backend, "weight_only_dynamic_activations": 32})
    for bad in (-16, 20, 8, 2.5, True, "32", 1 << 17, [32]):
        with pytest.raises(ConfigError, match="weight_only_dynamic_activations must be None .* multiple of 16"):
            stage_options({"backend": "openvino", "weight_only_dynamic_activations": bad})
