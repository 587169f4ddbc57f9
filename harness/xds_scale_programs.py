"""The Go programs of ``bench/xds_scale`` (the ADS load client ``ads-load`` and a go-control-plane server
``gcp-server``): one definition for the benchmark (bench/xds_scale.py) and the tests that drive a fleet
(tests/xds/test_xds_replicas.py), so both build them once into the same cache."""

from __future__ import annotations

from pathlib import Path

from harness.go_module import GoModule

XDS_SCALE_PROGRAMS = GoModule(Path(__file__).resolve().parent.parent / "bench" / "xds_scale",
                              ("ads-load", "gcp-server"), "bench-xds-scale")
