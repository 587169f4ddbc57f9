"""docs/eureka.md's development Eureka is the one the tests run: the harness builds examples/eureka-server/ with
the documented command, the page's excerpts are those files verbatim (tests/project/test_docs_structure.py), and
the built server, started as the page says (``java -jar``, ``PORT`` to move it, no other setting), answers and
shows a registration."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from harness import proc_reaper
from harness.waiting import wait_until
from tests.eureka import support
from waypost.etcd.local import free_port

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "eureka.md"


def _documented_commands() -> list[str]:
    """The lines of the ```sh block of the page's "A development Eureka" section, comments cut off."""
    section = PAGE.read_text().split("## A development Eureka", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)\n```", section, re.DOTALL)
    assert block, "docs/eureka.md: no ```sh block in 'A development Eureka'"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]


def test_the_page_builds_and_runs_what_the_harness_builds():
    cd, build, run = _documented_commands()
    assert support.SOURCES["server"] == ROOT / "examples" / "eureka-server"
    assert (ROOT / cd.removeprefix("cd ")) == support.SOURCES["server"]
    assert build.split() == support.BUILD_COMMAND
    final_name = re.search(r"<finalName>(.+?)</finalName>", (support.SOURCES["server"] / "pom.xml").read_text())
    assert final_name and run == f"java -jar target/{final_name.group(1)}.jar"


@support.timeout_mark()
def test_the_development_server_runs_as_documented(tmp_path):
    reason = support.skip_reason()
    if reason:
        pytest.skip(reason)
    jar = support.eureka_jars()["server"]  # examples/eureka-server, built with the page's mvn command
    port = free_port()
    java = support.java_binary()
    assert java is not None
    # the page's `java -jar`, with PORT (what it says to move the port) and the harness's JVM flags (speed only)
    cmd = [java, *support.JVM_FLAGS, f"-XX:SharedArchiveFile={jar.parent / 'app.jsa'}", "-jar", str(jar)]
    with open(tmp_path / "eureka.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, "PORT": str(port)}, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    holder = object()
    proc_reaper.track(holder, lambda: proc_reaper.stop_process(proc, 20))
    server = support.EurekaServer(port=port)  # its REST helpers only: this test started the process
    try:
        started = time.monotonic()
        wait_until(lambda: proc.poll() is not None or server.answers(), support.TEST_TIMEOUT, "GET /eureka/apps")
        assert proc.poll() is None, (tmp_path / "eureka.log").read_text()[-3000:]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/eureka/apps", timeout=5) as resp:
            assert resp.status == 200
        app = support.unique_app("docs")
        assert server.register(app, "i-1", 50051, ttl=30) == 204
        # the page's settings: the read cache shows a registration within about a second, not 30 s
        wait_until(lambda: server.listed(app) == {"i-1": "UP"}, 15, "the registration in GET /apps")
        print(f"FIGURE development Eureka answered {time.monotonic() - started:.1f} s after its start")
    finally:
        proc_reaper.stop_process(proc, 20)
        proc_reaper.untrack(holder)
        server.close()
