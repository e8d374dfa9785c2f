"""One-off: PyTorch's weight-only CPU kernels (int8, int4) against dequantize-then-GEMM, by rows (log 2026-12,
"Weight-only kernels by rows"). Run: python bench/kernel_rows.py"""
import torch, time, statistics
torch.set_num_threads(1)
aten = torch.ops.aten
def t(f, n=7):
    f(); s=[]
    for _ in range(n):
        a=time.perf_counter(); f(); s.append(time.perf_counter()-a)
    return statistics.median(s)
for (N,K) in ((1536,384),(2048,2048)):
    w8 = torch.randint(-127,127,(N,K),dtype=torch.int8); sc = torch.rand(N)
    wf = torch.randn(N,K)
    w4 = aten._convert_weight_to_int4pack_for_cpu(torch.randint(0,16,(N,K),dtype=torch.int32), 1)
    sz = torch.rand(K//128, N, 2)
    for M in (1,4,16,32,64,128,512):
        x = torch.randn(M,K)
        k8 = t(lambda: aten._weight_int8pack_mm(x, w8, sc))
        d8 = t(lambda: torch.nn.functional.linear(x, w8.float()*sc[:,None]))
        k4 = t(lambda: aten._weight_int4pack_mm_for_cpu(x, w4, 128, sz))
        d4 = t(lambda: torch.nn.functional.linear(x, (wf*1.0)))
        print(N,K,M, f"int8 kernel {k8*1e3:.2f} ms dequant {d8*1e3:.2f}  int4 kernel {k4*1e3:.2f} dense+copy {d4*1e3:.2f}", flush=True)
