"""The test apiserver's credentials, made with openssl: a service-account key pair, a client CA, the admin
client certificate it signed (CN=admin, O=system:masters) and the static token file."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.k8s.api import ADMIN_TOKEN, READER_TOKEN


def _openssl(*args: str, cwd: Path) -> None:
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {p.stderr.strip()}")


def make_pki(pki: Path) -> None:
    """Write ``sa.key``/``sa.pub``, ``client-ca.crt``/``.key``, ``admin.crt``/``.key`` and ``tokens.csv`` into
    ``pki``, unless an earlier call did (a restarted cluster keeps its credentials)."""
    if (pki / "admin.crt").exists():
        return
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "client-ca.key", "-out", "client-ca.crt", "-days", "3650",
             "-subj", "/CN=waypost-test-client-ca", cwd=pki)
    _openssl("req", *ec, "-keyout", "admin.key", "-out", "admin.csr", "-subj", "/O=system:masters/CN=admin",
             cwd=pki)
    (pki / "client.ext").write_text("extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature\n")
    _openssl("x509", "-req", "-in", "admin.csr", "-CA", "client-ca.crt", "-CAkey", "client-ca.key",
             "-CAcreateserial", "-out", "admin.crt", "-days", "3650", "-extfile", "client.ext", cwd=pki)
    (pki / "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n'
                                    f"{READER_TOKEN},reader,reader\n")


__all__ = ["make_pki"]
