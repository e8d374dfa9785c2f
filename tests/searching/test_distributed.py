"""mixprec.search on a Ray cluster: the same result as in one process, faults, errors, progress, the CLI.

One local Ray cluster for the module (loopback only, 2 CPUs, no dashboard), shut down after it; every
search given ray_address joins it (a process already connected to Ray uses that connection).
"""

import io
import os
import signal
import sys
import threading
import warnings

import pytest
import torch
from models import SensitiveByConstruction, TRTorchSeed, zero_sum_rows

import mixprec
from mixprec.cli import main
from mixprec.measure import costs as cost_models
from mixprec.errors import ConfigError
from mixprec.searching import SearchCache
from mixprec.searching.distributed import Cluster
from mixprec.searching.worker import TrialWorker

ray = pytest.importorskip("ray")  # requirements-dev.txt pins it: CI has it


@pytest.fixture(scope="module")
def cluster():
    """2 CPUs; this process at 1 torch thread, so 2 workers of 1 thread each fit (a worker takes our thread count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def sensitive():
    torch.manual_seed(1)
    model = SensitiveByConstruction().eval()
    inputs = SensitiveByConstruction.example_inputs()
    data = [(zero_sum_rows(8),) for _ in range(3)]
    return model, inputs, data


def same(a, b):
    """Plan, sensitivities (bit for bit), pareto points (latency aside: a timing), baseline and trial count."""
    assert a.plan.to_json() == b.plan.to_json()
    assert a.groups == b.groups  # GroupSensitivity: name, module, flops, sensitivity float, precision, why
    strip = lambda points: [  # noqa: E731
        (p.lowered, p.low_precision_flops_fraction, p.metric, p.chosen, p.mix, p.lowered_by_type) for p in points
    ]
    assert strip(a.pareto) == strip(b.pareto)
    assert (a.baseline, a.met, a.trials) == (b.baseline, b.met, b.trials)


@pytest.mark.parametrize("budget", [{}, {"keep_fp32_fraction": 0.3}])
def test_distributed_equals_single_host(cluster, sensitive, budget):
    model, inputs, data = sensitive
    here = mixprec.search(model, inputs, eval_dataloader=data, cache=False, **budget)
    there = mixprec.search(model, inputs, eval_dataloader=data, cache=False, ray_address="auto", workers=2, **budget)
    same(here, there)


def test_distributed_equals_single_host_over_two_types(cluster, sensitive, monkeypatch):
    """int8 and bf16 trials on the workers (int8 boundaries' ranges travel in the payload): the same mix."""
    from mixprec.searching import latency

    table = {torch.float32: 10.0, torch.bfloat16: 4.0, torch.int8: 2.5}  # a VNNI CPU's shape: int8 fastest
    monkeypatch.setattr(cost_models, "COSTS", cost_models.CostModels())
    monkeypatch.setattr(latency, "measure_costs", lambda backend, kind, dtypes, device: {d: table[d] for d in dtypes})
    model, inputs, data = sensitive
    kwargs = dict(eval_dataloader=data, cache=False, low_precision_type=("int8", "bf16"), tolerance=0.05)
    here = mixprec.search(model, inputs, **kwargs)
    there = mixprec.search(model, inputs, ray_address="auto", workers=2, **kwargs)
    same(here, there)
    assert here.chosen.lowered_by_type["int8"] > 0 and here.chosen.lowered_by_type["bfloat16"] > 0


def _tiny_bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=100, max_position_embeddings=64)
    return transformers.BertModel(config).eval()


def test_eval_batches_of_other_batch_and_sequence_sizes_run_on_their_captures_on_a_cluster(cluster):
    """Issue 34: a BERT searched with example inputs of 2 x 8 tokens on batches of other batch and sequence sizes
    and no other keywords (3 x 11 and 2 x 6: the dynamic capture; 1 x 5: a batch of 1, an exact-shape capture)
    runs each on a capture for its sizes in one process (tests/searching/test_shapes.py); those captures travel to
    the workers, so the cluster's plan, sensitivities (bit for bit, at one thread) and result are one process's
    (batch 2 is held out, checked in this process). It was a ConfigError on a cluster."""
    model = _tiny_bert()
    generator = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, 100, size, generator=generator),) for size in ((2, 8), (3, 11), (2, 6), (1, 5))]
    kwargs = dict(eval_dataloader=data, tolerance=1e-3, cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)  # bf16 is emulated on AVX2-only CPUs
        here = mixprec.search(model, data[0], **kwargs)
        there = mixprec.search(model, data[0], ray_address="auto", workers=2, **kwargs)
    same(here, there)
    assert 0 < there.chosen.lowered < len(there.groups)  # a mix: the equal plans say something
    assert there.held_out_metric == here.held_out_metric


class _Masked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, mask=None):
        return self.fc(x) if mask is None else self.fc(x) * mask.unsqueeze(-1)


def test_eval_batches_with_keywords_the_example_left_out_run_on_their_capture_on_a_cluster(cluster):
    """Issue 34: a batch that gives ``mask`` beside example inputs ``(x,)`` runs on a capture of its own call
    (tests/searching/test_shapes.py); that capture travels to the workers as the example's program does, so the
    cluster measures what one process measures: masked batches of two batch sizes and one without the mask (batch
    2 is held out, checked in this process)."""
    torch.manual_seed(0)
    model = _Masked().eval()
    x = torch.randn(4, 6, 8)
    mask = torch.ones(4, 6)
    mask[1:, 3:] = 0
    data = [{"x": x, "mask": mask}, {"x": x[:2] * 2, "mask": mask.flip(0)[:2]}, (x * 3,), (x * 0.5,)]
    kwargs = dict(eval_dataloader=data, tolerance=1e-3, cache=False)
    here = mixprec.search(model, (x,), **kwargs)
    there = mixprec.search(model, (x,), ray_address="auto", workers=2, **kwargs)
    same(here, there)
    unmasked = mixprec.search(model, (x,), **dict(kwargs, eval_dataloader=[(x,), (x[:2] * 2,), (x * 3,), (x * 0.5,)]))
    assert [g.sensitivity for g in unmasked.groups] != [g.sensitivity for g in here.groups]  # the masks count


def test_a_collators_padded_batches_beside_example_ids_only_on_a_cluster(cluster):
    """Issue 34: a BERT searched with example inputs ``(input_ids,)`` on a collator's ``{input_ids, attention_mask}``
    batches, each padded to its own length: the one dynamic capture of the masked call travels to the workers, and
    the cluster's plan, sensitivities (bit for bit, at this process's one thread) and result are one process's."""
    model = _tiny_bert()
    data = []
    for seed, length in enumerate((8, 11, 6, 5)):
        generator = torch.Generator().manual_seed(seed)
        mask = torch.ones(2, length, dtype=torch.long)
        mask[0, length // 2:] = 0  # the shorter row padded
        data.append({"input_ids": torch.randint(0, 100, (2, length), generator=generator), "attention_mask": mask})
    kwargs = dict(eval_dataloader=data, tolerance=1e-3, cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)  # bf16 is emulated on AVX2-only CPUs
        here = mixprec.search(model, (data[0]["input_ids"],), **kwargs)
        there = mixprec.search(model, (data[0]["input_ids"],), ray_address="auto", workers=2, **kwargs)
    same(here, there)
    assert 0 < there.chosen.lowered < len(there.groups)  # a mix: the equal plans say something
    assert there.held_out_metric == here.held_out_metric


def test_an_accuracy_callback_on_batches_of_other_sizes_on_a_cluster(cluster):
    """An Accuracy callback that runs the program on its own batches of other sizes than the example's 2 x 8 tokens
    (3 x 11: the dynamic capture; 1 x 5: an exact-shape one; made when it runs the fp32 model): those captures
    travel, and the cluster's search is one process's (the workers ran every call on the example capture)."""
    model = _tiny_bert()
    generator = torch.Generator().manual_seed(1)
    example = (torch.randint(0, 100, (2, 8), generator=generator),)
    batches = [torch.randint(0, 100, size, generator=generator) for size in ((3, 11), (1, 5))]
    with torch.no_grad():
        targets = [model(b).last_hidden_state for b in batches]

    def evaluate(program):  # a closure over tensors: pickled by value to the workers
        return -sum(float((program(b)[0] - t).pow(2).mean()) for b, t in zip(batches, targets))

    kwargs = dict(metric=mixprec.Accuracy(evaluate), tolerance=1e-6, cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mixprec.MixedPrecisionWarning)  # bf16 is emulated on AVX2-only CPUs
        here = mixprec.search(model, example, **kwargs)
        there = mixprec.search(model, example, ray_address="auto", workers=2, **kwargs)
    same(here, there)
    assert 0 < there.chosen.lowered < len(there.groups)


def test_the_payload_names_the_modules_of_the_programs_pytree_types():
    """A worker imports them before torch.export.load (which cannot rebuild a transformers ModelOutput otherwise):
    with an Accuracy metric nothing else in the payload imports transformers on the worker."""
    import pickle

    from mixprec.ir.captured import CapturedModel
    from mixprec.searching.distributed import RayPool
    from mixprec.searching.metrics import RelL2
    from mixprec.searching.trials import Trials

    trials = Trials(CapturedModel(_tiny_bert(), (torch.randint(0, 100, (2, 8)),)), torch.bfloat16, RelL2())
    trials.metric.prepare(trials.reference(), [])
    payload = RayPool(Cluster("auto", 1), trials, str).payload()
    assert pickle.loads(payload)["modules"] == ("transformers.modeling_outputs",)


def test_a_user_metric_and_another_model(cluster):
    torch.manual_seed(3)
    model = TRTorchSeed().eval()
    inputs = TRTorchSeed.example_inputs()

    def worst(out, ref):  # a closure: pickled by value to the workers
        return (out - ref).abs().max().item()

    here = mixprec.search(model, inputs, metric=worst, tolerance=0.05, cache=False)
    there = mixprec.search(model, inputs, metric=worst, tolerance=0.05, cache=False, ray_address="auto")
    same(here, there)
    assert len(there.groups) > 1


def test_the_cache_is_kept_by_the_driver(cluster, sensitive):
    """A second search with another budget runs only its new phase-2 trials, as in one process."""
    model, inputs, data = sensitive
    counts = []
    for where in ({}, {"ray_address": "auto"}):
        cache = SearchCache()
        first = mixprec.search(model, inputs, eval_dataloader=data, cache=cache, **where)
        second = mixprec.search(model, inputs, eval_dataloader=data, cache=cache, keep_fp32_fraction=0.5, **where)
        counts.append((first.trials, second.trials, second.plan.to_json()))
    assert counts[0] == counts[1]
    assert counts[1][1] < counts[1][0]


def test_a_worker_killed_mid_trial_is_restarted_and_its_trial_rerun(cluster, sensitive, tmp_path):
    """The first trial that lowers something kills its own worker process (SIGKILL): the result is still complete."""
    model, inputs, data = sensitive
    marker = str(tmp_path / "killed")

    def metric(out, ref):
        if not torch.equal(out, ref) and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return ((out - ref).norm() / ref.norm()).item()

    there = mixprec.search(model, inputs, eval_dataloader=data, metric=metric, tolerance=1e-2, cache=False,
                           ray_address="auto", workers=2)
    with open(marker) as f:
        killed = int(f.read())
    assert killed != os.getpid()  # a worker died, not this process
    here = mixprec.search(model, inputs, eval_dataloader=data, metric=metric, tolerance=1e-2, cache=False)
    same(here, there)
    assert all(g.sensitivity == g.sensitivity for g in there.groups)  # every group measured, none dropped


def test_a_trial_that_raises_is_reported_with_its_group(cluster, sensitive):
    model, inputs, data = sensitive

    def metric(out, ref):
        if not torch.equal(out, ref):
            raise ValueError("metric broke")
        return 0.0

    with pytest.raises(ConfigError, match=r"layer group '[^']+'.*ValueError: metric broke") as error:
        mixprec.search(model, inputs, eval_dataloader=data, metric=metric, tolerance=1e-2, cache=False,
                       ray_address="auto", workers=2)
    names = {g.name for g in mixprec.search(model, inputs, eval_dataloader=data, cache=False).groups}
    assert any(f"layer group '{name}'" in str(error.value) for name in names)


def test_a_metric_that_cannot_be_pickled_is_a_config_error(cluster, sensitive):
    model, inputs, data = sensitive
    lock = threading.Lock()

    def metric(out, ref):
        with lock:
            return 0.0

    with pytest.raises(ConfigError, match="cannot send the search's metric or data to Ray workers"):
        mixprec.search(model, inputs, eval_dataloader=data, metric=metric, tolerance=1e-2, cache=False,
                       ray_address="auto")


def test_progress_counts_trials_across_the_cluster(cluster, sensitive):
    model, inputs, data = sensitive

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    result = mixprec.search(model, inputs, eval_dataloader=data, cache=False, ray_address="auto", progress_stream=stream)
    trials = sum(1 for g in result.groups if "safety rule" not in g.reason)
    text = stream.getvalue()
    assert f"sensitivity 0/{trials} trials on the Ray cluster" in text
    assert f"sensitivity {trials}/{trials} trials on the Ray cluster" in text


def test_the_worker_rebuilds_the_drivers_program(cluster, sensitive):
    """The payload is put once; a worker finds the driver's node names (or refuses) and measures as the driver does."""
    from mixprec.ir.captured import CapturedModel
    from mixprec.searching.distributed import RayPool
    from mixprec.searching.metrics import RelL2
    from mixprec.searching.trials import Trials

    model, inputs, data = sensitive
    trials = Trials(CapturedModel(model, inputs), torch.bfloat16, RelL2())
    trials.metric.prepare(trials.reference(), data)
    payload = RayPool(Cluster("auto", 1), trials, str).payload()
    worker = TrialWorker(torch.get_num_threads())
    worker.load(payload)
    name = next(n for n, node in trials.info.items() if node.module == "fc1")
    assert worker.trials.measure((name,)) == trials.measure((name,))
    assert worker.trials.count == 1


def test_the_worker_rebuilds_the_keyed_captures_and_routes_each_batch_to_its_own():
    """The keyed capture travels as torch.export bytes with its node map (plain strings: no model, no user object
    beyond today's payload); the worker runs a masked batch on it and a batch without the mask on the example's."""
    import pickle

    from mixprec.calibrate.batches import Call
    from mixprec.ir.captured import CapturedModel
    from mixprec.searching.distributed import RayPool
    from mixprec.searching.metrics import RelL2
    from mixprec.searching.shapes import BatchSizes
    from mixprec.searching.trials import Trials

    torch.manual_seed(0)
    model = _Masked().eval()
    x = torch.randn(4, 6, 8)
    mask = torch.ones(4, 6)
    mask[1:, 3:] = 0
    captured = CapturedModel(model, (x,))
    sizes = BatchSizes(captured)
    calls = sizes.calls([Call((), {"x": x, "mask": mask}), Call((x * 2,), {})], "eval_dataloader")  # as search's
    trials = Trials(captured, torch.bfloat16, RelL2(), sizes=sizes)
    trials.metric.prepare(trials.reference(), calls)
    payload = RayPool(Cluster("auto", 1), trials, str).payload()
    ((extra, program, shared, names, nodes),) = pickle.loads(payload)["others"]
    assert extra == ("mask",) and set(shared) == {"fc.weight", "fc.bias"}
    assert all(isinstance(n, str) for pair in names.items() for n in pair) and all(isinstance(n, str) for n in nodes)
    assert {t.device.type for t in torch.export.load(io.BytesIO(program)).state_dict.values()} == {"meta"}
    worker = TrialWorker(torch.get_num_threads())
    worker.load(payload)
    keyed = worker.trials.sizes.graphs[0][1].captured.exported.state_dict  # the weights travel once
    assert all(keyed[n] is worker.trials.captured.exported.state_dict[n] for n in shared)
    (name,) = [n for n, node in trials.info.items() if node.module == "fc"]
    assert worker.trials.measure((name,)) == trials.measure((name,))
    ran = []
    program = worker.trials.program((name,))
    program._build = lambda graph, build=program._build: ran.append(graph) or build(graph)
    for call in calls:
        program(*call.args, **call.kwargs)
    assert ran[0] is worker.trials.sizes.graphs[0][1] and ran[1] is None  # the masked call's capture, the example's
    with pytest.raises(ConfigError, match=r"batch with mask \(input shapes \[\(1, 6, 8\), \(1, 6\)\]\) fits no "
                       "capture this Ray worker holds.*leave ray_address out"):
        worker.trials.sizes.graph(Call((), {"x": x[:1], "mask": mask[:1]}), "batch")  # no eval batch had 1 row


def test_the_worker_rebuilds_the_captures_of_other_sizes_and_routes_each_batch_as_the_driver_does(sensitive):
    """Batches of other sizes and no other keywords: their captures (the dynamic one, and a batch of 1's exact-shape
    one) travel as the keyed ones do, weights as meta tensors (the example capture's put back on the worker), and
    the worker runs each batch on the capture the driver runs it on: the example's, the dynamic one, the batch of
    1's."""
    import pickle

    from mixprec.calibrate.batches import Call
    from mixprec.ir.captured import CapturedModel
    from mixprec.searching.distributed import RayPool
    from mixprec.searching.metrics import RelL2
    from mixprec.searching.shapes import BatchSizes
    from mixprec.searching.trials import Trials

    model, inputs, _ = sensitive
    captured = CapturedModel(model, inputs)
    sizes = BatchSizes(captured)
    calls = sizes.calls([Call((zero_sum_rows(n),), {}) for n in (8, 5, 1, 3)], "eval_dataloader")  # as search's
    trials = Trials(captured, torch.bfloat16, RelL2(), sizes=sizes)
    trials.metric.prepare(trials.reference(), calls)
    payload = RayPool(Cluster("auto", 1), trials, str).payload()
    others = pickle.loads(payload)["others"]
    assert [extra for extra, *_ in others] == [(), ()]
    for _, program, shared, names, nodes in others:
        assert set(shared) == set(captured.exported.state_dict)  # every weight is the example capture's
        assert {t.device.type for t in torch.export.load(io.BytesIO(program)).state_dict.values()} == {"meta"}
    worker = TrialWorker(torch.get_num_threads())
    worker.load(payload)
    (_, dynamic), (_, single) = worker.trials.sizes.graphs
    assert all(dynamic.captured.exported.state_dict[n] is worker.trials.captured.exported.state_dict[n]
               for n in captured.exported.state_dict)
    driver = [graph for _, graph in sizes.other_graphs()]
    assert [sizes.graph(call) for call in calls] == [None, driver[0], driver[1], driver[0]]
    assert [worker.trials.sizes.graph(call) for call in calls] == [None, dynamic, single, dynamic]
    name = next(n for n, node in trials.info.items() if node.module == "fc1")
    assert worker.trials.measure((name,)) == trials.measure((name,))


def test_more_workers_than_cpus_runs_as_many_as_there_are_cpus(cluster, sensitive):
    """An actor takes a CPU: asking for more than the cluster has would leave trials waiting forever."""
    model, inputs, data = sensitive
    with pytest.warns(mixprec.MixedPrecisionWarning, match="workers=5 but the Ray cluster has 2 CPUs and each worker "
                      "takes 1 .*running 2"):
        there = mixprec.search(model, inputs, eval_dataloader=data, cache=False, ray_address="auto", workers=5)
    same(mixprec.search(model, inputs, eval_dataloader=data, cache=False), there)


def test_workers_run_with_this_processs_threads(cluster, sensitive):
    """Reductions split across threads round differently: a worker takes this process's thread count (and CPUs)."""
    from mixprec.searching import distributed

    model, inputs, data = sensitive
    torch.set_num_threads(2)
    try:
        with pytest.warns(mixprec.MixedPrecisionWarning, match="each worker takes 2 .*running 1"):
            mixprec.search(model, inputs, eval_dataloader=data, cache=False, ray_address="auto", workers=2)
        (key,) = [k for k in distributed._ACTORS if k[1] == 2]
        (actor,) = distributed._ACTORS[key]
        assert ray.get(actor.threads.remote()) == 2
    finally:
        torch.set_num_threads(1)
        distributed.release()


def test_release_stops_the_workers(cluster, sensitive):
    from mixprec.searching import distributed

    model, inputs, data = sensitive
    mixprec.search(model, inputs, eval_dataloader=data, cache=False, ray_address="auto", workers=1)
    actors = [a for group in distributed._ACTORS.values() for a in group]
    assert actors
    distributed.release()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actors[0].pid.remote(), timeout=60)


def test_bad_arguments_are_config_errors(sensitive):
    model, inputs, data = sensitive
    with pytest.raises(ConfigError, match="workers=2 needs ray_address="):
        mixprec.search(model, inputs, workers=2)
    with pytest.raises(ConfigError, match="workers must be a positive integer"):
        mixprec.search(model, inputs, ray_address="local", workers=0)
    with pytest.raises(ConfigError, match="ray_address must be 'local'"):
        mixprec.search(model, inputs, ray_address=7)


def test_missing_ray_is_a_clear_error(sensitive, monkeypatch):
    model, inputs, data = sensitive
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ConfigError, match=r"Ray is not installed here.*pip install 'mixprec\[ray\]'"):
        mixprec.search(model, inputs, cache=False, ray_address="local")


TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = f"""
import sys
sys.path.insert(0, {TESTS!r})
import torch
from models import SensitiveByConstruction, zero_sum_rows


def model():
    torch.manual_seed(0)
    m = SensitiveByConstruction().eval()
    return m, m.example_inputs()


def eval_data():
    torch.manual_seed(1)
    return [(zero_sum_rows(8),) for _ in range(2)]
"""


def test_cli_runs_on_the_cluster(cluster, tmp_path, capsys):
    spec = tmp_path / "spec.py"
    spec.write_text(SPEC)
    plans = []
    for extra in ([], ["--ray", "auto", "--workers", "2"]):
        out = tmp_path / f"plan{len(plans)}.json"
        assert main(["search", f"{spec}:model", "--eval-data", f"{spec}:eval_data", "-q", "-o", str(out), *extra]) == 0
        plans.append(out.read_text())
    assert plans[0] == plans[1]


def test_cli_workers_without_ray_exits_2(tmp_path, capsys):
    spec = tmp_path / "spec.py"
    spec.write_text(SPEC)
    assert main(["search", f"{spec}:model", "--workers", "2"]) == 2
    assert "needs ray_address=" in capsys.readouterr().err


def test_a_cluster_that_cannot_be_joined_says_how_to_start_one(sensitive, monkeypatch):
    model, inputs, data = sensitive

    def init(**kwargs):
        raise ConnectionError("Could not find any running Ray instance")

    fake = type(sys)("ray")
    fake.is_initialized, fake.init = (lambda: False), init
    monkeypatch.setitem(sys.modules, "ray", fake)
    with pytest.raises(ConfigError, match=r"could not connect to the Ray cluster at 'auto'.*ray start --head"):
        mixprec.search(model, inputs, cache=False, ray_address="auto")


def test_a_search_on_the_cluster_calibrates_a_dataset_on_it(cluster, sensitive):
    """ray_address and a ray.data.Dataset together: the shards' statistics come from the cluster whose CPUs the
    search's workers may already hold (a worker of an earlier search keeps its CPU), and give the plan of the same
    rows calibrated in this process."""
    ray_data = pytest.importorskip("ray.data")
    models = sys.modules[SensitiveByConstruction.__module__]
    ray.cloudpickle.register_pickle_by_value(models)  # the workers unpickle the test's model class by value
    try:
        model, inputs, data = sensitive
        x = zero_sum_rows(16)
        x[5] *= 1e6  # a row whose values overflow fp16: the safety rules keep the layers reading it fp32
        dataset = ray_data.from_items([{"x": row.numpy()} for row in x], override_num_blocks=2)
        search = dict(eval_dataloader=data, cache=False, low_precision_type=torch.float16, keep_fp32_fraction=0.25)
        with pytest.warns(mixprec.MixedPrecisionWarning, match="float16 on a CPU"):
            mixprec.search(model, inputs, ray_address="auto", workers=2, **search)  # the workers now hold the CPUs
            there = mixprec.search(model, inputs, calibration_dataloader=dataset, ray_address="auto", workers=2,
                                   **search)
            here = mixprec.search(model, inputs, calibration_dataloader=[(x[:8],), (x[8:],)], **search)
    finally:
        ray.cloudpickle.unregister_pickle_by_value(models)
    same(here, there)
    assert "safety rule: input absmax" in there.groups[0].reason


def test_phase_two_points_are_timed_by_the_workers_that_measured_them(cluster, sensitive, monkeypatch):
    """A pareto point measured in phase 2 on the cluster gets its latency from the worker that ran its trial (its
    program built and warm there); the driver times only the points measured before phase 2 (the fp32 baseline)."""
    from mixprec.searching import latency

    model, inputs, data = sensitive
    timed_here = []
    measure = latency.time_plans
    monkeypatch.setattr(latency, "time_plans", lambda programs, batch, **kw: timed_here.extend(programs)
                        or measure(programs, batch, **kw))
    there = mixprec.search(model, inputs, eval_dataloader=data, cache=False, ray_address="auto", workers=2)
    assert all(p.latency_seconds > 0 for p in there.pareto)
    assert timed_here == [frozenset()]  # the baseline: phase 1 measured it, untimed
    assert len(there.pareto) > 1
    here = mixprec.search(model, inputs, eval_dataloader=data, cache=False)
    same(here, there)
    # in one process every point is timed by its trial's stopwatch (measure.Stopwatch), the baseline's in phase 1
    assert len(timed_here) == 1 and all(p.latency_seconds > 0 for p in here.pareto)


def test_the_cluster_of_a_call_leaves_a_cached_studys_trials_as_it_found_them():
    """cluster_for closes the call's cluster however the call ends; timing_on attaches the (cached) trials and sets
    the batch the workers time phase 2's points on, and both are gone after the call: no actor is started here."""
    from types import SimpleNamespace

    from mixprec.searching.distributed import cluster_for

    trials = SimpleNamespace(sizes=None, info={}, pool=None, time_on=None)
    batch = object()
    with pytest.raises(RuntimeError, match="a trial failed"):
        with cluster_for("local", None) as cluster:
            with cluster.timing_on(trials, batch):
                assert trials.pool is not None and trials.time_on is batch
                raise RuntimeError("a trial failed")
    assert trials.pool is None and trials.time_on is None
    with cluster_for(None, None) as none:
        assert none is None
