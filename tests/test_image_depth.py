"""Every image is read right (issue 27): 16-bit images are scaled to 8 bits, not clipped white;
float images are refused with their name, not read as black; and the quadratic encoding refuses
non-finite initial values instead of giving all-NaN outputs."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from attnconv.data.folder import read_image_folder
from attnconv.models import create_model


def _folder(tmp_path, arrays, fmt="PNG"):
    for i, a in enumerate(arrays):
        d = tmp_path / "data" / "train" / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(a).save(d / f"{i}.{fmt.lower()}", format=fmt)
    return tmp_path / "data"


def test_16bit_grey_png_is_scaled_to_8_bits(tmp_path):
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 65536, (8, 8), dtype=np.uint16) for _ in range(2)]
    arrays[0][0, :3] = [0, 65535, 32896]
    x, _, _ = read_image_folder(_folder(tmp_path, arrays), "train")
    by_name = {0: x[0], 1: x[1]}  # sorted c0/0.png, c1/1.png
    for i, a in enumerate(arrays):
        want = np.round(a.astype(np.float64) * 255 / 65535).astype(np.uint8)
        for ch in range(3):
            assert np.array_equal(by_name[i][ch], want)
    assert by_name[0][0, 0, :3].tolist() == [0, 255, 128]


def test_8bit_images_read_as_before(tmp_path):
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) for _ in range(2)]
    x, _, _ = read_image_folder(_folder(tmp_path, arrays), "train")
    assert np.array_equal(x[0], arrays[0].transpose(2, 0, 1))


def test_float_tiff_is_refused_with_its_name(tmp_path):
    arrays = [np.random.default_rng(2).random((8, 8)).astype(np.float32) for _ in range(2)]
    with pytest.raises(ValueError, match=r"0\.tiff'.* float pixels"):
        read_image_folder(_folder(tmp_path, arrays, fmt="TIFF"), "train")


@pytest.mark.parametrize(
    "kw",
    [
        {"init_alpha": float("inf")},
        {"init_alpha": float("nan")},
        {"init_alpha": -1.0},
        {"init_centers_std": float("nan")},
        {"init_centers_std": float("inf")},
    ],
)
def test_non_finite_initial_values_are_refused(kw):
    name = next(iter(kw))
    with pytest.raises(ValueError, match=f"{name} must be a finite number"):
        create_model("sa_quadratic", hidden_size=8, num_layers=1, num_heads=2, **kw)
