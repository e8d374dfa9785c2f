"""Command-line options -> keywords of mixprec.compile: one option per keyword, only those given."""

import re

import pytest
import torch

import mixprec
from mixprec.cli import build_parser
from mixprec.cli.options import compile_kwargs, option_hint
from mixprec.cli.spec import UsageError
from mixprec.settings import CompileSettings


def _kwargs(*options, tmp_path=None):
    args = build_parser().parse_args(["compile", "m.py:f", "-o", "out.mixprec.pt2", *options])
    return compile_kwargs(args)


def test_no_options_no_keywords():
    assert _kwargs() == {}


def test_every_option_maps_to_its_keyword(tmp_path):
    plan = mixprec.compile(torch.nn.Linear(2, 2).eval(), (torch.randn(1, 2),)).plan
    (tmp_path / "plan.json").write_text(plan.to_json())
    torch.save([(torch.randn(1, 2),), (torch.randn(1, 2),)], tmp_path / "calib.pt")
    kwargs = _kwargs(
        "--autocast", "fp16",
        "--exclude-nodes", "^head$", "--exclude-nodes", "encoder\\.layers\\.0",
        "--exclude-ops", "aten.softmax", "--exclude-ops", "layer_norm",
        "--max-output-threshold", "1000",
        "--max-depth-of-reduction", "4096",
        "--calibration-data", str(tmp_path / "calib.pt"),
        "--fp32-acc",
        "--no-keep-io-types",
        "--plan", str(tmp_path / "plan.json"),
        "--backend", "eager",
        "--debug",
        "--cost-cache", str(tmp_path / "costs.json"),
    )  # fmt: skip
    calibration = kwargs.pop("autocast_calibration_dataloader")
    assert len(calibration) == 2 and calibration[0][0].shape == (1, 2)
    assert kwargs.pop("plan") == plan
    assert kwargs == {
        "enable_autocast": True,
        "autocast_low_precision_type": "fp16",
        "autocast_excluded_nodes": ("^head$", "encoder\\.layers\\.0"),
        "autocast_excluded_ops": ("aten.softmax", "layer_norm"),
        "autocast_max_output_threshold": 1000.0,
        "autocast_max_depth_of_reduction": 4096,
        "use_fp32_acc": True,
        "keep_io_types": False,
        "backend": "eager",
        "debug": True,
        "cost_cache": str(tmp_path / "costs.json"),
    }
    # every keyword the options produce is a setting mixprec.compile knows
    known = {f for f in CompileSettings.__dataclass_fields__}
    assert set(kwargs) | {"plan", "autocast_calibration_dataloader"} <= known


def test_autocast_without_type_uses_the_default_low_type():
    assert _kwargs("--autocast") == {"enable_autocast": True}


def test_max_output_threshold_defaults_to_the_keywords_sentinel():
    args = build_parser().parse_args(["compile", "m.py:f", "-o", "out.mixprec.pt2", "--autocast"])
    assert args.max_output_threshold == "default" == CompileSettings().autocast_max_output_threshold
    assert _kwargs("--autocast", "--max-output-threshold", "default") == {"enable_autocast": True}
    assert _kwargs("--autocast", "--max-output-threshold", "512")["autocast_max_output_threshold"] == 512.0
    assert _kwargs("--autocast", "--max-output-threshold", "inf")["autocast_max_output_threshold"] == float("inf")
    assert _kwargs("--autocast", "--max-output-threshold", "none")["autocast_max_output_threshold"] is None
    with pytest.raises(UsageError, match="'big' is not a number, 'inf', 'none' or 'default'"):
        _kwargs("--autocast", "--max-output-threshold", "big")


def test_weak_typing_options():
    assert _kwargs("--no-explicit-typing", "--enabled-precisions", "fp32, bf16") == {
        "use_explicit_typing": False,
        "enabled_precisions": {"fp32", "bf16"},
    }


def test_backend_choices_come_from_the_registry():
    from mixprec.backends import known_backends

    action = next(
        a for a in build_parser()._subparsers._group_actions[0].choices["compile"]._actions if a.dest == "backend"
    )
    assert set(action.choices) == set(known_backends())


def test_option_hint_names_the_options_a_message_mentions():
    hint = option_hint("autocast_excluded_nodes only take effect with enable_autocast=True")
    assert "--exclude-nodes sets autocast_excluded_nodes" in hint and "--autocast sets enable_autocast" in hint
    assert option_hint("nothing relevant") == ""


@pytest.mark.parametrize(
    "option, message",
    [("--max-output-threshold=nan", "autocast_max_output_threshold must be"),
     ("--max-depth-of-reduction=0", "autocast_max_depth_of_reduction must be"),
     ("--exclude-ops=no_such_op", "autocast_excluded_ops")],
)  # fmt: skip
def test_values_the_settings_reject_are_config_errors(option, message):
    with pytest.raises(mixprec.ConfigError, match=re.escape(message)):
        mixprec.compile(torch.nn.Linear(2, 2).eval(), (torch.randn(1, 2),), **_kwargs("--autocast", option))


def test_include_options_map_to_their_keywords():
    kwargs = _kwargs("--autocast", "--include-nodes", "^lm_head$", "--include-nodes", "^fc",
                     "--include-ops", "aten.linear", "--low-precision-embeddings")  # fmt: skip
    assert kwargs == {
        "enable_autocast": True,
        "autocast_included_nodes": ("^lm_head$", "^fc"),
        "autocast_included_ops": ("aten.linear",),
        "autocast_low_precision_embeddings": True,
    }
    assert "--include-nodes sets autocast_included_nodes" in option_hint("autocast_included_nodes pattern '[' is bad")


def test_no_require_speedup_maps_to_its_keyword():
    assert _kwargs("--autocast", "--no-require-speedup") == {
        "enable_autocast": True, "autocast_require_speedup": False,
    }
    assert "autocast_require_speedup" not in _kwargs("--autocast")  # the default (True) is the keyword's own
    assert "--no-require-speedup sets autocast_require_speedup" in option_hint(
        "autocast_require_speedup only take effect with enable_autocast=True")


def test_no_int8_require_speedup_maps_to_its_keyword():
    assert _kwargs("--no-int8-require-speedup") == {"int8_require_speedup": False}
    assert "int8_require_speedup" not in _kwargs()  # the default (True) is the keyword's own
    assert "--no-int8-require-speedup sets int8_require_speedup" in option_hint(
        "int8_require_speedup must be True or False, got 'x'.")
