"""A conv + batch-norm model with trained-looking statistics on OpenVINO and eager: error ratio to torch.autocast.

    PYTHONPATH=src python bench/openvino_batchnorm.py        # this tree; compare with another tree's src

Running means of +-30 and variances of 0.5-4 (as a trained CNN has), 5 weight seeds, bf16. Eager runs batch
norm as torch.autocast does; OpenVINO's frontend folds the statistics into the conv before in bf16 constants.
"""
import warnings

import torch
from torch import nn

import mixprec

warnings.simplefilter("ignore")


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.c, self.bn, self.c2 = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(8, 4, 3)
        self.c1d, self.bn1 = nn.Conv1d(4, 6, 3), nn.BatchNorm1d(6)

    def forward(self, x):
        return self.bn1(self.c1d(self.c2(torch.relu(self.bn(self.c(x)))).flatten(2)))


for seed in range(5):
    torch.manual_seed(seed)
    m = M().eval()
    with torch.no_grad():
        for bn in (m.bn, m.bn1):
            bn.running_mean.uniform_(-30, 30), bn.running_var.uniform_(0.5, 4)
            bn.weight.uniform_(0.5, 2), bn.bias.uniform_(-1, 1)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = m(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            au = m(x).float()

    def err(a):
        return ((a - ref).norm() / ref.norm()).item()

    ov = mixprec.compile(m, (x,), enable_autocast=True, backend="openvino")
    eager = mixprec.compile(m, (x,), enable_autocast=True)
    print(seed, "openvino/autocast", round(err(ov(x)) / err(au), 2), "eager/autocast", round(err(eager(x)) / err(au), 2))
