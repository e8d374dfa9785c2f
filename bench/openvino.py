"""mixprec against OpenVINO on the CPU (issue 14), and int8 regions on int8 kernels.

    python bench/openvino.py [--models bert_base,vit_base,resnet50,llama8,gpt2_lm] [--rounds 7]
                             [--bf16 auto|yes|no] [--int8-only] [--no-int8] [--probe-only] [--simulate-bf16-cpu]

Per model, all variants timed in one process, interleaved round-robin, medians of --rounds:
  fp32 eager · OpenVINO default (convert_model of torch.export, compile_model(..., "CPU") with
  OpenVINO's defaults: bf16 inference precision on CPUs with bf16, f32 otherwise) ·
  mixprec openvino (the default strong-typing plan: what the model states, fp32) ·
  and where the CPU computes bf16 natively (--bf16 auto: torch.cpu._is_avx512_bf16_supported()):
  torch.compile(.to(bf16)) · mixprec eager / inductor / openvino with enable_autocast (bf16).
Errors: rel-L2 of the main output against fp32 eager (fp64), for OpenVINO default, mixprec
openvino (fp32 plan), torch.autocast("cpu", bf16), mixprec enable_autocast (eager backend) and
mixprec enable_autocast on OpenVINO (which always compiles now: layers OpenVINO keeps wider than
planned are accepted; the script prints how many, from the report's runs_as, and the FLOP share as
OpenVINO runs the program). On a CPU without native bf16 (AVX2: bf16 matmul is emulated, ~60x slower
than fp32 here) the bf16 PyTorch variants are not timed (one call each would take tens of seconds);
OpenVINO computes every bf16 layer in f32 there, so mixprec's enable_autocast program on OpenVINO is
timed on both kinds of CPU.

int8: a region of four Linear(1024, 1024) + ReLU layers, batch 64, every Linear int8
(activations and weights, MixedPrecisionConfigurator): fp32 eager, int8 plan eager (fake
quantization), fp32 on OpenVINO, the int8 plan on OpenVINO as the backend runs it on this CPU,
and the int8 plan forced onto OpenVINO's int8 kernels (int8_kernels=True), with the error of
each against the eager int8 program (today's numerics).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from harness import cpu_flags, interleaved, machine, stamp, table  # noqa: E402

# this file is called openvino.py: keep `import openvino` (here and in mixprec) from importing it
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE.resolve()]

import mixprec  # noqa: E402
from mixprec.backends.openvino import convert as ov_convert  # noqa: E402
from mixprec.backends.openvino import runner as ov_runner  # noqa: E402


# ---- models: (model, inputs, main output of a call) --------------------------------------------
def _hidden(out):
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def _logits(out):
    return out.logits if hasattr(out, "logits") else out[0]


def bert_base():
    import transformers

    config = transformers.BertConfig()
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (8, 128))
    return model, (ids, torch.ones_like(ids)), _hidden


def vit_base():
    import transformers

    model = transformers.ViTModel(transformers.ViTConfig(), add_pooling_layer=False).eval()
    return model, (torch.randn(4, 3, 224, 224),), _hidden


def resnet50():
    import transformers

    model = transformers.ResNetForImageClassification(transformers.ResNetConfig()).eval()  # ResNet-50 layout
    return model, (torch.randn(8, 3, 224, 224),), _logits


def llama8():
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
        num_key_value_heads=16, vocab_size=32000, use_cache=False,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    return model, (torch.randint(0, 32000, (2, 128)),), _logits


def gpt2_lm():
    import transformers

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(use_cache=False)).eval()
    return model, (torch.randint(0, 50257, (4, 128)),), _logits


MODELS = {"bert_base": bert_base, "vit_base": vit_base, "resnet50": resnet50, "llama8": llama8, "gpt2_lm": gpt2_lm}


def rel_l2(got, want) -> float:
    got, want = got.detach().double(), want.detach().double()
    return ((got - want).norm() / want.norm()).item()


class OpenVINODefault:
    """What an OpenVINO user does: convert_model(torch.export.export(model)), compile_model(..., "CPU")."""

    def __init__(self, model, inputs):
        import openvino as ov

        ep = torch.export.export(model, inputs)
        self.compiled = ov.Core().compile_model(ov.convert_model(ep), "CPU")
        self.request = self.compiled.create_infer_request()
        self.inputs = [t.numpy() for t in inputs]
        self.precision = self.compiled.get_property("INFERENCE_PRECISION_HINT")

    def __call__(self):
        self.request.infer(self.inputs, share_inputs=True)
        return self.request.get_output_tensor(0)

    def main_output(self):
        self()
        return torch.from_numpy(self.request.get_output_tensor(0).data.copy())


def timed(label, make, notes):
    start = time.perf_counter()
    value = make()
    notes.append(f"{label}: built in {time.perf_counter() - start:.1f} s")
    return value


def run_model(name: str, rounds: int, bf16: bool) -> tuple[list[dict], list[str]]:
    torch.manual_seed(0)
    model, inputs, main = MODELS[name]()
    notes: list[str] = []
    with torch.no_grad():
        reference = main(model(*inputs))
    variants = {"fp32 eager": lambda: model(*inputs)}
    errors = {}

    ov_default = timed("OpenVINO default", lambda: OpenVINODefault(model, inputs), notes)
    notes.append(f"OpenVINO default inference precision on this CPU: {ov_default.precision}")
    variants["OpenVINO default"] = ov_default
    errors["OpenVINO default"] = rel_l2(ov_default.main_output(), reference)

    prog_ov = timed("mixprec openvino (fp32 plan)", lambda: mixprec.compile(model, inputs, backend="openvino"), notes)
    variants["mixprec openvino (fp32 plan)"] = lambda: prog_ov(*inputs)
    errors["mixprec openvino (fp32 plan)"] = rel_l2(main(prog_ov(*inputs)), reference)

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        start = time.perf_counter()
        errors["torch.autocast bf16"] = rel_l2(main(model(*inputs)), reference)
        notes.append(f"torch.autocast bf16: one call {1e3 * (time.perf_counter() - start):.0f} ms")

    try:  # no layer excluded by hand: what OpenVINO keeps wider is accepted and reported (runs_as)
        prog_ova = timed("mixprec openvino (enable_autocast)", lambda: mixprec.compile(
            model, inputs, backend="openvino", enable_autocast=True), notes)
    except mixprec.UnsupportedModelError as e:
        prog_ova = None
        notes.append(f"mixprec openvino (enable_autocast) refused: {str(e)[:400]}")
    if prog_ova is not None:
        variants["mixprec openvino (autocast)"] = lambda: prog_ova(*inputs)
        errors["mixprec openvino (autocast)"] = rel_l2(main(prog_ova(*inputs)), reference)
        notes.append(runs_as_note(prog_ova.report))

    if bf16:
        low = __import__("copy").deepcopy(model).to(torch.bfloat16)
        compiled_low = torch.compile(low)
        variants["torch.compile(.to(bf16))"] = lambda: compiled_low(*inputs)
        prog_eager = timed("mixprec eager (autocast)",
                           lambda: mixprec.compile(model, inputs, enable_autocast=True), notes)
        variants["mixprec eager (autocast)"] = lambda: prog_eager(*inputs)
        errors["mixprec autocast"] = rel_l2(main(prog_eager(*inputs)), reference)
        notes.append(f"mixprec eager (autocast): low-precision FLOP share "
                     f"{prog_eager.report.summary['low_precision_flops_fraction']:.1%}")
        prog_ind = timed("mixprec inductor (autocast)", lambda: mixprec.compile(
            model, inputs, enable_autocast=True, backend="inductor"), notes)
        variants["mixprec inductor (autocast)"] = lambda: prog_ind(*inputs)

    medians = interleaved(variants, rounds=rounds, warmup=1)
    base = medians["OpenVINO default"]
    rows = [
        {"variant": k, "ms": 1e3 * v, "x fp32 eager": medians["fp32 eager"] / v, "time / OpenVINO": v / base,
         "rel-L2 vs fp32": errors.get(k, "")}
        for k, v in medians.items()
    ]
    for k, v in errors.items():
        if k not in medians:
            rows.append({"variant": k + " (error only)", "rel-L2 vs fp32": v})
    return rows, notes


def runs_as_note(report) -> str:
    """What OpenVINO runs otherwise than planned: counts of runs_as, a few layers, the FLOP share as it runs."""
    summary = report.summary
    counts = summary.get("runs_as", {})
    layers = [f"{r.name} ({r.module or 'top'})" for r in report.layers if r.kind == "compute" and r.runs_as]
    shown = ", ".join(layers[:6]) + (f" and {len(layers) - 6} more" if len(layers) > 6 else "")
    return (f"mixprec openvino (autocast): {summary['layers']} compute layers {summary['layers_by_precision']}; "
            f"runs_as {counts or 'none'}{': ' + shown if shown else ''}; low-precision FLOP share as run "
            f"{summary['low_precision_flops_fraction']:.1%}")



def run_int8(rounds: int) -> tuple[list[dict], list[str]]:
    torch.manual_seed(0)
    width, batch = 1024, 64
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())]).eval()
    x = torch.randn(batch, width)
    configurator = mixprec.MixedPrecisionConfigurator(model)
    configurator.set_precision(nn.Linear, activation=torch.int8, param=torch.int8)
    plan = configurator.apply((x,))
    int8_eager = mixprec.compile(model, (x,), plan=plan)
    fp32_ov = mixprec.compile(model, (x,), backend="openvino")
    int8_ov = mixprec.compile(model, (x,), plan=plan, backend="openvino")

    import openvino as ov

    forced_model, keep_alive = ov_convert.convert(int8_eager.exported_program, int8_kernels=True)
    forced = ov.Core().compile_model(forced_model, "CPU", dict(ov_runner.COMPILE_CONFIG))
    request = forced.create_infer_request()

    def run_forced():
        request.infer([x.numpy()], share_inputs=True)
        return torch.from_numpy(request.get_output_tensor(0).data.copy())

    with torch.no_grad():
        fp32 = model(x)
        want = int8_eager(x)
    variants = {
        "fp32 eager": lambda: model(x),
        "int8 plan, eager (fake quantization)": lambda: int8_eager(x),
        "fp32, mixprec openvino": lambda: fp32_ov(x),
        "int8 plan, mixprec openvino (as run on this CPU)": lambda: int8_ov(x),
        "int8 plan on OpenVINO int8 kernels (forced)": run_forced,
    }
    outputs = {
        "fp32 eager": fp32, "int8 plan, eager (fake quantization)": want, "fp32, mixprec openvino": fp32_ov(x),
        "int8 plan, mixprec openvino (as run on this CPU)": int8_ov(x),
        "int8 plan on OpenVINO int8 kernels (forced)": run_forced(),
    }
    medians = interleaved(variants, rounds=rounds, warmup=2)
    rows = [
        {"variant": k, "ms": 1e3 * v, "x fp32 eager": medians["fp32 eager"] / v,
         "x fp32 openvino": medians["fp32, mixprec openvino"] / v,
         "rel-L2 vs int8 eager": rel_l2(outputs[k], want)}
        for k, v in medians.items()
    ]
    kinds = sorted({(l["type"], l["precision"]) for l in ov_runner.runtime_layers(forced)
                    if l["type"] in ("FullyConnected", "FakeQuantize")})
    notes = [
        f"int8 kernels exact on this CPU (VNNI/AMX): {ov_convert.int8_kernels_default()}",
        f"forced int8 kernels, runtime layers: {kinds}",
        f"int8 plan eager vs fp32: rel-L2 {rel_l2(want, fp32):.3g}",
    ]
    return rows, notes


def simulate_bf16_cpu(names: list[str]) -> None:
    """Compile each model's enable_autocast program on OpenVINO as a CPU with native bf16 would run it,
    on any CPU: the runtime table this CPU's plugin makes, rewritten so that every layer computes in the
    types its operations declare and reductions write f32 (what OpenVINO 2026.4 does on an avx512_bf16 CPU:
    tests/backends/openvino/fixtures/openvino-bf16-cpu), with that CPU's capabilities. Shows that the audit accepts
    what such a CPU keeps wider and names it as the report does (the numerics are this CPU's)."""
    import copy

    from mixprec.backends.openvino import audit as openvino_audit

    real_layers, real_declared = ov_runner.runtime_layers, ov_runner.declared_precisions
    seen = {}

    def declared_precisions(model):
        seen["declared"] = real_declared(model)
        return seen["declared"]

    def runtime_layers(compiled):
        out = []
        for layer in copy.deepcopy(real_layers(compiled)):
            types = [seen["declared"][o] for o in layer["originals"] if o in seen["declared"]]
            if types:  # a layer computes in its first operation's type and writes its last one's
                if layer["precision"] in openvino_audit.FLOAT_RANK:
                    layer["precision"] = types[0]
                if layer["output"] in openvino_audit.FLOAT_RANK:
                    layer["output"] = types[-1]
            if layer["type"] == "Reduce":
                layer["output"] = "f32"
            out.append(layer)
        return out

    ov_runner.declared_precisions, ov_runner.runtime_layers = declared_precisions, runtime_layers
    ov_runner.optimization_capabilities = lambda core: ["BF16", "WINOGRAD", "FP32", "INT8", "BIN", "EXPORT_IMPORT"]
    print("\n### enable_autocast on backend='openvino', as a CPU with native bf16 would run it (simulated)")
    rows = []
    for name in names:
        torch.manual_seed(0)
        model, inputs, _ = MODELS[name]()
        start = time.perf_counter()
        try:
            prog = mixprec.compile(model, inputs, backend="openvino", enable_autocast=True)
            outcome = runs_as_note(prog.report).split(": ", 1)[1]
        except mixprec.UnsupportedModelError as e:
            outcome = f"refused: {str(e)[:300]}"
        rows.append({"model": name, "outcome": outcome, "compile s": time.perf_counter() - start})
        del model
        gc.collect()
    print(table(rows, ["model", "compile s", "outcome"]))


def bf16_probe() -> str:
    """fp32 vs bf16 matmul (1024 x 1024 x 1024, interleaved medians): how fast this CPU computes bf16."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a16, b16 = a.bfloat16(), b.bfloat16()
    medians = interleaved({"fp32": lambda: a @ b, "bf16": lambda: a16 @ b16}, rounds=5, warmup=1)
    return (f"matmul 1024^3: fp32 {1e3 * medians['fp32']:.1f} ms, bf16 {1e3 * medians['bf16']:.1f} ms "
            f"(bf16 {medians['bf16'] / medians['fp32']:.1f}x the fp32 time)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bf16", choices=("auto", "yes", "no"), default="auto")
    parser.add_argument("--int8-only", action="store_true")
    parser.add_argument("--no-int8", action="store_true")
    parser.add_argument("--probe-only", action="store_true", help="only the bf16-vs-fp32 matmul probe")
    parser.add_argument("--simulate-bf16-cpu", action="store_true",
                        help="only compile the autocast programs as a CPU with native bf16 would run them")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bf16 = {"yes": True, "no": False}.get(args.bf16, torch.cpu._is_avx512_bf16_supported())
    import openvino

    print(f"{stamp()}  {machine()}, openvino {openvino.__version__}")
    print(f"command: python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}")
    print(cpu_flags())
    print(f"OpenVINO CPU capabilities: {'/'.join(openvino.Core().get_property('CPU', 'OPTIMIZATION_CAPABILITIES'))}")
    print(f"native bf16 on this CPU: {torch.cpu._is_avx512_bf16_supported()}; bf16 variants timed: {bf16}")
    print(bf16_probe())
    if args.probe_only:
        return
    if args.simulate_bf16_cpu:
        simulate_bf16_cpu(args.models.split(","))
        return
    if not args.no_int8:
        rows, notes = run_int8(max(args.rounds, 15))
        print("\n### int8 region: 4 x (Linear(1024, 1024) + ReLU), batch 64")
        print(table(rows, ["variant", "ms", "x fp32 eager", "x fp32 openvino", "rel-L2 vs int8 eager"]))
        print("\n".join(notes))
        sys.stdout.flush()
    if args.int8_only:
        return
    for name in args.models.split(","):
        rows, notes = run_model(name, args.rounds, bf16)
        print(f"\n### {name} (medians of {args.rounds} interleaved rounds)")
        print(table(rows, ["variant", "ms", "x fp32 eager", "time / OpenVINO", "rel-L2 vs fp32"]))
        print("\n".join(notes))
        sys.stdout.flush()
        gc.collect()


if __name__ == "__main__":
    main()
