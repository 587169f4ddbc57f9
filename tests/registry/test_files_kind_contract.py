"""The kind contract suite (``kind_contract.py``) run for the example plug-in kind ``files://``
(examples/registry_plugin): a registry that is a directory."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import waypost
from waypost import kind_table as kinds

from .kind_contract import KindContract

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "registry_plugin"))
try:
    import waypost_files
finally:
    sys.path.pop(0)


class TestFilesKind(KindContract):
    kind = waypost_files.KIND

    @pytest.fixture(autouse=True)
    def _root(self, tmp_path: Path) -> Iterator[None]:
        kinds.load_plugins()
        saved = dict(kinds.KINDS), dict(kinds.SCHEMES)
        waypost.register_kind(self.kind, replace=True)
        self.root = tmp_path / "registry"
        yield
        with kinds._lock:
            kinds.KINDS.clear()
            kinds.KINDS.update(saved[0])
            kinds.SCHEMES.clear()
            kinds.SCHEMES.update(saved[1])

    def registry_url(self) -> str:
        return f"files://{self.root}"

    def target(self, service: str) -> str:
        return f"files://{self.root}/{service}?interval=0.1s"

    def unreachable_url(self) -> tuple[str, str]:
        blocker = self.root.parent / "not-a-directory"
        blocker.write_text("")
        return f"files://{blocker}/registry", "Not a directory"

    def delete_instance(self, service: str, address: str) -> None:
        (self.root / service / f"{address.replace(':', '_')}.json").unlink()

    @contextlib.contextmanager
    def registry_down(self) -> Iterator[None]:
        """The directory replaced by a file: every read fails (``NotADirectoryError``)."""
        moved = self.root.with_name("registry.away")
        self.root.rename(moved)
        self.root.write_text("")
        try:
            yield
        finally:
            self.root.unlink()
            moved.rename(self.root)
