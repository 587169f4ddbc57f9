"""The documentation site (mkdocs.yml over docs/) builds with ``mkdocs build --strict``: every page in the nav
exists, every link and the generated reference (the docstrings through mkdocstrings, the command line through
mkdocs-click) resolve, and the search index is built with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mkdocs_missing() -> str | None:
    import importlib.util

    missing = [m for m in ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_click")
               if importlib.util.find_spec(m.split(".")[0]) is None]
    return ", ".join(missing) or None


@pytest.mark.skipif(_mkdocs_missing() is not None,
                    reason=f"the docs tools are not installed ({_mkdocs_missing()}): pip install -e '.[docs]'")
def test_the_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-5000:]
    # the pages a new user starts from, the generated reference, and the offline search index
    for page in ("index.html", "tutorial/index.html", "how-to/index.html", "reference/api/index.html",
                 "reference/cli/index.html", "architecture/index.html"):
        assert (site / page).is_file(), page
    api = (site / "reference/api/index.html").read_text()
    assert 'id="waypost.dial"' in api and "A balanced" in api, "waypost.dial's docstring is not in the reference"
    assert 'id="waypost-etcd"' in (site / "reference/cli/index.html").read_text(), "the CLI reference has no etcd"
    index = json.loads((site / "search/search_index.json").read_text())
    assert any(doc["location"].startswith("tutorial/") for doc in index["docs"])
