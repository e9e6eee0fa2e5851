"""The explorer page built by the CLI from a dataset whose class names are hostile HTML (issue 8:
"the explorer page: data escaped, no network requests, opens from disk").

Real CIFAR-10 images in a folder dataset whose class folders are named like markup; the page
written by ``attnconv explore`` must keep the template's two <script> elements only, carry the
names only in escaped form, give them back exactly when its JSON is parsed (as the page's own
script does), and reference nothing outside the file. The browser-side checks of the same page
(no request but the file itself, an injected </script> not executed) are tests/test_explorer.py.
"""

from __future__ import annotations

import json
import re
import zipfile

import torch

from attnconv.cli import main
from attnconv.models import create_model
from attnconv.train.checkpoint import save_checkpoint

# a folder name cannot hold "/", so no "</script>" here; render_html's own test covers that one
HOSTILE = "<img src=x onerror=alert(1)>&amp;\"'<!--"


def test_cli_page_escapes_hostile_class_names_and_stays_offline(cifar_zip, tmp_path, capsys):
    root = tmp_path / "data"
    with zipfile.ZipFile(cifar_zip) as z:
        for split in ("train", "test"):
            for cls, src in ((HOSTILE, "cat"), ("ship", "ship")):
                d = root / split / cls
                d.mkdir(parents=True)
                for i in range(2):
                    (d / f"{i}.jpg").write_bytes(z.read(f"{split}/{src}/{i:04d}.jpg"))
    torch.manual_seed(0)
    kw = {"num_classes": 2, "depth": 2}
    ckpt = save_checkpoint(
        tmp_path / "ckpt", create_model("vit_tiny_cifar", **kw), "vit_tiny_cifar", kw
    )
    page = tmp_path / "page.html"
    argv = [
        "explore",
        str(ckpt),
        "--data",
        str(root),
        "--out",
        str(page),
        "--images",
        "4",
        "--average",
        "4",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    html = page.read_text()

    assert HOSTILE not in html  # only its escaped form (\u003c ...) is in the file
    assert html.count("<script") == 2 and html.count("</script>") == 2  # the template's own
    assert "<img" not in html and "<!--" not in html.split("<body", 1)[1]
    blob = re.search(
        r'<script type="application/json" id="explorer-data">(.*?)</script>', html, re.S
    ).group(1)
    data = json.loads(blob)  # what the page's JSON.parse(textContent) sees
    labels = {img["label"] for img in data["images"]}
    assert labels == {HOSTILE, "ship"}
    # opens from disk: nothing is fetched from anywhere (no URL in src/href, no fetch/XHR)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html, re.I)
    assert "fetch(" not in html and "XMLHttpRequest" not in html
