"""The package refuses a build made for another torch, instead of crashing in the first call."""
import re

import pytest
import torch

import torch_convbp


def test_the_build_records_the_torch_it_was_compiled_against():
    release = re.match(r"\d+\.\d+\.\d+", torch.__version__).group(0)
    assert torch_convbp._C.built_with_torch == release


@pytest.mark.parametrize("running", ["2.13.0", "2.13.0+cpu", "2.13.0+cu130"])
def test_the_same_release_is_accepted(running):
    torch_convbp._check_built_with("2.13.0", running)


@pytest.mark.parametrize("running", ["2.14.1+cu130", "2.13.1", "3.13.0"])
def test_another_release_is_refused_with_how_to_rebuild(running):
    with pytest.raises(ImportError, match=r"compiled against torch 2\.13\.0, but this is torch .*rebuild"):
        torch_convbp._check_built_with("2.13.0", running)
