"""MkDocs hooks for the documentation site (mkdocs.yml names this file).

- Links from a page to files outside docs/ (``../examples/xds/``) work on GitHub, where the repository is beside
  the page, but not in the site: they become the file's path in the repository, as code, which a reader with a
  clone can open (or a link into the repository when mkdocs.yml sets ``repo_url``).
- Pages written on other branches (``OPTIONAL_PAGES``) are in the nav ahead of time; until they exist they are
  left out of it instead of failing ``mkdocs build --strict``.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

#: nav entries whose pages may not exist yet (docs/ paths); any other missing page still fails the build
OPTIONAL_PAGES = {"observability.md", "compatibility.md"}

_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(((?:\.\./)+[^)\s#]+)(#[^)\s]*)?\)")
_FENCE = re.compile(r"^(```|~~~)")


def _prune(nav: list[Any], docs_dir: Path) -> list[Any]:
    out: list[Any] = []
    for item in nav:
        if isinstance(item, dict):
            (title, value), = item.items()
            if isinstance(value, list):
                out.append({title: _prune(value, docs_dir)})
            elif value in OPTIONAL_PAGES and not (docs_dir / value).is_file():
                continue
            else:
                out.append(item)
        elif isinstance(item, str) and item in OPTIONAL_PAGES and not (docs_dir / item).is_file():
            continue
        else:
            out.append(item)
    return out


def on_config(config: Any) -> Any:
    if config.nav:
        config.nav = _prune(config.nav, Path(config.docs_dir))
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    page_dir = posixpath.dirname(page.file.src_uri)
    repo_url = (config.repo_url or "").rstrip("/")

    def outside(m: re.Match[str]) -> str:
        text, target = m.group(1), m.group(2)
        path = posixpath.normpath(posixpath.join("docs", page_dir, target))
        if not path.startswith("../") and not path.startswith("docs/"):
            if repo_url:
                return f"[{text}]({repo_url}/blob/main/{path})"
            shown = path + ("/" if target.endswith("/") else "")
            return text if f"`{shown}`" in text or shown in text else f"{text} (`{shown}`)"
        return m.group(0)

    out, in_code = [], False
    for line in markdown.split("\n"):
        if _FENCE.match(line.lstrip()):
            in_code = not in_code
        out.append(line if in_code else _LINK.sub(outside, line))
    return "\n".join(out)
