"""One-off (log 2026-12, "Issue 43: the new formats against NNCF's same modes; decode on OpenVINO"): a weight-only
TinyLlama-width program on OpenVINO, the cost of a 1-token decode step against the 128-token prefill.
Run: PYTHONPATH=src python bench/decode_step.py bf16|fp32"""
import time, torch, warnings, sys
warnings.filterwarnings("ignore")
import mixprec, mixprec.hf
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=4, vocab_size=32000)
m = LlamaForCausalLM(cfg).eval()
if sys.argv[1] == "bf16": m = m.to(torch.bfloat16)
prompt = torch.randint(0, 32000, (1, 128))
lm = mixprec.hf.compile_for_generation(m, prompt, max_cache_len=160, max_length=160, backend="openvino", weights="int8")
def gen(n):
    opts = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(prompt))
    t = time.perf_counter(); lm.generate(prompt, **opts); return time.perf_counter() - t
with torch.no_grad():
    gen(2)
    a = min(gen(1) for _ in range(3)); b = min(gen(9) for _ in range(3))
print(sys.argv[1], "prefill+1", a, "per decode step ms", (b - a) / 8 * 1e3)
