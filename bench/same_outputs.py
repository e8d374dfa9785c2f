"""Same outputs before and after a refactor: compile, debug, configurator, weak typing and search digests.

Runs the cases below twice, in fresh processes: once on the source tree of ``--rev`` (extracted with
``git archive``, its own tests/models.py) and once on this checkout, and compares a digest per case
(report JSON without timings, output sums, plans, the configurator log, the search result without
latencies; weak typing by the set of layer sources only, its choices being measured). Issue 15 asked for
outputs identical after the re-layout; issue 44's bar names it.

    python -m bench same-outputs --rev REV
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def digests() -> None:
    """Print 'case<TAB>digest' lines for the mixprec on sys.path (the tree under test)."""
    warnings.filterwarnings("ignore")
    import models as M  # noqa: N812  (tests/models.py of the tree under test, first on PYTHONPATH)
    import torch

    import mixprec

    torch.manual_seed(0)
    def digest(obj):
        return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def report_data(prog):
        d = json.loads(prog.report.to_json())
        d.get("summary", {}).pop("compile_seconds", None)
        return d

    def outputs(prog, inputs):
        with torch.no_grad():
            out = prog(*inputs)
        leaves = torch.utils._pytree.tree_leaves(out)
        return [t.double().sum().item() if isinstance(t, torch.Tensor) else t for t in leaves]

    def case(name, fn):
        try:
            r = fn()
        except Exception as e:
            r = f"ERROR {type(e).__name__}: {e}"
        print(f"{name}\t{digest(r)}\t{r if isinstance(r, str) else ''}", flush=True)

    for cls in [M.ThreeLinears, M.SeedExplicit, M.AutocastRegions, M.ConvNet, M.Attention, M.TiedEmbedding,
                M.MixedNorm, M.TrtAutocastNet, M.TRTorchSeed, M.NestedRegions, M.ResidualRegion, M.PointwiseChain,
                M.OverflowsInFp16, M.Block, M.TwoBlocks, M.Overflow, M.TinyGPT2]:
        torch.manual_seed(0)
        try:
            model = cls().eval()
            inputs = cls.example_inputs()
        except (TypeError, AttributeError):
            continue
        inputs = cls.example_inputs()
        for settings in [dict(), dict(enable_autocast=True),
                         dict(enable_autocast=True, use_fp32_acc=True, keep_io_types=False)]:
            def run(model=model, inputs=inputs, settings=settings):
                prog = mixprec.compile(model, inputs, **settings)
                return [report_data(prog), outputs(prog, inputs)]
            case(f"compile {cls.__name__} {settings}", run)
        def dbg(model=model, inputs=inputs):
            rep = mixprec.debug(model, inputs, enable_autocast=True)
            return digest(rep.to_json() if hasattr(rep, "to_json") else str(rep))
        case(f"debug {cls.__name__}", dbg)

    # int8 markers with calibration
    torch.manual_seed(0)
    m = M.TRTorchSeed(torch.int8).eval()
    case("compile TRTorchSeed int8", lambda: [report_data(mixprec.compile(m, M.TRTorchSeed.example_inputs()))])
    loader = [M.TRTorchSeed.example_inputs() for _ in range(2)]
    case("compile TRTorchSeed int8 loader", lambda: [report_data(mixprec.compile(
        m, M.TRTorchSeed.example_inputs(), autocast_calibration_dataloader=loader))])

    # int8 layers on every backend (issue 21: one quantize/dequantize lowering per target): outputs bit for bit.
    # A ReLU net whose first layer reads the signed input (fake quantization) and the others non-negative ones
    # (oneDNN's int8 kernel on eager/inductor); weight-only int8 (per-channel dequantize, bf16 compute).
    def int8_outputs(backend, activation, kernels=None):
        torch.manual_seed(0)
        model = M.ReluNet(64, layers=3, relu_in=False).eval()
        x = torch.randn(8, 64)
        c = mixprec.MixedPrecisionConfigurator(model)
        c.set_precision(torch.nn.Linear, activation=activation, param=torch.int8)
        plan = c.apply((x,))
        with cpu_with_int8_kernels(kernels):
            prog = mixprec.compile(model, (x,), plan=plan, backend=backend)
        return [report_data(prog), outputs(prog, (x * 1.5,))]

    backends = ["eager", "inductor"] + (["openvino"] if importlib.util.find_spec("openvino") else [])
    for backend in backends:
        for activation in (torch.int8, torch.bfloat16):
            case(f"int8 {backend} activation={activation}", lambda b=backend, a=activation: int8_outputs(b, a))
    if "openvino" in backends:  # OpenVINO's FakeQuantize spelling, whatever this CPU is (saturated sums on AVX2)
        case("int8 openvino int8 kernels", lambda: int8_outputs("openvino", torch.int8, kernels=True))
        case("int8 openvino float", lambda: int8_outputs("openvino", torch.int8, kernels=False))

    # configurator
    def conf():
        model = M.ThreeLinears().eval()
        c = mixprec.MixedPrecisionConfigurator(model)
        c.set_precision(model.linear2, torch.bfloat16)
        c.set_precision(model.linear3, torch.int8)
        plan = c.apply(M.ThreeLinears.example_inputs())
        return [plan.to_json(), plan.log]
    torch.manual_seed(0)
    case("configurator", conf)

    # weak typing (timing-dependent: only the set of layers/kinds)
    def weak():
        model = M.ThreeLinears().eval()
        prog = mixprec.compile(model, M.ThreeLinears.example_inputs(), use_explicit_typing=False,
                               enabled_precisions={torch.float32, torch.bfloat16})
        return sorted(r.name + r.source for r in prog.report.layers)
    torch.manual_seed(0)
    case("weak", weak)

    # search
    def srch():
        torch.manual_seed(0)
        model = M.SensitiveByConstruction().eval()
        res = mixprec.search(model, M.SensitiveByConstruction.example_inputs(), tolerance=1e-2, cache=False)
        d = json.loads(res.to_json())
        def strip(o):
            if isinstance(o, dict):
                return {k: strip(v) for k, v in o.items()
                        if "latency" not in k and "seconds" not in k and "speed" not in k}
            if isinstance(o, list):
                return [strip(v) for v in o]
            return o
        return strip(d)
    case("search", srch)


@contextlib.contextmanager
def cpu_with_int8_kernels(kernels):
    """OpenVINO's int8 kernels on (True) or off (False) whatever this CPU is, in either tree: the one CPU
    answer since issue 21 (backends/lowering/cpu.py), ``openvino.int8_kernels_exact`` before it."""
    if kernels is None:
        yield
        return
    try:
        from mixprec.backends.lowering import cpu as module
        name = "has_int8_dot_product"
    except ImportError:
        from mixprec.backends import openvino as module
        name = "int8_kernels_exact"
    real = getattr(module, name)
    setattr(module, name, lambda: kernels)
    try:
        yield
    finally:
        setattr(module, name, real)


def run_tree(src: Path, tests: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{tests}"}
    out = subprocess.run([sys.executable, "-m", "bench.same_outputs"], env=env, capture_output=True, text=True,
                         check=True, cwd=ROOT)
    rows = [line.split("\t") for line in out.stdout.splitlines() if "\t" in line]
    return {r[0]: r[1] + (" " + r[2] if len(r) > 2 and r[2] else "") for r in rows}


def compare(rev: str) -> int:
    """Digests of ``rev``'s tree against this checkout's; 0 when every case is identical."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "old.tar"
        subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), rev, "src", "tests"], check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(Path(tmp) / "old", filter="data")
        old = run_tree(Path(tmp) / "old" / "src", Path(tmp) / "old" / "tests")
    new = run_tree(ROOT / "src", ROOT / "tests")
    same = [k for k in old if new.get(k) == old[k]]
    differ = sorted((set(old) | set(new)) - set(same))
    print(f"rev {rev} vs this checkout: {len(same)} of {len(set(old) | set(new))} cases identical")
    for k in differ:
        print(f"  differs: {k}: {old.get(k)} -> {new.get(k)}")
    return 0 if not differ else 1


if __name__ == "__main__":
    digests()  # the child: this process's tree, one "case<TAB>digest" line per case
