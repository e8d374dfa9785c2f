"""The README's main job: compile small models and print what mixprec did to every layer.

1. Strong typing: the model writes its own precisions — a classifier head converted with
   ``.bfloat16()``, and a ``torch.autocast`` region around the feature extractor. mixprec
   captures it, makes every cast explicit, and the compiled program gives exactly the outputs
   eager PyTorch gives, with a per-layer report and the error against fp32.
2. Rule-based autocast: a small transformer block left in fp32, fed real-scale inputs; mixprec
   lowers it to bf16 except where a rule says otherwise, and every decision says why. First it measures
   whether bf16 is faster than fp32 on this machine for the block's layer shapes: where it is not (some
   CPUs with bf16 instructions but no AMX; CPUs that emulate bf16), those layers stay fp32 and their
   reasons quote the measurement.
"""

import torch

import mixprec


class Demo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(16)
        self.pool = torch.nn.AdaptiveAvgPool2d(4)
        self.fc1 = torch.nn.Linear(16 * 16, 64)
        self.head = torch.nn.Linear(64, 10).bfloat16()

    def forward(self, x):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            x = torch.relu(self.norm(self.conv(x)))
        x = self.pool(x.float()).flatten(1)
        x = torch.relu(self.fc1(x))
        return self.head(x.bfloat16()).float()


def model_and_inputs():
    """The SPEC for the command line: ``mixprec compile examples/demo.py:model_and_inputs ...``."""
    torch.manual_seed(0)
    return Demo().eval(), (torch.randn(8, 3, 32, 32),)


class Block(torch.nn.Module):
    """A pre-norm transformer block whose input arrives at real scale (sensor readings ~1000)."""

    def __init__(self, dim=64):
        super().__init__()
        self.scale = torch.nn.Linear(dim, dim)
        self.norm1 = torch.nn.LayerNorm(dim)
        self.attn = torch.nn.MultiheadAttention(dim, 4, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = self.scale(x / 1000.0)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def autocast_demo():
    torch.manual_seed(0)
    model = Block().eval()
    inputs = (torch.randn(4, 16, 64) * 1000.0,)
    prog = mixprec.compile(model, inputs, enable_autocast=True)
    print("== 2. rule-based autocast (enable_autocast=True): a transformer block left in fp32")
    print(prog.report)
    measured = prog.report.summary.get("accelerated_types")
    if measured:
        low = measured["measured"]
        shapes = "; ".join(f"{c['op']} {c['shapes']}: {c['speedup']:.2f}x" for c in measured["classes"]
                           if c["speedup"] is not None)
        print(f"\n{low} {measured['speedup']:.2f}x fp32 on {measured['on']} ({measured['backend']} backend) for "
              f"this block's matmuls, FLOP-weighted; per layer shape timed: {shapes}")
        print(f"faster here: {', '.join(measured['types']) or 'none, so those layers stay fp32'} "
              "(autocast_require_speedup=False lowers them anyway, to preview the numerics)")


def main():
    print("== 1. strong typing: the precisions written in the model are honoured exactly")
    model, inputs = model_and_inputs()
    prog = mixprec.compile(model, inputs, use_fp32_acc=True)
    print(prog.report)
    print()
    print(prog.report.layer_info())
    with torch.no_grad():
        eager = model(*inputs)
    got = prog(*inputs)
    print()
    print(f"compiled vs eager PyTorch: max |difference| = {(got - eager).abs().max().item():.3g} "
          f"(fp32 accumulation in the bf16 layers; without use_fp32_acc it is exactly 0)")
    print()
    autocast_demo()


if __name__ == "__main__":
    main()
