"""The test harness's own etcd (waypost.etcd.local.LocalEtcd): a port taken between picking and binding."""

from __future__ import annotations

import socket

from waypost.etcd import local


def test_a_port_taken_before_etcd_binds_it_is_replaced(monkeypatch):
    """free_port() only saw the port free: another process may take it before etcd binds. The first start of
    a cluster with picked ports then starts again on other ports, instead of failing the test that needed it."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    taken = busy.getsockname()[1]
    picks = iter([taken])
    real = local.free_port
    monkeypatch.setattr(local, "free_port", lambda host="127.0.0.1": next(picks, None) or real(host))
    etcd = local.LocalEtcd()
    try:
        assert etcd.members[0].client_port == taken
        etcd.start()
        assert etcd.members[0].client_port != taken
        assert etcd.etcdctl("put", "k", "v").strip() == "OK"
    finally:
        etcd.close()
        busy.close()
