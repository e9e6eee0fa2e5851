"""The explorer page in a real headless Chromium: clicking a pixel redraws every head's map for
that query, the switch shows the average, and the page makes no network request."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnconv.analysis.explorer import (
    build_data,
    decode_rows,
    query_subgrid,
    render_html,
    write_explorer,
)
from attnconv.data import CIFAR10_MEAN, CIFAR10_STD, load_dataset

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"  # Debian's package
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SCALE = 9  # the page draws a 32x32 image at 9 screen pixels per image pixel (288 // 32)

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason="no headless browser: install Debian's chromium with `apt-get install -y chromium` "
    "(.ci/run does)",
)


def gaussian_layer(grid, centers, alpha=3.0):
    """Quadratic heads (Cordonnier eq. 9): (Nh, T, T) = softmax(-alpha ||k - q - Delta||^2)."""
    h, w = grid
    pos = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1)
    pos = pos.reshape(-1, 2).double()
    d = pos[None, :, :] - pos[:, None, :]
    c = torch.tensor(centers, dtype=torch.float64)
    return torch.softmax(-alpha * ((d[None] - c[:, None, None]) ** 2).sum(-1), -1).float()


CENTERS = {  # per image: layer 0 (8x8 tokens) and layer 1 (4x4 tokens) head centres
    0: ([(0, 1), (2, -1), (-1, -2)], [(1, 0), (0, -1)]),
    1: ([(-2, 0), (0, 0), (1, 2)], [(-1, -1), (1, 1)]),
    "avg": ([(0, -1), (-1, 1), (2, 2)], [(0, 1), (-1, 0)]),
}


def constructed(images, **kw):
    def layers(key):
        c0, c1 = CENTERS[key]
        return [gaussian_layer((8, 8), c0), gaussian_layer((4, 4), c1)]

    return build_data(
        images,
        [layers(0), layers(1)],
        layers("avg"),
        (8, 8),
        layer_grids=[(8, 8), (4, 4)],
        num_average=7,
        **kw,
    )


def expected_argmax(grid, query_token, center):
    h, w = grid
    return (
        min(max(query_token[0] + center[0], 0), h - 1),
        min(max(query_token[1] + center[1], 0), w - 1),
    )


@pytest.fixture
def test_images(cifar_zip):
    """Two real CIFAR-10 test images (uint8) and their class names."""
    ds = load_dataset(str(cifar_zip), "test", max_per_class=1, use_cache=False)
    return ds.images[:2], [ds.classes[int(i)] for i in ds.labels[:2]]


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright's Python package: pip install -e '.[dev]'"
    )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def open_page(browser, path: Path, width: int = 1400):
    """Open ``path`` recording every request the page makes (all are let through)."""
    page = browser.new_page(viewport={"width": width, "height": 1000})
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    return page, requests, errors


def heads_state(page):
    """Per head canvas: layer, head, query, argmax and the RGB at the centre of every token."""
    return page.evaluate(
        """() => [...document.querySelectorAll('canvas.head')].map(c => {
            const cell = +c.dataset.cell, ctx = c.getContext('2d');
            const h = c.height / cell, w = c.width / cell, rgb = [];
            const all = ctx.getImageData(0, 0, c.width, c.height).data;
            for (let r = 0; r < h; r++) for (let k = 0; k < w; k++) {
                const i = 4 * ((r * cell + (cell >> 1)) * c.width + k * cell + (cell >> 1));
                rgb.push([all[i], all[i + 1], all[i + 2]]);
            }
            return {layer: +c.dataset.layer, head: +c.dataset.head, query: c.dataset.query,
                    argmax: c.dataset.argmax, peak: +c.dataset.peak, rgb};
        })"""
    )


def click_pixel(page, row, col):
    page.click("#image", position={"x": col * SCALE + SCALE // 2, "y": row * SCALE + SCALE // 2})


def decode_maps(data, image, li):
    """The stored (Nh, Q, hw) uint8 maps of layer ``li`` for ``image``."""
    L = data["layers"][li]
    return decode_rows(L["maps"][data["single"][image][li]], L["heads"], L["grid"])


@pytest.mark.slow
def test_click_redraws_every_head_for_the_query(browser, test_images, tmp_path):
    images, labels = test_images
    data = constructed(images, labels=labels, title="constructed heads")
    page_path = write_explorer(data, tmp_path / "page.html")
    page, requests, errors = open_page(browser, page_path)
    cmap = np.array(data["colormap"])
    before = heads_state(page)
    for (row, col), key in [((5, 30), 0), ((29, 2), 0), ((17, 13), 0)]:
        click_pixel(page, row, col)
        assert page.evaluate("document.body.dataset.query") == f"{row},{col}"
        state = heads_state(page)
        assert state != before  # every click moves the query: the maps change
        before = state
        for s in state:
            li, hd = s["layer"], s["head"]
            grid = (8, 8) if li == 0 else (4, 4)
            tok = (row * grid[0] // 32, col * grid[1] // 32)
            assert s["query"] == f"{tok[0]},{tok[1]}"
            want = expected_argmax(grid, tok, CENTERS[key][li][hd])
            assert s["argmax"] == f"{want[0]},{want[1]}", (li, hd)
            # every drawn token has the colour of the stored map value for this query
            vals = decode_maps(data, 0, li)
            q = tok[0] * grid[1] + tok[1]
            np.testing.assert_array_equal(np.array(s["rgb"]), cmap[vals[hd, q]])
    # second image: other centres; average: the averaged maps
    page.click("#thumbs canvas:nth-child(2)")
    for s in heads_state(page):
        grid = (8, 8) if s["layer"] == 0 else (4, 4)
        tok = (17 * grid[0] // 32, 13 * grid[1] // 32)
        want = expected_argmax(grid, tok, CENTERS[1][s["layer"]][s["head"]])
        assert s["argmax"] == f"{want[0]},{want[1]}"
    page.check("#mode-average")
    assert page.evaluate("document.body.dataset.mode") == "average"
    for s in heads_state(page):
        grid = (8, 8) if s["layer"] == 0 else (4, 4)
        tok = (17 * grid[0] // 32, 13 * grid[1] // 32)
        want = expected_argmax(grid, tok, CENTERS["avg"][s["layer"]][s["head"]])
        assert s["argmax"] == f"{want[0]},{want[1]}"
    # the colour-scale switch: "0..1" draws p itself, so the brightest token is below the top colour
    page.select_option("#scale", "one")
    s0 = heads_state(page)[0]
    top = cmap[min(255, round(s0["peak"] * 255))]
    assert list(top) in [list(c) for c in s0["rgb"]]
    assert errors == []
    assert requests == [page_path.resolve().as_uri()]  # the page itself, nothing else
    page.close()


@pytest.mark.slow
def test_query_subgrid_snaps_clicks(browser, test_images, tmp_path):
    images, labels = test_images
    data = constructed(images, labels=labels, max_queries=16)
    assert data["layers"][0]["qgrid"] == [4, 4] and data["layers"][0]["stride"] == 2
    page, requests, errors = open_page(browser, write_explorer(data, tmp_path / "sub.html"))
    click_pixel(page, 0, 31)  # token (0, 7) of layer 0 -> stored query (1, 7)
    s = heads_state(page)
    assert s[0]["query"] == "1,7" and s[3]["query"] == "0,3"
    _, _, idx = query_subgrid((8, 8), 16)
    assert idx.tolist()[:4] == [9, 11, 13, 15]
    assert errors == [] and len(requests) == 1
    page.close()


@pytest.mark.slow
def test_hard_heads_are_ringed_and_the_page_fits_its_width(browser, test_images, tmp_path):
    """Nine one-hot heads on a 32x32 grid (a converted 3x3 convolution, 20 layers of them): each
    map rings the one key it attends to, which keeps its colour, and at 1000 px the page does
    not scroll sideways."""
    images, labels = test_images
    centers = [(r, c) for r in (-1, 0, 1) for c in (-1, 0, 1)]
    hard = [gaussian_layer((32, 32), centers, alpha=50.0)] * 20
    data = build_data(images, [hard, hard], hard, (32, 32), labels=labels, num_average=2)
    page, requests, errors = open_page(browser, write_explorer(data, tmp_path / "h.html"), 1000)
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1]
    click_pixel(page, 17, 13)
    top = list(np.array(data["colormap"])[255])
    marks = page.evaluate(
        """() => [...document.querySelectorAll('canvas.head')].map(c => {
            const cell = +c.dataset.cell, [r, k] = c.dataset.argmax.split(',').map(Number);
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let white = 0;
            for (let i = 0; i < d.length; i += 4) white += d[i] + d[i + 1] + d[i + 2] === 765;
            const i = 4 * ((r * cell + (cell >> 1)) * c.width + k * cell + (cell >> 1));
            return {hard: c.dataset.hard, white, key: [d[i], d[i + 1], d[i + 2]]};
        })"""
    )
    assert len(marks) == 20 * 9
    for m in marks:
        assert m["hard"] == "1" and m["white"] > 10 and m["key"] == top
    assert errors == [] and len(requests) == 1
    page.close()


@pytest.mark.slow
def test_inlined_data_is_escaped(browser, test_images, tmp_path):
    images, _ = test_images
    evil = "</script><script>document.body.dataset.pwned='1'</script><!--"
    data = constructed(images, labels=[evil, "b&<c>"], title=evil)
    html = render_html(data)
    assert "</script><script>document.body" not in html
    page, requests, errors = open_page(browser, write_explorer(data, tmp_path / "esc.html"))
    assert page.evaluate("document.title") == evil
    assert page.evaluate("document.body.dataset.pwned") is None
    assert page.evaluate("document.querySelector('#thumbs canvas').title") == evil
    assert errors == [] and len(requests) == 1
    page.close()


def test_bad_inputs_raise_clear_errors(test_images, tmp_path):
    images, _ = test_images
    with pytest.raises(ValueError, match="uint8"):
        build_data(images.float(), [], None, (8, 8))
    with pytest.raises(ValueError, match="2 images but attention for 1"):
        build_data(images, [[gaussian_layer((8, 8), [(0, 0)])]], None, (8, 8))
    with pytest.raises(ValueError, match=".html"):
        write_explorer(constructed(images), tmp_path / "page.txt")


@pytest.mark.slow
def test_page_from_a_real_checkpoint(browser, cifar_zip, tmp_path):
    """`attnconv explore` on a tiny ViT checkpoint: clicking pixels shows the model's attention."""
    import attnconv
    from attnconv.analysis.explorer import normalize
    from attnconv.analysis.inputs import test_images as load_test_images
    from attnconv.cli import main
    from attnconv.train.checkpoint import save_checkpoint

    torch.manual_seed(0)
    kw = dict(num_classes=10, depth=2, embed_dim=32, num_heads=2)
    model = attnconv.create_model("vit_tiny_cifar", **kw)
    with torch.no_grad():  # sharper attention than the near-uniform initialization
        for blk in model.blocks:
            for p in blk.attn.parameters():
                p.mul_(8.0)
    ck = save_checkpoint(tmp_path / "ck", model, "vit_tiny_cifar", kw)
    page_path = tmp_path / "vit.html"
    argv = ["explore", str(ck), "--data", str(cifar_zip), "--out", str(page_path)]
    assert main(argv + ["--images", "2", "--average", "6"]) == 0
    images, _ = load_test_images(str(cifar_zip), 6)
    x = normalize(images[:2], CIFAR10_MEAN, CIFAR10_STD)  # no data info saved: CIFAR-10's
    with torch.no_grad():
        _, attns = model.eval()(x, return_attention=True)
    page, requests, errors = open_page(browser, page_path)
    before = heads_state(page)
    for row, col in [(3, 3), (30, 20)]:
        click_pixel(page, row, col)
        state = heads_state(page)
        assert state != before
        before = state
        q = 1 + (row // 4) * 8 + col // 4  # token of the pixel, after the class token
        for s in state:
            p = attns[s["layer"]].probs[0, s["head"], q, 1:]  # image 0, keys after the cls token
            r, c = map(int, s["argmax"].split(","))
            assert s["query"] == f"{row // 4},{col // 4}"
            assert s["peak"] == pytest.approx(float(p.max()), rel=1e-4)
            assert float(p[r * 8 + c]) >= float(p.max()) * (1 - 1 / 255)  # the brightest key
    assert errors == [] and requests == [page_path.resolve().as_uri()]
    page.close()
