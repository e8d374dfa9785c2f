"""The table of cases: every benchmark the suite runs, as data (NNCF's ``tests/post_training/model_scope.py``).

A :class:`Case` is one variant: a precision *recipe* (``recipes.py``: fp32, torch.autocast, mixprec.compile with
settings, the configurator with activation and weight formats, the search at a budget, OpenVINO, NNCF's
quantize / compress_weights, torchao, ...) on a *backend*. A :class:`Group` is a model at a shape with the data it
is judged on (calibration, search and held-out batches) and its cases: the pipeline (``pipeline.py``) builds the
model once, builds every case, validates each against the fp32 model on the held-out batches and times them
interleaved in one process, so ratios inside a group compare like with like. A group's ``kind`` says which
pipeline measures it: ``forward`` (a call), ``decode`` (generate() tokens/s, ``decode.py``), ``compile`` (compile
time, ``compile_time.py``), ``costs``, ``distributed`` and ``crafted`` (``checks.py``). A table is a list of groups
under one name: the RESULTS rows it produces (``python -m bench rows``).

Budgets name another case of the group (``budget="OV bf16 default"``: that case's held-out error), so a table
states "search at NNCF's error" as data. A weight format is an option (``weight="int4"``, NNCF's ``mode``), so a new
format is a new row.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Case:
    label: str  # the variant, as its row names it
    recipe: str  # recipes.RECIPES (decode.RECIPES for decode groups)
    options: dict = field(default_factory=dict)  # the recipe's arguments
    backend: str = "eager"  # eager | inductor | openvino (mixprec's), or the peer's runtime
    timed: bool = True  # False: validated only (a bf16 emulated on AVX2 would take minutes per call)


@dataclass(frozen=True)
class Data:
    calibration: int = 0  # batches recipes calibrate on (0: the example)
    search: int = 0  # batches a search evaluates on
    held_out: int = 0  # batches errors are measured on (0: the example itself)


@dataclass(frozen=True)
class Timing:
    rounds: int = 7
    warmup: int = 1
    calls: int = 1  # calls per sample: a call of microseconds is timed in runs of this many
    statistic: str = "median"  # measure.clock: median | fastest
    fresh_process: bool = False  # compile groups: each sample a new Python process


@dataclass(frozen=True)
class Group:
    table: str
    name: str
    model: str  # models.MODELS
    shape: dict
    cases: tuple
    kind: str = "forward"
    data: Data = Data()
    timing: Timing = Timing()
    threads: int | None = 2
    cost_cache: str = "process"  # process (measured once per process, never kept) | fresh (a new file) | user
    reference: str = "fp32 eager"  # the case the others' speed is a multiple of
    roofline: bool = False  # also each case's weight bytes per call against the copy bandwidth
    note: str = ""

    def smoke(self) -> Group:
        """The same group, checked quickly: small widths, few batches, one round."""
        def few(n):
            return min(n, 2 if n else 0)
        data = Data(few(self.data.calibration), few(self.data.search), min(self.data.held_out, 1))
        return replace(self, data=data, timing=replace(self.timing, rounds=1, warmup=min(self.timing.warmup, 1),
                                                       calls=min(self.timing.calls, 5)))


# ---- recipes, spelled short -----------------------------------------------------------------------------------------
FP32 = Case("fp32 eager", "fp32")
OV = Case("OV bf16 default", "openvino", backend="openvino")  # OpenVINO's own default: bf16 where the CPU has it


def mx(label, backend="eager", **settings):
    return Case(label, "mixprec", settings, backend)


def auto(label="mixprec bf16", backend="eager", **settings):
    return mx(label, backend, enable_autocast=True, **settings)


def cfg(label, backend="eager", **options):
    """The configurator: ``activation`` (and ``weight``: a weight format) on every ``kinds`` module."""
    return Case(label, "configurator", options, backend)


def search(label, lows, budget, backend="openvino", timed=True, **options):
    return Case(label, "search", {"lows": lows, "budget": budget, **options}, backend, timed)


def nncf_ptq(label="NNCF int8 PTQ", **options):
    return Case(label, "nncf-ptq", options, "openvino")


def nncf_weights(label, mode, backend="openvino", **options):
    return Case(label, "nncf-weights", {"mode": mode, **options}, backend)


def torch_autocast(low="bf16", timed=True):
    return Case(f"torch.autocast {low}", "autocast", {"low": low}, "torch", timed)


NUMERICS = {"autocast_require_speedup": False}  # a numerics preview: lowered whether or not faster on this CPU
W4 = {"weight": "int4", "group_size": 128}
W8 = {"weight": "int8"}


def weight_only(label, backend, fmt, activation="bf16", **compile):
    return cfg(label, backend, activation=activation, rest=activation, kinds=("Linear",), compile=compile, **fmt)


# ---- the tables ----------------------------------------------------------------------------------------------------
def _suite8():  # issue 8: mixprec against the ways people run bf16 on a CPU
    cases = (FP32, torch_autocast(), Case(".to(bfloat16)", "cast", {"low": "bf16"}, "torch"), auto("mixprec eager"),
             auto("mixprec eager, bf16 outputs", keep_io_types=False), auto("mixprec inductor", "inductor"),
             Case("torch.compile fp32", "torch-compile", {}, "inductor"),
             Case("torch.compile bf16", "torch-compile", {"low": "bf16"}, "inductor"))
    return [Group("suite8", name, model, shape, cases, timing=Timing(15, 2)) for name, model, shape in MODELS8]


MODELS8 = (("transformer-layer-8x128", "transformer_layer", {}), ("cnn-8x112", "cnn", {}),
           ("bert-8x128", "bert", {"batch": 8, "seq": 128}), ("gpt2-8x128", "gpt2", {"batch": 8, "seq": 128}),
           ("vit-8x224", "vit", {"batch": 8}))


def _autocast34():  # issue 34: default autocast (the speed check) against fp32 eager
    cases = (FP32, auto("autocast (default)"), auto("autocast, require_speedup=False", autocast_require_speedup=False))
    return [Group("autocast34", name, model, shape, cases, timing=Timing(5, 2)) for name, model, shape in MODELS8]


def _openvino14():  # issue 14/25: OpenVINO against mixprec's programs on it; bf16 plans where OpenVINO runs f32
    cases = (FP32, OV, mx("mixprec openvino (fp32 plan)", "openvino"), auto("mixprec openvino (autocast)", "openvino"),
             auto("mixprec openvino (autocast, every layer lowered)", "openvino", **NUMERICS),
             torch_autocast(timed=False))
    shapes = (("bert-8x128", "bert", {"batch": 8}), ("vit-4x224", "vit", {"batch": 4}),
              ("resnet50-8x224", "resnet50", {"batch": 8}), ("gpt2-4x128", "gpt2", {"batch": 4}),
              ("llama1024-8L-2x128", "llama", dict(LLAMA1024, layers=8, batch=2)))
    return [Group("openvino14", n, m, s, cases, timing=Timing(5)) for n, m, s in shapes]


LLAMA1024 = dict(hidden=1024, intermediate=2816, heads=16, kv_heads=16, vocab=32000)
HELD = Data(calibration=4, search=2, held_out=2)  # issues 22/34/45: 4 calibration batches, the search's 2, 2 held out


def _issue45():  # issue 45: OpenVINO runs every program; searches at NNCF's and OpenVINO bf16's error
    rows = []
    for name, model, shape, int8 in (("bert-8x128", "bert", {"batch": 8}, {}), ("resnet50-8x224", "resnet50",
                                     {"batch": 8}, {"rest": "bf16"}), ("vit-4x224", "vit", {"batch": 4}, {})):
        transformer = {} if model == "resnet50" else {"model_type": "transformer"}
        cases = (FP32, OV, nncf_ptq(**transformer), auto("mixprec bf16", "openvino"),
                 cfg("mixprec int8 (configurator)", "openvino", activation="int8", **int8),
                 search("search int8 at NNCF's error", "int8", "NNCF int8 PTQ"),
                 search("search int8+bf16 at OV bf16's error", ("int8", "bf16"), "OV bf16 default"))
        rows.append(Group("issue45", name, model, shape, cases, data=HELD, timing=Timing(7)))
    return rows


def _call45():  # issue 45: a program's own cost per call, against eager and torch.compile
    cases = (Case("eager", "fp32"), mx("mixprec eager"), Case("torch.compile", "torch-compile", {}, "inductor"),
             mx("mixprec inductor", "inductor"))
    shapes = (("mlp-64-256-64-b1", {"widths": (64, 256, 64), "batch": 1}),
              ("linears-4x512-b8", {"widths": (512,) * 5, "batch": 8, "activation": "none"}))
    return [Group("call45", name, "linears", shape, cases, threads=1, timing=Timing(31, 3, calls=200),
                  reference="eager", note="per-call overhead: us per call; bar: program <= its peer + 15 us")
            for name, shape in shapes]


def _int8_regions():  # issue 34's MLP region (int8 Linears) and issue 45's TRTorch-style marker region
    int8 = {"activation": "int8", "kinds": ("Linear",), "compile": {"int8_require_speedup": False}}
    cases = (FP32, mx("fp32 mixprec inductor", "inductor"),
             *(cfg(f"int8 {b}", b, **int8) for b in ("eager", "inductor", "openvino")))
    mlp = {"widths": (768, 3072, 768, 3072, 768), "activation": "gelu"}
    groups = [Group("int8region", f"mlp-768-3072x2-{rows}rows", "linears", {**mlp, "batch": rows}, cases, threads=1,
                    timing=Timing(11, 2)) for rows in (1, 256)]
    markers = (FP32, *(mx(f"markers int8 {b}", b) for b in ("eager", "inductor", "openvino")))
    return groups + [Group("int8region", "markers-1024-4096-64rows", "marker_region", {"batch": 64}, markers,
                           threads=2, timing=Timing(11, 2))]


def _int8nncf():  # issues 22/34: mixprec int8 (configurator) against NNCF's PTQ, held-out error and speed
    groups = []
    policies = {"mse/u8/exits/nosq": dict(quantize_exits=True, smoothing_alpha=None),
                "mse/u8/noexits/nosq": dict(quantize_exits=False, smoothing_alpha=None), "mse/u8": {}}
    for name, model, shape in (("bert-12L-2x128", "bert", {"batch": 2}), ("vit-12L-2x224", "vit", {"batch": 2}),
                               ("resnet50-2x224", "resnet50", {"batch": 2}), ("minilm-8", "minilm", {})):
        transformer = {} if model == "resnet50" else {"model_type": "transformer"}
        cases = [FP32, OV, nncf_ptq("NNCF int8 PTQ (FakeQuantize in float)", fake_quantize_in_float=True,
                                    **transformer), nncf_ptq(**transformer),
                 cfg("mixprec int8 (configurator)", "openvino", activation="int8")]
        if model == "minilm":
            cases.append(cfg("mixprec int8, int8_attention=False", "openvino", activation="int8",
                             policy={"int8_attention": False}))
        if model in ("bert", "vit"):  # the settings of issue 22's round two, on eager (fake quantization)
            cases += [cfg(f"mixprec int8 {k}", "eager", activation="int8", policy=p) for k, p in policies.items()]
        groups.append(Group("int8nncf", name, model, shape, tuple(cases), data=Data(4, 0, 2), threads=1,
                            timing=Timing(5)))
    return groups


def _search34():  # issues 22/34: the search over fp32/bf16/int8 at OpenVINO bf16's error, and what int8 costs
    groups = []
    for name, model, shape in (("bert-12L-2x128", "bert", {"batch": 2}), ("vit-12L-2x224", "vit", {"batch": 2}),
                               ("resnet50-2x224", "resnet50", {"batch": 2}), ("minilm-6", "minilm", {"batch": 6})):
        cases = [FP32, OV, search("search int8+bf16 (fastest mix)", ("int8", "bf16"), "OV bf16 default"),
                 search("search int8 (most FLOPs)", "int8", "OV bf16 default"),
                 Case("bound: bf16 weights alone (fp32 eager)", "rounded", {"dtype": "bf16"}, "torch", False),
                 Case("bound: int8 weights alone (fp32 eager)", "rounded", {"bits": 8}, "torch", False),
                 Case("NNCF accuracy control", "nncf-accuracy-control", {"budget": "OV bf16 default"}, "openvino")]
        if model != "resnet50":
            cases.append(weight_only("bound: Linear int8 weights + dynamic int8 activations", "openvino", W8,
                                     weight_only_dynamic_activations=64))
        groups.append(Group("search34", name, model, shape, tuple(cases), data=HELD, timing=Timing(5)))
    bert = Group("search34", "bert-12L-2x128-5e-3", "bert", {"batch": 2}, (
        FP32, search("search fp32/bf16/int8 at 5e-3", ("int8", "bf16"), 5e-3, timed=False)), data=Data(4, 3, 3),
        timing=Timing(0), note="the search's wall time and plan (issue 34's bar: 120 s)")
    batches = Group("search34", "bert-tiny-mixed-batches", "bert", {"layers": 2, "batch": 2, "seq": 8, "vocab": 100,
                    "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128}, (
        FP32, search("search, fixed-size tuple batches", "bf16", 1e-2, backend="eager"),
        search("search, dict batches of mixed sizes", "bf16", 1e-2, backend="eager", mixed_sizes=True)),
        data=Data(0, 3, 1), timing=Timing(0))
    return groups + [bert, batches]


def weight_formats() -> tuple:
    """(name, default group) of each weight format the measured tree registers (``mixprec.formats``: this table is
    built in each group's process, with that tree first on the path); a tree from before the registry has int8 and
    int4."""
    try:
        from mixprec.formats import WEIGHT_FORMATS, default_format
    except ImportError:
        return (("int8", None), ("int4", 128))
    return tuple((name, default_format(name).group) for name in WEIGHT_FORMATS)


# NNCF's compress_weights mode of each weight format (a peer's names; a format without one has no NNCF row)
NNCF_MODES = {"int8": "INT8_ASYM", "int4": "INT4_SYM", "nf4": "NF4", "mxfp4": "MXFP4", "fp8": "FP8_E4M3"}


def _weights43():  # issue 43 (and 32): weight formats x error and bytes, mixprec's against NNCF's same modes
    registry = weight_formats()
    fmts = {f"{name} g{group}" if group else name: {"weight": name, **({"group_size": group} if group else {})}
            for name, group in registry}
    nncf = {"INT8_ASYM": {}, "INT4_SYM g128": {"group_size": 128}, "INT4_ASYM g128": {"group_size": 128}}
    for name, group in registry:  # the other formats at mixprec's default group: equal weight bytes
        if name not in ("int8", "int4") and name in NNCF_MODES:
            nncf[f"{NNCF_MODES[name]} g{group}" if group else NNCF_MODES[name]] = {"group_size": group} if group else {}
    cases = [FP32, Case("RTN int8 per channel (fp32 compute)", "rounded", {"bits": 8}, "torch"),
             Case("RTN int4 g128 (fp32 compute)", "rounded", {"bits": 4, "group": 128}, "torch")]
    for label, fmt in fmts.items():
        cases.append(weight_only(f"mixprec W-{label} A32", "eager", fmt, activation="fp32"))
        cases.append(weight_only(f"mixprec W-{label} A32 openvino", "openvino", fmt, activation="fp32"))
    cases += [weight_only("mixprec W-int4 g128 A32 openvino dynamic 32", "openvino", W4, "fp32",
                          weight_only_dynamic_activations=32), Case("openvino default", "openvino", {}, "openvino")]
    for label, extra in nncf.items():  # f32 inference, no dynamic int8 activations: the weight grid's error alone
        cases.append(nncf_weights(f"NNCF {label}", label.split()[0], **extra, config=F32_OV))
    cases += [nncf_weights("NNCF INT4_SYM g128 AWQ + scale estimation", "INT4_SYM", group_size=128, awq=True,
                           scale_estimation=True, data_aware=True, config=F32_OV),
              Case("torchao int8", "torchao", {"bits": 8}, "torch"),
              Case("torchao int4 g128", "torchao", {"bits": 4, "group": 128}, "torch")]
    shapes = (("minilm-16", "minilm", {"batch": 16}), ("crepe-16", "crepe", {"batch": 16}),
              ("tinyllama-8L-1x128", "llama", {"layers": 8, "batch": 1, "seq": 128}))
    groups = [Group("weights43", n, m, s, tuple(cases), data=Data(4, 0, 2), timing=Timing(3), threads=1)
              for n, m, s in shapes]
    lows, searched = ("w4a16", "w8a16", "bf16"), [FP32]  # issue 32: the three-type search vs NNCF's ratio mix
    for tolerance in (0.1, 0.05):
        label = f"search w4a16/w8a16/bf16 at {tolerance}"
        searched += [search(label, lows, tolerance, "eager"), Case(
            f"NNCF INT4_SYM g128, ratio at the bytes of {tolerance}'s plan", "nncf-weights",
            {"mode": "INT4_SYM", "group_size": 128, "ratio": ("bytes of", label)}, "torch")]
    return groups + [Group("weights43", "tinyllama-4L-1x8-search", "llama", {"layers": 4, "batch": 1, "seq": 8},
                           tuple(searched), data=Data(0, 4, 2), timing=Timing(0), threads=1)]


F32_OV = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}


def _awq43():  # issue 43: data-aware int4 (scale estimation, AWQ, GPTQ) against NNCF's AWQ + scale estimation
    def rounded(label, **options):  # every Linear's weight rounded, computed in fp32 (bench/data_aware.py)
        return Case(f"{label} (fp32 compute)", "rounded-data-aware", {"group": 128, **options}, "torch")

    data_aware = {"weight_rounding": "data_aware"}
    cases = (FP32, rounded("mixprec int4 g128 RTN"), rounded("mixprec int4 g128 data-aware", aware=True),
             rounded("mixprec int4 g128 data-aware, no GPTQ", aware=True, gptq=False),
             rounded("mixprec int4 g128 data-aware, no AWQ", aware=True, awq=False),
             rounded("mixprec int4 g128 data-aware, no held-out check", aware=True, hold_out=False),
             rounded("mixprec nf4 g128 RTN", format="nf4"), rounded("mixprec nf4 g128 data-aware", format="nf4",
                                                                      aware=True),
             weight_only("mixprec W-int4 g128 A32", "eager", W4, "fp32"),
             weight_only("mixprec W-int4 g128 A32 data-aware", "eager", W4, "fp32", **data_aware),
             nncf_weights("NNCF INT4_SYM g128", "INT4_SYM", group_size=128, config=F32_OV),
             nncf_weights("NNCF INT4_SYM g128 all layers", "INT4_SYM", group_size=128, all_layers=True,
                          config=F32_OV),
             nncf_weights("NNCF INT4_SYM g128 AWQ + scale estimation", "INT4_SYM", group_size=128, awq=True,
                          scale_estimation=True, data_aware=True, config=F32_OV),
             nncf_weights("NNCF INT4_SYM g128 AWQ + scale estimation all layers", "INT4_SYM", group_size=128,
                          awq=True, scale_estimation=True, data_aware=True, all_layers=True, config=F32_OV),
             nncf_weights("NNCF NF4 g128 all layers", "NF4", group_size=128, all_layers=True, config=F32_OV))
    shapes = (("tinyllama-8L-1x128", "llama", {"layers": 8, "batch": 1, "seq": 128}),
              ("minilm-16", "minilm", {"batch": 16}),
              ("llama-outliers-4L-1x128", "llama_outliers", {"layers": 4, "batch": 1, "seq": 128, "vocab": 4096}))
    note = ("the same weights and calibration batches for every case; NNCF without all_layers keeps the first and "
            "last layers INT8_ASYM (its default), mixprec's cases round every Linear")
    return [Group("awq43", n, m, s, cases, data=Data(4, 0, 2), timing=Timing(0), threads=2, note=note)
            for n, m, s in shapes]


NO_DYNAMIC = {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}


def _ceiling32():  # issue 32: the weight-only kernels alone at one row against the copy bandwidth
    cases = [FP32, Case("bf16 eager", "cast", {"low": "bf16"}, "torch")]
    for b in ("eager", "openvino"):
        cases += [weight_only(f"mixprec W8A16 {b}", b, W8), weight_only(f"mixprec W4A16 {b}", b, W4)]
    cases += [weight_only("mixprec W8A16 openvino dynamic", "openvino", W8, weight_only_dynamic_activations=32),
              weight_only("mixprec W4A16 openvino dynamic", "openvino", W4, weight_only_dynamic_activations=32),
              nncf_weights("openvino+nncf INT8_ASYM", "INT8_ASYM"),
              nncf_weights("openvino+nncf INT4_SYM g128", "INT4_SYM", group_size=128)]
    return [Group("ceiling32", f"mlp-2048-5632x{pairs}-1row", "linears",
                  {"widths": (2048, 5632) * pairs + (2048,), "activation": "none"}, tuple(cases), threads=2,
                  timing=Timing(5, 2), roofline=True)
            for pairs in (8, 24)]


DECODE = ("fp32 eager", "bf16 eager", "mixprec bf16", "mixprec W4A16 inductor", "mixprec W4A16 openvino",
          "mixprec W4A16 openvino dynamic", "mixprec W8A16 openvino", "mixprec W8A16 openvino dynamic",
          "openvino+nncf INT8_ASYM", "openvino+nncf INT4_SYM g128",
          "openvino+nncf INT4_SYM g128 no dynamic quantization",
          "torchao int8", "torchao int4 g128")


def decode_case(label: str) -> Case:
    """A decode variant by its name: "<who> <weights><activations> <backend> [dynamic]"."""
    if label in ("fp32 eager", "bf16 eager"):
        return Case(label, "hf", {"low": label.split()[0]}, "torch")
    if label.startswith("torchao"):
        return Case(label, "torchao", {"bits": 8 if "int8" in label else 4}, "torch")
    if label.startswith("openvino+nncf"):
        mode = label.split()[1]
        return Case(label, "openvino-kv", {"mode": mode, "group_size": 128 if "g128" in label else None,
                                           "config": NO_DYNAMIC if "no dynamic" in label else {}}, "openvino")
    words = label.split()
    # a KV cache, as the peers decode (without it every step reruns the whole sequence: hf/causal.py)
    settings = {"low": "fp32" if words[1] in ("fp32", "W4A32", "W8A32") else "bf16", "static_cache": True}
    if words[1][0] == "W":
        settings.update(weights=f"int{words[1][1]}", group_size=128 if words[1][1] == "4" else None)
    if "dynamic" in words:
        settings["weight_only_dynamic_activations"] = 32
    backend = words[2] if len(words) > 2 else "eager"
    return Case(label, "mixprec-generate", settings, backend)


def _decode32():  # issues 32/43/45: weight-only decode, TinyLlama widths, tokens/s against OpenVINO + NNCF
    cases = tuple(decode_case(label) for label in DECODE)
    return [Group("decode32", f"tinyllama-{layers}L", "llama", {"layers": layers, "interleave": layers < 22}, cases,
                  kind="decode", threads=threads, timing=Timing(3), note="prompt 128, 16 new tokens, greedy, batch 1")
            for layers, threads in ((8, 1), (22, 2))]


def _decode43():  # issue 43: each weight format's decode tokens/s on OpenVINO against NNCF's same mode
    cases = [decode_case(label) for label in ("fp32 eager", "mixprec W8A16 openvino", "mixprec W4A16 openvino",
                                              "openvino+nncf INT8_ASYM", "openvino+nncf INT4_SYM g128")]
    for fmt, group in weight_formats():  # int8 / int4: the W8A16 / W4A16 cases above
        if fmt in ("int8", "int4"):
            continue
        cases.append(Case(f"mixprec W-{fmt} A16 openvino", "mixprec-generate", {
            "low": "bf16", "static_cache": True, "weights": fmt, "group_size": group}, "openvino"))
        if fmt in NNCF_MODES:
            cases.append(Case(f"openvino+nncf {NNCF_MODES[fmt]}", "openvino-kv",
                              {"mode": NNCF_MODES[fmt], "group_size": group}, "openvino"))
    return [Group("decode43", "tinyllama-8L-formats", "llama", {"layers": 8}, tuple(cases), kind="decode", threads=1,
                  timing=Timing(3), note="prompt 128, 16 new tokens, greedy, batch 1")]


def _generate23():  # issue 23: generate() of causal and encoder-decoder models, mixprec's programs
    cases = (Case("fp32 eager", "hf", {"low": "fp32"}, "torch"), Case("torch.autocast bf16", "hf", {"autocast": True},
             "torch"), Case("torch.compile fp32", "hf", {"compiled": True}, "inductor"),
             Case("mixprec fp32 static", "mixprec-generate", {"static_cache": True}),
             Case("mixprec bf16 static", "mixprec-generate", {"static_cache": True, "enable_autocast": True}),
             Case("mixprec bf16 no-cache", "mixprec-generate", {"static_cache": False, "enable_autocast": True}))
    shapes = (("gpt2-768-4L", "gpt2", {"layers": 4}), ("llama1024-4L", "llama", dict(LLAMA1024, layers=4, kv_heads=4)),
              ("t5-small", "seq2seq", {"arch": "t5"}), ("bart-base", "seq2seq", {"arch": "bart"}),
              ("whisper-tiny", "seq2seq", {"arch": "whisper"}))
    return [Group("generate23", n, m, s, cases, kind="decode", threads=None, timing=Timing(3),
                  note="prompt 16, 16 new tokens; tokens/s of the whole generate()") for n, m, s in shapes]


def _zoo20():  # issues 12/20: mixprec's autocast error against torch.autocast's over input draws, FLOP share
    cases = (FP32, auto("mixprec bf16", autocast_low_precision_type="bf16", **NUMERICS), torch_autocast("bf16"),
             auto("mixprec fp16", autocast_low_precision_type="fp16", **NUMERICS), torch_autocast("fp16"))
    names = ("vit", "convnext", "detr", "swin", "segformer", "bert", "gpt2", "llama", "qwen3", "gemma2", "t5")
    groups = [Group("zoo20", n, "zoo", {"arch": n, "batch": 16}, cases, data=Data(0, 0, 12), timing=Timing(0))
              for n in names]
    for name, model, shape in (("whisper", "whisper_small", {"batch": 16}), ("clip", "clip", {"batch": 16}),
                               ("crepe", "crepe", {"batch": 2}), ("minilm", "minilm", {"batch": 16}),
                               ("llama-massive", "llama_massive", {"batch": 16})):
        groups.append(Group("zoo20", name, model, shape, cases, data=Data(0, 0, 12), timing=Timing(0)))
    return groups


def _readme():  # the README's figures: small test models, weak typing, the runtime guard, the debugger's fix
    small = (FP32, auto("mixprec bf16", autocast_low_precision_type="bf16", **NUMERICS),
             auto("mixprec fp16", autocast_low_precision_type="fp16", **NUMERICS),
             search("search at autocast bf16's error", "bf16", "mixprec bf16", "eager"),
             search("search at half of it", "bf16", ("mixprec bf16", 0.5), "eager"))
    groups = [Group("readme", n, "tests", {"name": n}, small, timing=Timing(0))
              for n in ("bert_small", "gpt2_small", "vit_small")]
    weak = (FP32, mx("weak typing fp32/bf16", use_explicit_typing=False, enabled_precisions=("fp32", "bf16")),
            auto("all bf16", autocast_require_speedup=False, autocast_max_output_threshold=None))
    groups += [Group("readme", f"weak-{n}", m, s, weak, timing=Timing(15)) for n, m, s in MODELS8[:2]]
    guard = (FP32, auto("autocast bf16", **NUMERICS), auto("autocast bf16, runtime_guard=warn", runtime_guard="warn",
                                                           **NUMERICS))
    small_llama = dict(hidden=256, intermediate=688, heads=8, kv_heads=8, vocab=2000, layers=4, batch=2, seq=128)
    groups += [Group("readme", "guard-llama256-4L", "llama", small_llama, guard, timing=Timing(31)),
               Group("readme", "guard-bert256-4L", "bert", dict(layers=4, batch=2, hidden_size=256,
                     num_attention_heads=4, intermediate_size=1024), guard, timing=Timing(31))]
    fix = {"enable_autocast": True, **NUMERICS}
    debug = (("qwen2-2L", "zoo", {"arch": "qwen2"}, fix), ("planted", "planted", {},
             {**fix, "autocast_included_nodes": ["^shift$"]}), ("llama-30L", "llama", dict(
             hidden=16, intermediate=32, heads=2, kv_heads=1, vocab=32, layers=30, batch=1, seq=8), fix))
    groups += [Group("readme", f"debugger-{n}", m, s, (FP32, Case("debugger's first fix, pasted", "debug-fix", o)),
                     timing=Timing(0)) for n, m, s, o in debug]
    return groups


def _mixed22():  # issue 22: mixed int8 + bf16 plans on OpenVINO (the float Converts handed over) and on inductor
    cases = (FP32, nncf_ptq(), cfg("mixprec int8", "openvino", activation="int8"),
             cfg("mixprec int8 + bf16 elsewhere", "openvino", activation="int8", rest="bf16"),
             cfg("mixprec int8 + bf16 elsewhere, inductor", "inductor", activation="int8", rest="bf16"))
    return [Group("mixed22", f"bert-{n}L-2x128", "bert", {"layers": n, "batch": 2}, cases, data=Data(4, 0, 2),
                  timing=Timing(5 if n == 2 else 15)) for n in (2, 12)]


def _compile44():  # issues 8/21/44: compile time against torch.export, the cost cache cold and warm, apply()
    conditions = (Case("torch.export", "export"),
                  # the floor of a compile that measures its error: capture, the fp32 reference run, the program's run
                  Case("torch.export + fp32 run + bf16 program run", "export", {"runs": True}),
                  Case("compile, cost cache off", "compile", {"cache": "off"}),
                  Case("compile, cold cost cache", "compile", {"cache": "cold"}),
                  Case("compile, warm cost cache", "compile", {"cache": "warm"}))
    groups = [Group("compile44", name, "bert", {"batch": 1, "seq": 128}, conditions, kind="compile",
                    timing=Timing(5, 1, fresh_process=fresh), reference="torch.export", note=note)
              for name, note, fresh in (
                  ("bert-1x128", "one process, torch and mixprec warm; cost models emptied per compile", False),
                  ("bert-1x128-fresh", "each sample a new process (its first compile)", True))]
    for requests in ("bf16", "int8"):  # issue 44's bar: apply() + compile(plan=) <= 1.2x compile(plan=) alone
        cases = (Case("compile(plan=) alone", "compile", {"cache": "warm", "plan": requests}),
                 Case("configurator apply() + compile(plan=)", "compile", {"cache": "warm", "apply": requests}))
        groups.append(Group("compile44", f"bert-8x128-configurator-{requests}", "bert", {"batch": 8, "seq": 128},
                            cases, kind="compile", timing=Timing(5, 1), reference="compile(plan=) alone",
                            note="alone: the plan read back from its JSON (made earlier: no capture to reuse)"))
    return groups


def _checks():  # kinds of their own: the cost model, Ray, crafted files
    costs = tuple(Case(f"{b} {k} {a}x{s}", "costs", {"kind": k, "size": (a, s)}, b) for b in ("openvino", "eager")
                  for k, a, s in (("matmul", 256, 768), ("matmul", 128, 512), ("conv", 128, 28), ("conv", 64, 28)))
    ray = (Case("search in one process, 1 thread", "search-here"), Case("search on 2 Ray workers", "search-ray"),
           Case("calibration in one process", "calibrate-here"), Case("calibration over a ray.data.Dataset (2 shards)",
           "calibrate-ray"), Case("two 1-thread searches at once (the machine's ceiling)", "ceiling"))
    crafted = (Case("crafted files (issues 25, 31)", "crafted", {"limit": 60}),)
    return [Group("costs34", "stacks", "linears", {}, costs, kind="costs", timing=Timing(0), reference=""),
            Group("distributed24", "gpt2-4L-4x32", "gpt2", {"layers": 4, "batch": 1, "seq": 32}, ray,
                  kind="distributed", threads=1, data=Data(0, 4, 0), timing=Timing(3), reference=""),
            Group("crafted31", "files", "tests", {}, crafted, kind="crafted", timing=Timing(0), reference="")]


TABLES = {
    "suite8": _suite8, "autocast34": _autocast34, "openvino14": _openvino14, "issue45": _issue45, "call45": _call45,
    "int8region": _int8_regions, "int8nncf": _int8nncf, "search34": _search34, "weights43": _weights43, "awq43": _awq43,
    "ceiling32": _ceiling32, "decode32": _decode32, "decode43": _decode43, "generate23": _generate23,
    "zoo20": _zoo20, "readme": _readme, "mixed22": _mixed22, "compile44": _compile44, "checks": _checks,
}


def groups() -> list[Group]:
    return [g for make in TABLES.values() for g in make()]


def select(patterns) -> list[Group]:
    """Groups matching any pattern: a table ("issue45"), a group ("issue45/bert-8x128") or globs of them;
    "TABLE/GROUP/LABEL" keeps only that case (and the group's reference and budgets)."""
    import fnmatch

    chosen = []
    for group in groups():
        for pattern in patterns:
            parts = pattern.split("/", 2)
            if not fnmatch.fnmatch(group.table, parts[0]) or (len(parts) > 1 and not fnmatch.fnmatch(
                    group.name, parts[1])):
                continue
            if len(parts) == 3:
                group = replace(group, cases=needed(group, parts[2]))
            chosen.append(group)
            break
    return chosen


def needed(group: Group, pattern: str) -> tuple:
    """The cases matching ``pattern``, with the cases they depend on (the reference, budgets)."""
    import fnmatch

    by_label = {c.label: c for c in group.cases}
    keep = {c.label for c in group.cases if fnmatch.fnmatch(c.label, pattern)} | {group.reference}
    for label in list(keep):
        options = by_label[label].options if label in by_label else {}
        budget, ratio = options.get("budget"), options.get("ratio")
        if isinstance(budget, (str, tuple)):
            keep.add(budget if isinstance(budget, str) else budget[0])
        if isinstance(ratio, tuple):
            keep.add(ratio[1])
    return tuple(c for c in group.cases if c.label in keep)
