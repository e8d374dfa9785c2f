"""save_plot writes a PNG (matplotlib, Agg backend); without matplotlib it says how to install it."""

import sys

import pytest

import mixprec
from searching.test_result import example


def test_plot_is_a_png(tmp_path):
    path = tmp_path / "pareto.png"
    example().save_plot(path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert 20_000 < len(data) < 2_000_000


def test_plot_of_a_fraction_budget_with_many_groups(tmp_path):
    from mixprec.searching.result import GroupSensitivity

    base = example(tolerance=None, keep_fp32_fraction=0.5)
    many = tuple(
        GroupSensitivity(f"n{i}", "aten.linear.default", f"layers.{i}.mlp.fc", 10, 10.0 ** -(i % 5), g.precision)
        for i, g in enumerate(base.groups * 60)
    )
    path = tmp_path / "many.png"
    example(groups=many, tolerance=None, keep_fp32_fraction=0.5).save_plot(str(path))
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_without_matplotlib_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(mixprec.ConfigError, match=r"pip install mixprec\[search\]"):
        example().save_plot(tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_plot_of_a_model_with_nothing_to_lower(tmp_path):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4)).half().eval()
    result = mixprec.search(model, (torch.randn(2, 4).half(),), cache=False)
    assert result.groups == () and result.chosen.lowered == 0
    result.save_plot(tmp_path / "empty.png")
    assert (tmp_path / "empty.png").read_bytes()[:4] == b"\x89PNG"
