"""Calibration: streaming per-node statistics, batch forms, errors for data that does not fit, progress."""

import gc
import io
import logging
import weakref

import pytest
import torch

from mixprec.calibrate.statistics import TensorStats, collect, progress_line
from mixprec.errors import CalibrationError
from mixprec.ir.export import capture
from mixprec.ir.normalize import normalize
from mixprec.ir.work_program import WorkProgram


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 3.0


def work_of(model, inputs, **kw) -> WorkProgram:
    work = WorkProgram.from_exported(capture(model.eval(), inputs, **kw))
    normalize(work)
    return work


def test_stats_of_a_tensor():
    s = TensorStats.of([torch.tensor([[-3.0, 1.0], [2.5, 0.0]])])
    assert (s.absmax, s.min, s.max, s.nonfinite, s.numel, s.shape) == (3.0, -3.0, 2.5, 0, 4, (2, 2))


def test_non_finite_values_are_counted_not_mixed_into_the_range():
    s = TensorStats.of([torch.tensor([1.0, -float("inf"), float("nan"), -7.0])])
    assert (s.absmax, s.min, s.max, s.nonfinite) == (7.0, -7.0, 1.0, 2)
    only_bad = TensorStats.of([torch.tensor([float("inf"), float("nan")])])
    assert (only_bad.absmax, only_bad.nonfinite) == (0.0, 2)


def test_low_precision_tensors_and_several_outputs():
    s = TensorStats.of([torch.tensor([70000.0]).half(), torch.tensor([-2.0], dtype=torch.bfloat16)])
    assert s.nonfinite == 1 and s.absmax == 2.0 and s.numel == 2


def test_collect_matches_eager_values_over_all_batches():
    model = Small()
    batches = [(torch.randn(2, 4),), (torch.randn(2, 4) * 10,)]
    calibration = collect(work_of(model, batches[0]), batches)
    assert calibration.batches == 2
    with torch.no_grad():
        linear = torch.cat([model.fc(b[0]) for b in batches])
        relu = torch.relu(linear)
    stats = calibration.stats
    assert stats["linear"].absmax == pytest.approx(linear.abs().max().item(), rel=1e-6)
    assert stats["linear"].min == pytest.approx(linear.min().item(), rel=1e-6)
    assert stats["relu"].max == pytest.approx(relu.max().item(), rel=1e-6)
    assert stats["mul"].absmax == pytest.approx(3 * relu.max().item(), rel=1e-6)
    assert stats["x"].absmax == pytest.approx(max(b[0].abs().max().item() for b in batches), rel=1e-6)
    assert stats["linear"].batches == 2 and stats["linear"].numel == linear.numel()
    assert "p_fc_weight" not in stats  # stored tensors are judged without data


def test_memory_does_not_grow_with_batches():
    model = Small()
    work = work_of(model, (torch.randn(2, 4),))
    refs = []

    def batches(n):
        for _ in range(n):
            x = torch.randn(2, 4)
            refs.append(weakref.ref(x))
            yield (x,)

    few = collect(work, batches(2))
    many = collect(work, batches(40))
    gc.collect()
    assert all(r() is None for r in refs)  # no batch is kept
    assert few.stats.keys() == many.stats.keys()
    for stats in many.stats.values():
        assert all(isinstance(getattr(stats, f), (int, float, tuple)) for f in ("absmax", "min", "max", "nonfinite"))


def test_batch_forms_give_the_same_statistics():
    model = Small()
    data = torch.randn(6, 4)
    work = work_of(model, (data[:2],))
    forms = {
        "tuples": [(data[i : i + 2],) for i in range(0, 6, 2)],
        "lists": [[data[i : i + 2]] for i in range(0, 6, 2)],
        "tensors": [data[i : i + 2] for i in range(0, 6, 2)],
        "dataloader": torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=2),
    }
    results = {name: collect(work, form).stats for name, form in forms.items()}
    for name, stats in results.items():
        assert stats == results["tuples"], name


def test_dynamic_batch_dimension_accepts_other_sizes():
    model = Small()
    batch = torch.export.Dim("batch", min=1, max=64)
    work = work_of(model, (torch.randn(2, 4),), dynamic_shapes=({0: batch},))
    calibration = collect(work, [(torch.randn(5, 4),), (torch.randn(9, 4),)])
    assert calibration.stats["linear"].numel == 14 * 3


@pytest.mark.parametrize(
    "batches, message",
    [
        ([(torch.randn(2, 4), torch.randn(2))], r"holds 2 tensor\(s\), the model takes 1 \(x\).*labels"),
        ([(torch.randn(3, 4),)], r"batch 0, input 0 \('x'\): shape \(3, 4\) differs from \(2, 4\) in dimension 0"),
        ([(torch.randn(2, 4),), (torch.randn(2, 5),)], r"batch 1, input 0 \('x'\).*dimension 1"),
        ([(torch.randn(2, 4, 1),)], r"rank 3, expected rank 2"),
        ([(torch.randn(2, 4, dtype=torch.float64),)], r"dtype torch.float64 where torch.float32 is expected"),
        ([{"x": torch.randn(2, 4)}], r"batch 0 is a dict"),
        ([], r"yielded no batches"),
    ],
    ids=["arity", "shape", "second-batch", "rank", "dtype", "dict", "empty"],
)
def test_data_that_does_not_fit_raises(batches, message):
    work = work_of(Small(), (torch.randn(2, 4),))
    with pytest.raises(CalibrationError, match=message):
        collect(work, batches)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_on_a_terminal_after_the_delay():
    clock, stream = FakeClock(), Terminal()
    progress = progress_line(stream, delay=2.0, clock=clock)
    progress.update("batch 1/5")
    assert stream.getvalue() == ""  # short calibrations stay quiet
    clock.now = 3.0
    progress.update("batch 3/5")
    clock.now = 3.1
    progress.update("batch 4/5")  # too soon after the last line
    clock.now = 4.0
    progress.done("batch 5/5, done")
    text = stream.getvalue()
    assert "\r\033[Kmixprec: calibrating, batch 3/5 (3 s)" in text and "batch 4/5" not in text
    assert text.endswith("\r\033[Kmixprec: calibrating, batch 5/5, done (4.0 s)\n")


def test_a_short_calibration_shows_nothing_at_all():
    clock, stream = FakeClock(), Terminal()
    progress = progress_line(stream, delay=2.0, clock=clock)
    progress.update("batch 1/2")
    clock.now = 1.0
    progress.update("batch 2/2")
    progress.done("batch 2/2, done")
    assert stream.getvalue() == ""


def test_progress_without_a_terminal_logs(caplog):
    clock, stream = FakeClock(), io.StringIO()
    progress = progress_line(stream, delay=1.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="mixprec.calibrate.statistics"):
        clock.now = 1.5
        progress.update("batch 7")
        clock.now = 5.0
        progress.update("batch 8")  # logged at most every ten seconds
        progress.done("batch 9, done")
    assert stream.getvalue() == ""
    assert [r.getMessage() for r in caplog.records] == [
        "mixprec: calibrating, batch 7 (2 s)",
        "mixprec: calibrating, batch 9, done (5.0 s)",
    ]


def test_values_the_model_rejects_name_the_batch():
    model = torch.nn.Embedding(10, 4)
    work = work_of(model, (torch.randint(0, 10, (2, 3)),))
    with pytest.raises(CalibrationError, match="calibration batch 1 fits the captured input shapes but the model fails"):
        collect(work, [(torch.randint(0, 10, (2, 3)),), (torch.full((2, 3), 50),)])
