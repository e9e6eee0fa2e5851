"""MkDocs hook: the site's equations as MathML, made at build time (no script, no network).

`pymdownx.arithmatex` (``generic: true``, mkdocs.yml) finds the LaTeX of the pages and of the
docstrings, ``$...$`` inline and ``$$...$$`` as a block, and leaves it wrapped as
``<span class="arithmatex">\\(...\\)</span>`` and ``<div class="arithmatex">\\[...\\]</div>``.
This hook replaces each with the MathML `latex2mathml` writes, which the browser draws itself.
A formula that does not convert stops the build, naming the page, rather than leaving raw LaTeX.
"""

from __future__ import annotations

import html
import re

from latex2mathml.converter import convert

INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
BLOCK = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.S)
LEFT_OVER = re.compile(r">([^<]*(?:\\|&(?!#?\w+;))[^<]*)<")
WORD_OPERATOR = re.compile(r"<mo>([A-Za-z]{2,})</mo>")  # \operatorname{softmax}, \min


def to_mathml(latex: str, display: str) -> str:
    """The MathML of one formula, as it stands in the page's HTML (HTML-escaped LaTeX)."""
    source = html.unescape(latex).strip()
    mathml = convert(source, display=display)
    left = LEFT_OVER.search(mathml)  # a command it does not know stays as text: \foo, &
    if left:
        raise ValueError(f"latex2mathml leaves {left[1]!r} of {source!r} as text")
    # a named operator as an identifier: upright, without the spacing of a binary operator
    return WORD_OPERATOR.sub(r"<mi>\1</mi>", mathml)


def on_page_content(content: str, page, **kwargs) -> str:
    def block(m: re.Match) -> str:
        return f'<div class="arithmatex">{to_mathml(m[1], "block")}</div>'

    def inline(m: re.Match) -> str:
        return f'<span class="arithmatex">{to_mathml(m[1], "inline")}</span>'

    try:
        return INLINE.sub(inline, BLOCK.sub(block, content))
    except Exception as e:
        raise ValueError(f"{page.file.src_uri}: an equation did not convert to MathML: {e}") from e
