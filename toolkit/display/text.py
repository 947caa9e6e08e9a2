"""Short texts for notebooks: a small, safe subset of markdown as HTML or plain text, a note, and
an HTML block that prints as text.

Sample descriptions and notes come from the program's author: everything is escaped before any
markup is applied, so no tag of the text reaches the page, and MathJax is off.
"""

from __future__ import annotations

import html
import re


def note_html(text: str) -> str:
    """A paragraph of (already escaped) text in italics, MathJax off like the tables."""
    return f'<p class="tex2jax_ignore mathjax_ignore"><i>{text}</i></p>'


class Html:
    """An HTML block for a notebook (``_repr_html_``), plain text for ``repr``."""

    def __init__(self, html_text: str, text: str):
        self.html, self.text = html_text, text

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


_MD_CODE = re.compile(r"`([^`]+)`")
_MD_BOLD = re.compile(r"\*\*([^*]+)\*\*")
_MD_EM = re.compile(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])")


def markdown_html(text: str) -> str:
    """A small, safe subset of markdown as HTML: paragraphs (blank lines), ``code``,
    **bold** and *emphasis*; everything escaped first, so no tag of the text survives and
    no raw markdown is shown.  For sample descriptions and other short notes."""
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    out = []
    for p in paragraphs:
        pieces = []
        for k, piece in enumerate(_MD_CODE.split(p)):  # odd pieces: code spans, taken literally
            h = html.escape(piece, quote=True)
            if k % 2:
                pieces.append(f"<code>{h}</code>")
            else:
                h = _MD_BOLD.sub(lambda m: f"<b>{m.group(1)}</b>", h)
                pieces.append(_MD_EM.sub(lambda m: f"<i>{m.group(1)}</i>", h))
        out.append(f'<p class="tex2jax_ignore mathjax_ignore">{"".join(pieces)}</p>')
    return "".join(out)


def markdown_text(text: str) -> str:
    """The same subset as plain text: the markup removed, whitespace collapsed."""
    pieces = _MD_CODE.split(" ".join(text.split()))
    return "".join(
        piece if k % 2 else _MD_EM.sub(lambda m: m.group(1), _MD_BOLD.sub(lambda m: m.group(1), piece))
        for k, piece in enumerate(pieces)
    )
