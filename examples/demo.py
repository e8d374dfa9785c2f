"""The README's main job: compile a small model and print what mixprec did to every layer.

The model writes its own precisions (strong typing): a classifier head converted with
``.bfloat16()``, and a ``torch.autocast`` region around the feature extractor. mixprec
captures it, makes every cast explicit, and the compiled program gives exactly the
outputs eager PyTorch gives, with a per-layer report and the error against fp32.
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


def main():
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


if __name__ == "__main__":
    main()
