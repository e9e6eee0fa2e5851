"""The documentation site's equations: `mkdocs build` writes the LaTeX of the pages as MathML
(docs/hooks/mathml.py), and a real headless Chromium draws it with the network cut off: no
script, no CDN. A product written as H*W in prose must not turn into italics."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"  # Debian's package
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
# pages with equations, and one formula each must show (its MathML's text)
PAGES = {"convert": "MHSA", "layers": "softmax"}
LATEX_LEFT = re.compile(r"\$[^$\s][^$]*\$|\\(?:frac|mathbf|sqrt|alpha|Delta|delta|top|sum)\b")
# an <em> opened or closed inside a word: Markdown took the * of a product (Hp*Wp) for italics
EATEN = re.compile(r"[\w)\]]<em>[^<]*</em>|<em>[^<]*</em>[\w{(]")
KNOWN: dict[str, str] = {}  # page -> an <em> allowed there (none now)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site as CI builds it (--strict), into a temporary folder."""
    pytest.importorskip("mkdocs", reason="the docs tools: pip install -e '.[dev]'")
    pytest.importorskip("latex2mathml", reason="the docs tools: pip install -e '.[dev]'")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", out]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def test_every_equation_is_written_as_mathml(site):
    """No page keeps an arithmatex wrapper of raw LaTeX; the equation pages hold <math>."""
    pages = list(site.rglob("*.html"))
    left = [p.relative_to(site) for p in pages if re.search(r'arithmatex">\\[(\[]', p.read_text())]
    assert not left, f"LaTeX not converted to MathML in {left}"
    for name in PAGES:
        html = (site / name / "index.html").read_text()
        assert html.count("<math ") >= 5, name
        assert 'display="block"' in html, name


def test_no_product_is_eaten_as_italics(site):
    """`H*W` in prose or a docstring must reach the page as written (a code span or escaped)."""
    found = {}
    for p in site.rglob("*.html"):
        key = p.relative_to(site).as_posix()
        hits = {h for h in EATEN.findall(p.read_text()) if KNOWN.get(key, "@") not in h}
        if hits:
            found[key] = sorted(hits)
    assert not found, f"a * of a product became <em>: {found}"


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip("no headless browser: install Debian's chromium (.ci/run does)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright's Python package: pip install -e '.[dev]'"
    )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.mark.parametrize("name", sorted(PAGES))
def test_equations_render_offline_in_chromium(site, browser, name):
    """Every <math> of the page is laid out by the browser (a box of nonzero size, a fraction's
    numerator above its denominator) with every request off the page's own files refused, and
    no LaTeX source is left in the text a reader sees."""
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
    page.goto((site / name / "index.html").as_uri())
    boxes = page.evaluate(
        """() => [...document.querySelectorAll('article math')].map(m => {
            const r = m.getBoundingClientRect();
            return {w: r.width, h: r.height, mathml: m instanceof MathMLElement,
                    text: m.textContent};
        })"""
    )
    assert len(boxes) >= 5
    assert all(b["mathml"] and b["w"] > 0 and b["h"] > 0 for b in boxes), boxes
    assert any(PAGES[name] in b["text"] for b in boxes)
    layout = page.evaluate(
        """() => { const pos = sel => { const e = document.querySelector('article ' + sel);
                return e && [...e.children].map(c => c.getBoundingClientRect()); };
            const sub = pos('msub'), frac = pos('mfrac');
            return {sub: sub && [sub[0].top, sub[1].top, sub[0].height, sub[1].height],
                    frac: frac && [frac[0].bottom, frac[1].top]}; }"""
    )
    base_top, script_top, base_h, script_h = layout["sub"]
    assert script_top > base_top and script_h < base_h, layout  # a subscript: lower, smaller
    if name == "layers":  # softmax(QK^T / sqrt(d_k)): the numerator above the denominator
        assert layout["frac"][0] <= layout["frac"][1] + 1, layout
    visible = page.evaluate(
        """() => { const a = document.querySelector('article').cloneNode(true);
            a.querySelectorAll('pre, code, math').forEach(e => e.remove());
            return a.textContent; }"""
    )
    assert not LATEX_LEFT.search(visible), LATEX_LEFT.search(visible)
    page.close()
