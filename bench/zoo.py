"""mixprec's autocast against torch.autocast on transformers architectures (issue 12's bar).

    python bench/zoo.py [--only NAME[,NAME]] [--dtypes bf16,fp16] [--no-8l] [--no-low-emb]

(``--no-low-emb`` also lets the script run against a mixprec without ``autocast_low_precision_embeddings``,
to measure the code before issue 12.)

Every model is a small random config of a ``transformers`` architecture (no downloads) plus the
Llama-8L shape (8 layers, hidden 1024, 2x128 tokens). Inputs exercise ranges: token ids over the
whole vocabulary, decoders at positions 2000+ (``position_ids``), images and audio at real scale
(unit-variance pixels, audio of amplitude ~0.5, log-mel features of magnitude ~1-10).

For each model and low type (bf16, fp16):

* the main output (logits or last hidden state) of the fp32 model on these inputs is the reference;
* ``mixprec``: ``mixprec.compile(enable_autocast=True, autocast_low_precision_type=low)`` calibrated on
  the same inputs; its rel-L2 error against the reference;
* ``torch.autocast``: the fp32 model run under ``torch.autocast("cpu", dtype=low)``; its rel-L2 error;
* ratio = mixprec / torch.autocast (the bar: <= 1.1);
* low-precision share of the matmul/conv FLOPs: mixprec's from its report; torch.autocast's measured
  by a dispatch mode that counts the FLOPs of mm/bmm/addmm/baddbmm/convolution/attention calls by dtype
  while the model runs under torch.autocast;
* parameter bytes: fp32 model, mixprec's program, and (bf16 rows) mixprec with
  ``autocast_low_precision_embeddings=True`` (embedding tables stored in the low type).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

sys.path.insert(0, str(Path(__file__).parent))
import transformers  # noqa: E402
from harness import machine, stamp, table  # noqa: E402

import mixprec  # noqa: E402
from mixprec.output.numerics import output_errors  # noqa: E402

T = transformers
POS0 = 2000  # decoders run at positions 2000..2000+S
S = 16  # sequence length of the small models


# ----------------------------------------------------------------------------------------------------------
# models: name -> (model, args, kwargs)


def _ids(vocab, batch=2, seq=S):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (batch, seq), generator=g)


def _positions(batch=2, seq=S, start=POS0):
    return torch.arange(start, start + seq).unsqueeze(0).expand(batch, seq).contiguous()


_ENC = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
_DEC = dict(
    vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=128, max_position_embeddings=4096,
)


def _encoder(config_cls, model_cls, **extra):
    def build():
        model = model_cls(config_cls(**{**_ENC, **extra}))
        return model, (_ids(512),), {}
    return build


def _decoder(config_cls, model_cls, positions=True, **extra):
    def build():
        model = model_cls(config_cls(**{**_DEC, **extra}))
        kwargs = {"use_cache": False}
        if positions:
            kwargs["position_ids"] = _positions()
        return model, (_ids(512),), kwargs
    return build


def _gpt2():
    cfg = T.GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=2048)
    return T.GPT2LMHeadModel(cfg), (_ids(512),), {"use_cache": False, "position_ids": _positions()}


def _opt():
    cfg = T.OPTConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                      max_position_embeddings=2048, word_embed_proj_dim=64)
    return T.OPTForCausalLM(cfg), (_ids(512),), {"use_cache": False, "position_ids": _positions()}


def _neox():
    cfg = T.GPTNeoXConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, max_position_embeddings=4096)
    return T.GPTNeoXForCausalLM(cfg), (_ids(512),), {"use_cache": False, "position_ids": _positions()}


def _falcon():
    cfg = T.FalconConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=4096, new_decoder_architecture=True, num_kv_heads=2)
    return T.FalconForCausalLM(cfg), (_ids(512),), {"use_cache": False, "position_ids": _positions()}


def _t5():
    cfg = T.T5Config(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
    return T.T5ForConditionalGeneration(cfg), (_ids(512),), {"decoder_input_ids": _ids(512, seq=8), "use_cache": False}


def _bart():
    cfg = T.BartConfig(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128)
    return T.BartForConditionalGeneration(cfg), (_ids(512),), {"decoder_input_ids": _ids(512, seq=8), "use_cache": False}


def _whisper():
    cfg = T.WhisperConfig(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
                          max_source_positions=32, max_target_positions=64, pad_token_id=0,
                          bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(1, 16, 64, generator=g) * 4.0  # log-mel scale
    return T.WhisperForConditionalGeneration(cfg), (feats,), {"decoder_input_ids": _ids(512, batch=1, seq=8), "use_cache": False}


def _image(batch=2, size=32):
    g = torch.Generator().manual_seed(3)
    return torch.randn(batch, 3, size, size, generator=g)


def _vit():
    cfg = T.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                      image_size=32, patch_size=8)
    return T.ViTModel(cfg, add_pooling_layer=False), (_image(),), {}


def _swin():
    cfg = T.SwinConfig(image_size=32, patch_size=4, embed_dim=32, depths=[1, 1], num_heads=[2, 4], window_size=4)
    return T.SwinModel(cfg), (_image(),), {}


def _convnext():
    cfg = T.ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], image_size=32)
    return T.ConvNextModel(cfg), (_image(),), {}


def _resnet():
    cfg = T.ResNetConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], embedding_size=16)
    return T.ResNetModel(cfg), (_image(),), {}


def _clip_vision():
    cfg = T.CLIPVisionConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                             image_size=32, patch_size=8)
    return T.CLIPVisionModel(cfg), (_image(),), {}


def _wav2vec2():
    cfg = T.Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                           conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                           num_conv_pos_embedding_groups=4, do_stable_layer_norm=True, feat_extract_norm="layer")
    g = torch.Generator().manual_seed(4)
    audio = torch.randn(2, 1600, generator=g) * 0.5
    return T.Wav2Vec2Model(cfg), (audio,), {}


def _llama_8l():
    cfg = T.LlamaConfig(vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096)
    return T.LlamaForCausalLM(cfg), (_ids(4096, batch=2, seq=128),), {"use_cache": False}


MODELS = {
    "bert": _encoder(T.BertConfig, T.BertModel),
    "roberta": _encoder(T.RobertaConfig, T.RobertaModel),
    "distilbert": lambda: (T.DistilBertModel(T.DistilBertConfig(vocab_size=512, dim=64, n_layers=2, n_heads=4,
                                                                 hidden_dim=128)), (_ids(512),), {}),
    "albert": _encoder(T.AlbertConfig, T.AlbertModel, embedding_size=32),
    "electra": _encoder(T.ElectraConfig, T.ElectraModel, embedding_size=32),
    "deberta-v2": _encoder(T.DebertaV2Config, T.DebertaV2Model),
    "llama": _decoder(T.LlamaConfig, T.LlamaForCausalLM),
    "mistral": _decoder(T.MistralConfig, T.MistralForCausalLM),
    "qwen2": _decoder(T.Qwen2Config, T.Qwen2ForCausalLM),
    "qwen3": _decoder(T.Qwen3Config, T.Qwen3ForCausalLM, head_dim=16),
    "phi3": _decoder(T.Phi3Config, T.Phi3ForCausalLM, pad_token_id=0),
    "gemma": _decoder(T.GemmaConfig, T.GemmaForCausalLM, head_dim=16),
    "gemma2": _decoder(T.Gemma2Config, T.Gemma2ForCausalLM, head_dim=16),
    "opt": _opt,
    "gpt2": _gpt2,
    "gpt-neox": _neox,
    "falcon": _falcon,
    "t5": _t5,
    "bart": _bart,
    "whisper": _whisper,
    "vit": _vit,
    "swin": _swin,
    "convnext": _convnext,
    "resnet": _resnet,
    "clip-vision": _clip_vision,
    "wav2vec2": _wav2vec2,
    "llama-8L": _llama_8l,
}


# ----------------------------------------------------------------------------------------------------------


def main_output(out) -> torch.Tensor:
    for key in ("logits", "last_hidden_state"):
        value = getattr(out, key, None) if not isinstance(out, dict) else out.get(key)
        if isinstance(value, torch.Tensor):
            return value
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return leaves[0]


def _flops(name, args, out) -> int:
    """Multiply-add FLOPs (2 per MAC) of one matmul/conv/attention call, or 0 for other ops."""
    if name in ("mm", "bmm"):
        return 2 * out.numel() * args[0].shape[-1]
    if name in ("addmm", "baddbmm"):
        return 2 * out.numel() * args[1].shape[-1]
    if name in ("convolution", "_convolution"):
        weight = args[1]
        transposed = bool(args[6]) if len(args) > 6 else False
        return 2 * (args[0].numel() if transposed else out.numel()) * weight[0].numel()
    if name.startswith("_scaled_dot_product"):
        q, k, v = args[:3]
        return 2 * q.shape[:-2].numel() * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    return 0


class LowFlops(TorchDispatchMode):
    """FLOPs of the matmul/conv/attention kernels a forward runs, by the dtype they run in."""

    def __init__(self):
        super().__init__()
        self.by_dtype: dict[torch.dtype, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.name().split("::")[-1].split(".")[0]
        first = out[0] if isinstance(out, (tuple, list)) else out
        flops = _flops(name, args, first) if isinstance(first, torch.Tensor) else 0
        if flops:
            dtype = next(t.dtype for t in args if isinstance(t, torch.Tensor) and t.is_floating_point())
            self.by_dtype[dtype] = self.by_dtype.get(dtype, 0) + flops
        return out


class _Positional(torch.nn.Module):
    """forward(*tensors) -> model(**{names: tensors}, **constants): keyword inputs as positional tensors."""

    def __init__(self, model, names, constants):
        super().__init__()
        self.model, self.names, self.constants = model, names, constants

    def forward(self, *tensors):
        return main_output(self.model(**dict(zip(self.names, tensors)), **self.constants))


def autocast_run(model, args, kwargs, low):
    counter = LowFlops()
    with torch.no_grad(), torch.autocast("cpu", dtype=low), counter:
        out = main_output(model(*args, **kwargs))
    total = sum(counter.by_dtype.values())
    share = counter.by_dtype.get(low, 0) / total if total else float("nan")
    return out, share


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def run_one(name, build, dtypes, rows, low_emb=True):
    torch.manual_seed(0)
    model, args, kwargs = build()
    model.eval()
    names = list(__import__("inspect").signature(model.forward).parameters)[: len(args)]
    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    model = _Positional(model, names + list(tensors), {k: v for k, v in kwargs.items() if k not in tensors}).eval()
    args, kwargs = tuple(args) + tuple(tensors.values()), {}
    with torch.no_grad():
        ref = main_output(model(*args, **kwargs)).float()
    for low in dtypes:
        start = time.perf_counter()
        prog = mixprec.compile(model, args, kwargs=kwargs, enable_autocast=True, autocast_low_precision_type=low)
        with torch.no_grad():
            got = main_output(prog(*args, **kwargs)).float()
        s = prog.report.summary
        mine = output_errors(got, ref)["rel_l2_error"]
        auto_out, auto_share = autocast_run(model, args, kwargs, low)
        theirs = output_errors(auto_out.float(), ref)["rel_l2_error"]
        row = {
            "model": name, "low": {torch.bfloat16: "bf16", torch.float16: "fp16"}[low],
            "mixprec rel-L2": mine, "torch.autocast rel-L2": theirs, "ratio": mine / theirs if theirs else float("nan"),
            "low FLOP share mixprec": s["low_precision_flops_fraction"], "low FLOP share autocast": auto_share,
            "param MB fp32": param_bytes(model) / 1e6, "param MB mixprec": s["param_bytes_after"] / 1e6,
        }
        if low == torch.bfloat16 and low_emb:
            lowemb = mixprec.compile(model, args, kwargs=kwargs, enable_autocast=True, autocast_low_precision_type=low,
                                     autocast_low_precision_embeddings=True)
            with torch.no_grad():
                e = output_errors(main_output(lowemb(*args, **kwargs)).float(), ref)["rel_l2_error"]
            row["param MB low emb"] = lowemb.report.summary["param_bytes_after"] / 1e6
            row["rel-L2 low emb"] = e
        else:
            row["param MB low emb"] = ""
            row["rel-L2 low emb"] = ""
        row["s"] = time.perf_counter() - start
        rows.append(row)
        print(table([row], list(row)).splitlines()[-1], flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="")
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--no-8l", action="store_true")
    parser.add_argument("--no-low-emb", action="store_true", help="skip the low-precision-embeddings variant")
    opts = parser.parse_args()
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    dtypes = [{"bf16": torch.bfloat16, "fp16": torch.float16}[d] for d in opts.dtypes.split(",")]
    names = opts.only.split(",") if opts.only else [n for n in MODELS if not (opts.no_8l and n == "llama-8L")]
    print(f"{stamp()}  {machine()}")
    print(f"command: python bench/zoo.py {' '.join(sys.argv[1:])}".rstrip())
    rows, failed = [], []
    for name in names:
        try:
            run_one(name, MODELS[name], dtypes, rows, low_emb=not opts.no_low_emb)
        except Exception as e:  # a model the bench cannot run: say so, go on
            failed.append((name, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
            traceback.print_exc(limit=3)
    print()
    if rows:
        print(table(rows, list(rows[0])))
        worst = max(r["ratio"] for r in rows)
        over = [f"{r['model']}/{r['low']}" for r in rows if not r["ratio"] <= 1.1]
        fewer = [f"{r['model']}/{r['low']}" for r in rows
                 if r["low FLOP share mixprec"] < r["low FLOP share autocast"] - 1e-9]
        print(f"\n{len({r['model'] for r in rows})} models; worst ratio {worst:.3g}; ratio > 1.1: {over or 'none'}; "
              f"lower FLOP share than torch.autocast: {fewer or 'none'}")
    for name, why in failed:
        print(f"FAILED {name}: {why}")


if __name__ == "__main__":
    main()
