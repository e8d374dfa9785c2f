"""Tiny random-weight transformers models for the generate() tests (no downloads). Weights are drawn wider than
the configs' defaults so that greedy decoding gives varied tokens rather than one repeated id, and ties between
logits, which would make "the same tokens" a matter of rounding, are unlikely."""

import torch
import transformers

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def t5():
    config = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, initializer_factor=4.0)
    return transformers.T5ForConditionalGeneration(config).eval()


def bart():
    config = transformers.BartConfig(vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=64, init_std=1.0)
    return transformers.BartForConditionalGeneration(config).eval()


def whisper():
    config = transformers.WhisperConfig(vocab_size=64, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
                                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                        decoder_ffn_dim=64, max_source_positions=16, max_target_positions=32,
                                        decoder_start_token_id=1, pad_token_id=0, eos_token_id=2, bos_token_id=1,
                                        begin_suppress_tokens=None, suppress_tokens=None, init_std=1.0)
    return transformers.WhisperForConditionalGeneration(config).eval()


SEQ2SEQ = {"t5": t5, "bart": bart, "whisper": whisper}


def encoder_inputs(name: str, rows: int, generator_seed: int = 0) -> dict:
    """A batch of prompts for model ``name``: token ids (and mask), or Whisper's features (8 mel bins, 32 frames)."""
    generator = torch.Generator().manual_seed(generator_seed)
    if name == "whisper":
        return {"input_features": torch.randn((rows, 8, 32), generator=generator)}
    ids = torch.randint(3, 64, (rows, 7), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)).eval()


def qwen2():
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SMALL)).eval()


def mistral():
    return transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL)).eval()


def gpt2():
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                     initializer_range=0.2)
    return transformers.GPT2LMHeadModel(config).eval()


DECODERS = {"llama": llama, "qwen2": qwen2, "mistral": mistral, "gpt2": gpt2}
