"""The docs site's MkDocs hook (mkdocs.yml: ``hooks``; kept out of the site by ``exclude_docs``).

GitHub's Markdown needs a pipe inside a code span in a table cell escaped (``\\|``) and shows it
as ``|``; Python-Markdown never splits a cell at a pipe inside a code span, so it keeps the
backslash. Tables written for GitHub (README.md's commands table, which ``docs/index.md``
includes) therefore lose that backslash in the rendered page: inside code in table cells only.
"""

from __future__ import annotations

import re

_CELL = re.compile(r"(<t[dh][^>]*>)(.*?)(</t[dh]>)", re.S)
_CODE = re.compile(r"(<code>)([^<]*)(</code>)")


def _code(match: re.Match[str]) -> str:
    return match.group(1) + match.group(2).replace("\\|", "|") + match.group(3)


def _cell(match: re.Match[str]) -> str:
    return match.group(1) + _CODE.sub(_code, match.group(2)) + match.group(3)


def on_page_content(html: str, **kwargs: object) -> str:
    return _CELL.sub(_cell, html)
