"""Same outputs before and after a refactor: compile, debug, configurator, weak typing and search digests.

Runs the cases below twice, in fresh processes: once on the source tree of ``--rev`` (extracted with
``git archive``, its own tests/models.py) and once on this checkout, and compares digests per case in parts: a
compile case's outputs (sums), its decisions (each layer's precision and dtypes, the casts, the measured error) and
its whole report (without timings: a report that gained fields differs there only); plans, the configurator log,
the search result without latencies; weak typing by the set of layer sources only, its choices being measured.
Autocast's speed check is off in the compile cases (its choice is timed on the machine at hand). Issue 15 asked
for outputs identical after the re-layout; issue 44's bar names it.

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

    def decisions(prog):
        """What the program computes in: each layer's precision and dtypes, the casts, the measured error."""
        d = report_data(prog)
        keep = ("casts_inserted", "max_abs_error", "rel_l2_error", "param_bytes_after")
        return [[[r.get(k) for k in ("name", "precision", "accumulate", "input_dtypes", "output_dtypes")]
                 for r in d.get("layers", [])], {k: d.get("summary", {}).get(k) for k in keep}]

    def outputs(prog, inputs):
        with torch.no_grad():
            out = prog(*inputs)
        leaves = torch.utils._pytree.tree_leaves(out)
        return [t.double().sum().item() if isinstance(t, torch.Tensor) else t for t in leaves]

    def parts(prog, inputs=None):
        """A compile case in parts, compared one by one: the outputs, the decisions, the whole report."""
        out = {"decisions": decisions(prog), "report": report_data(prog)}
        if inputs is not None:
            out["outputs"] = outputs(prog, inputs)
        return out

    def case(name, fn):
        try:
            r = fn()
        except Exception as e:
            r = f"ERROR {type(e).__name__}: {e}"
        if isinstance(r, dict):
            text = " ".join(f"{k}={digest(v)}" for k, v in sorted(r.items()))
        else:
            text = f"all={digest(r)}"
        print(f"{name}\t{text}\t{r if isinstance(r, str) else ''}", flush=True)

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
        # autocast's speed check off: its choice is timed on the machine at hand, not what the trees compute
        for settings in [dict(), dict(enable_autocast=True, autocast_require_speedup=False),
                         dict(enable_autocast=True, autocast_require_speedup=False, use_fp32_acc=True,
                              keep_io_types=False)]:
            def run(model=model, inputs=inputs, settings=settings):
                return parts(mixprec.compile(model, inputs, **settings), inputs)
            case(f"compile {cls.__name__} {settings}", run)
        def dbg(model=model, inputs=inputs):
            rep = json.loads(mixprec.debug(model, inputs, enable_autocast=True, autocast_require_speedup=False)
                             .to_json())
            layers = [[r.get(k) for k in ("name", "precision", "rel_l2_error", "max_abs_error")]
                      for r in rep.get("layers", [])]
            return {"findings": rep.get("findings"), "decisions": layers, "report": rep}
        case(f"debug {cls.__name__}", dbg)

    # int8 markers with calibration
    torch.manual_seed(0)
    m = M.TRTorchSeed(torch.int8).eval()
    case("compile TRTorchSeed int8", lambda: parts(mixprec.compile(m, M.TRTorchSeed.example_inputs()),
                                                   M.TRTorchSeed.example_inputs()))
    loader = [M.TRTorchSeed.example_inputs() for _ in range(2)]
    case("compile TRTorchSeed int8 loader", lambda: parts(mixprec.compile(
        m, M.TRTorchSeed.example_inputs(), autocast_calibration_dataloader=loader), M.TRTorchSeed.example_inputs()))

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
        return parts(prog, (x * 1.5,))

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


def run_tree(src: Path, tests: Path) -> dict[str, dict[str, str]]:
    """case -> {part: digest} (a case that is not in parts: {"all": digest}; an error: its text)."""
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{tests}"}
    out = subprocess.run([sys.executable, "-m", "bench.same_outputs"], env=env, capture_output=True, text=True,
                         check=True, cwd=ROOT)
    cases = {}
    for line in out.stdout.splitlines():
        if "\t" not in line:
            continue
        name, text, *error = line.split("\t")
        cases[name] = dict(p.split("=", 1) for p in text.split())
        if error and error[0]:
            cases[name]["error"] = error[0]
    return cases


def _part_names(a: dict, b: dict) -> list[str]:
    return sorted(set(a) | set(b))


def compare(rev: str) -> int:
    """Digests of ``rev``'s tree against this checkout's, part by part (outputs, decisions, report); 0 when the
    outputs and decisions of every case are identical (reports may add fields: listed, not failed)."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "old.tar"
        subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), rev, "src", "tests"], check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(Path(tmp) / "old", filter="data")
        old = run_tree(Path(tmp) / "old" / "src", Path(tmp) / "old" / "tests")
    new = run_tree(ROOT / "src", ROOT / "tests")
    names = sorted(set(old) | set(new))
    failing = 0
    counts: dict[str, list[int]] = {}
    lines = []
    for name in names:
        a, b = old.get(name, {}), new.get(name, {})
        differ = [p for p in _part_names(a, b) if a.get(p) != b.get(p)]
        for p in _part_names(a, b):
            counts.setdefault(p, [0, 0])[p in differ] += 1
        if any(p != "report" for p in differ):
            failing += 1
        if differ:
            lines.append(f"  {name}: {', '.join(f'{p} {a.get(p)} -> {b.get(p)}' for p in differ)}")
    print(f"rev {rev} vs this checkout, {len(names)} cases; per part identical/different: "
          + ", ".join(f"{p} {c[0]}/{c[1]}" for p, c in sorted(counts.items())))
    print("\n".join(lines))
    return 0 if not failing else 1


if __name__ == "__main__":
    digests()  # the child: this process's tree, one "case<TAB>digest" line per case
