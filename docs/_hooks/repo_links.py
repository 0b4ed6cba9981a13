"""mkdocs hook: links from a page to repository files outside docs/ (``../examples/...``).

mkdocs cannot resolve those (they are not pages of the site) and ``--strict`` fails on them. With ``repo_url``
set in mkdocs.yml they become links to the file in the repository; without it, the link text followed by the
path, so a reader still knows where to look.
"""

from __future__ import annotations

import re
from typing import Any

_OUTSIDE = re.compile(r"\[([^\]]+)\]\(\.\./([^)\s]+)\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    repo_url = (config.get("repo_url") or "").rstrip("/")

    def rewrite(match: re.Match[str]) -> str:
        text, path = match.group(1), match.group(2)
        if repo_url:
            return f"[{text}]({repo_url}/blob/HEAD/{path})"
        return text if f"`{path}`" in text or path.rstrip("/") in text else f"{text} (`{path}` in the repository)"

    return _OUTSIDE.sub(rewrite, markdown)
