"""searching/options.py: every argument of mixprec.search that needs no data is checked in SearchOptions, before
any data is read (issue 33: validation in the options object, not in search's body)."""

import warnings

import pytest
import torch

import mixprec
from mixprec.searching.cache import DEFAULT_CACHE, SearchCache
from mixprec.searching.options import SearchOptions

CPU = torch.device("cpu")


def _options(**given):
    arguments = dict(device=CPU, low_precision_type=None, tolerance=None, metric=None, keep_fp32_fraction=None,
                     eval_dataloader=None)
    return SearchOptions.from_arguments(**{**arguments, **given})


def test_the_cache_and_the_cluster_arguments_are_checked_in_the_options():
    assert _options().store is DEFAULT_CACHE and _options(cache=False).store is None
    own = SearchCache()
    assert _options(cache=own).store is own
    with pytest.raises(mixprec.ConfigError, match="cache must be None"):
        _options(cache="yes")
    with pytest.raises(mixprec.ConfigError, match="workers=2 needs ray_address="):
        _options(workers=2)
    assert (_options(ray_address="local", workers=2).ray_address, _options(ray_address="local").workers) == (
        "local", None)


def test_fp16_on_a_cpu_is_warned_about_once_the_arguments_are_valid():
    with pytest.warns(mixprec.MixedPrecisionWarning, match="float16 on a CPU"):
        _options(low_precision_type="fp16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(mixprec.ConfigError, match="one budget"):  # refused before any warning
            _options(low_precision_type="fp16", tolerance=0.1, keep_fp32_fraction=0.5)
