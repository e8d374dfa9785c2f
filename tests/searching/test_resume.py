"""searching/resume.py: sensitivity trials run only what lowering their group changes, with the same numbers."""

import torch

from mixprec.calibrate.batches import Call
from mixprec.ir.captured import CapturedModel
from mixprec.searching import resume, sensitivity
from mixprec.searching.metrics import RelL2
from mixprec.searching.resume import Prefix
from mixprec.searching.trials import Trials


class _Stack(torch.nn.Module):
    """Four residual blocks: a group in the last one leaves the first three as the reference computes them."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))

    def forward(self, x):
        for block in self.blocks:
            x = x + torch.relu(block(x))
        return x.sum(-1), x


class _Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return self.lin(x)


def _setup(model, batches):
    captured = CapturedModel(model, batches[0].args)
    metric = RelL2()
    trials = Trials(captured, (torch.bfloat16,), metric)
    metric.prepare(trials.reference(), batches)
    names = {node.module: name for name, node in trials.info.items() if node.module and node.flops > 0}
    return trials, metric, names


def _resumed(trials, lowered, prefix):
    trials._resume = prefix  # as Trials.measure builds a phase-1 trial's program
    try:
        return trials.program(lowered)
    finally:
        trials._resume = None


def _batches(count=2):
    torch.manual_seed(0)
    return [Call((torch.randn(3, 16),), {}) for _ in range(count)]


def test_a_trial_resumed_from_the_reference_gives_the_full_programs_metric_bit_for_bit():
    torch.manual_seed(1)
    trials, metric, names = _setup(_Stack().eval(), _batches())
    prefix = Prefix(trials.reference_module())
    for module in ("blocks.0", "blocks.2", "blocks.3"):
        full = metric(trials.program([names[module]]))
        program = _resumed(trials, [names[module]], prefix)
        assert metric(program) == full > 0
    last = _resumed(trials, [names["blocks.3"]], prefix).module
    assert isinstance(last, resume._Resumed)
    ops = [n for n in last.cut.graph.nodes if n.op == "call_function"]
    assert 0 < len(ops) < 10  # the last block and the outputs; the three blocks before it are not run
    assert len(prefix._values) == 2  # the reference ran once per batch, for all three trials


def test_a_batch_the_values_were_not_computed_from_runs_the_full_program():
    trials, metric, names = _setup(_Stack().eval(), _batches())
    prefix = Prefix(trials.reference_module())
    program = _resumed(trials, [names["blocks.3"]], prefix)
    metric(program)
    x = metric.batches[0].args[0]
    copy = x.clone()  # equal values, another tensor: not looked up by equality
    assert prefix.values((copy,), {}) is not None and len(prefix._values) == 3  # computed for it, not looked up
    assert torch.equal(program(copy)[1], trials.program([names["blocks.3"]])(copy)[1])


def test_a_program_that_writes_state_back_is_never_cut():
    trials, metric, names = _setup(_Counting().eval(), _batches())
    prefix = Prefix(trials.reference_module())
    assert prefix.broken
    assert not isinstance(_resumed(trials, [names["lin"]], prefix).module, resume._Resumed)


def test_phase_one_resumes_its_trials_and_drops_the_values_after(monkeypatch):
    runs = []
    original = resume._Resumed.forward
    monkeypatch.setattr(resume._Resumed, "forward", lambda self, *a, **k: runs.append(1) or original(self, *a, **k))
    trials, metric, names = _setup(_Stack().eval(), _batches())
    study = sensitivity.Study(trials.info, [], trials, 0.0)
    from mixprec.searching.groups import LayerGroup

    study.groups = [LayerGroup(names[m], "linear", m, "Linear", trials.info[names[m]].flops, i)
                    for i, m in enumerate(("blocks.1", "blocks.3"))]
    sensitivity._measure_groups(study, sensitivity.Progress(stream=None), {})
    assert runs and trials.prefix is None
    for group in study.groups:
        full = metric(trials.program([(group.name, torch.bfloat16)]))
        assert study.sensitivity[group.name][torch.bfloat16].value == full


def test_a_reference_that_cannot_be_interpreted_leaves_every_trial_running_in_full(monkeypatch):
    trials, metric, names = _setup(_Stack().eval(), _batches())
    prefix = Prefix(trials.reference_module())
    full = metric(trials.program([names["blocks.3"]]))
    monkeypatch.setattr(resume._Recorder, "run_node", lambda self, node: 1 / 0)
    assert metric(_resumed(trials, [names["blocks.3"]], prefix)) == full  # not a failed trial
    assert prefix.broken and not prefix._values
