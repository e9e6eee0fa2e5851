"""The explorer page of a converted ResNet18 stays small and quick (issue 28: the page was 114 MB
and took minutes): position-only maps come from one forward pass of two images and are stored
once per layer, and a hard head's row keeps one byte.

A ResNet18 with narrow stages has the converted ResNet18's layers, heads and token grids (the
page does not depend on the channel widths), so its page is the real one's size."""

from __future__ import annotations

import json
import math
from importlib import resources

import pytest
import torch

from attnconv.analysis.converted import ConvertedAttentionView
from attnconv.analysis.explorer import explore_model
from attnconv.analysis.inputs import test_images as load_test_images
from attnconv.convert import convert_model
from attnconv.data import CIFAR10_MEAN, CIFAR10_STD
from attnconv.models import create_model

ROW_BYTES = 1 + 8 + 4  # a hard row: one value, its box (4 x uint16), its peak (float32)


def page_data(html: str) -> dict:
    return json.loads(html.split('id="explorer-data">')[1].split("</script>")[0])


@pytest.mark.slow
def test_converted_resnet18_page_is_small_and_from_two_images(cifar_zip, tmp_path):
    torch.manual_seed(0)
    cnn = create_model("resnet18_cifar", widths=(4, 8, 8, 8)).eval()
    model = ConvertedAttentionView(convert_model(cnn), (32, 32)).eval()
    forwards = []
    model.model.register_forward_hook(lambda m, a, o: forwards.append(a[0].shape[0]))
    images, labels = load_test_images(str(cifar_zip), 20)
    template = resources.files("attnconv.analysis").joinpath("explorer.html").read_text()
    sizes = {}
    for shown in (2, 8):
        page = explore_model(
            model,
            images[:shown],
            tmp_path / f"p{shown}.html",
            average_images=images,
            labels=labels[:shown],
            mean=CIFAR10_MEAN,
            std=CIFAR10_STD,
        )
        html = page.read_text()
        data = page_data(html)
        layers = data["layers"]
        assert [L["name"] for L in layers][:3] == ["conv1", "layers.0.0.conv1", "layers.0.0.conv2"]
        assert len(layers) == 20 and data["num_average"] == 20
        # every image and the average share each layer's one stored copy
        assert all(len(L["maps"]) == 1 for L in layers)
        assert data["average"] == [0] * 20 and all(s == [0] * 20 for s in data["single"])
        rows = sum(L["heads"] * math.prod(L["qgrid"]) for L in layers)
        pixels = shown * 32 * 32 * 3
        bound = len(template) + 4 / 3 * (rows * ROW_BYTES + pixels) + 20_000  # + keys, colormap
        assert len(html) < bound, (len(html), bound)
        sizes[shown] = len(html)
    # per page, one pass of two images for the shown ones and one for the average: the maps are
    # position-only, no other image can change them
    assert forwards == [2, 2, 2, 2]
    assert sizes[8] - sizes[2] < 4 / 3 * 6 * 32 * 32 * 3 + 500  # 6 more images: their pixels
    assert sizes[8] < 1e6  # the real converted ResNet18's page under 10 MB, with room
