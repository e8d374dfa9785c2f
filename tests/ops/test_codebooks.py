"""4-bit codebooks (ops/codebooks.py): the nearest level of a table, with E2M1 rounded exactly as the OCP format
(ml_dtypes' float4_e2m1fn: round half to even), and the lookup of plain nibbles."""

import ml_dtypes
import numpy as np
import torch

from mixprec.ops.codebooks import E2M1_LEVELS, NF4_LEVELS, lookup, nearest_codes
from mixprec.ops.int4_storage import to_nibbles


def test_e2m1_codes_round_as_the_format_does_ties_included():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # every midpoint of E2M1's positive grid
    values = torch.cat([ties, -ties, torch.linspace(-6, 6, 2001)])
    want = values.numpy().astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    got = torch.tensor(E2M1_LEVELS)[nearest_codes(values, E2M1_LEVELS).long()]
    assert np.array_equal(got.numpy(), want)


def test_nf4_codes_are_the_nearest_level():
    values = torch.rand(5000) * 2 - 1
    table = torch.tensor(NF4_LEVELS)
    got = table[nearest_codes(values, NF4_LEVELS).long()]
    best = (values[:, None] - table[None, :]).abs().min(-1).values
    assert torch.equal((got - values).abs(), best)


def test_lookup_reads_the_low_nibble_as_the_even_input_channel():
    codes = torch.randint(0, 16, (3, 8), dtype=torch.int32)
    assert torch.equal(lookup(to_nibbles(codes), NF4_LEVELS), torch.tensor(NF4_LEVELS)[codes.long()])
