"""Config numbers (issue 27, item 5): a huge integer for a float key or a width is one clear
error naming the key (was OverflowError / a C++ stack), and 1e-3 is a float in a list too."""

from __future__ import annotations

import pytest

from attnconv.train.config import load_config

BIG = "1" + "0" * 400


CASES = [
    (f"optim.lr={BIG}", "optim.lr"),
    (f"data.std=[{BIG},0.2,0.2]", r"data.std\[0\]"),
    (f"model.kwargs.width={BIG}", "model.kwargs.width"),
]


@pytest.mark.parametrize("override, key", CASES)
def test_huge_numbers_are_one_error_naming_the_key(override, key):
    with pytest.raises(ValueError, match=rf"config key '{key}'"):
        load_config(None, [override])


def test_exponent_floats_in_lists_are_accepted():
    cfg = load_config(None, ["data.std=[1e-3,0.2,2e-1]"])
    assert cfg.data.std == [1e-3, 0.2, 0.2] and all(isinstance(x, float) for x in cfg.data.std)
