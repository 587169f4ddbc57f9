"""Mistakes in the program's own configuration are ``waypost.ConfigWarning``s (Python's ``warnings``): shown
without any logging set-up, attributed to the user's line, and errors under ``-W error``."""

from __future__ import annotations

import inspect
import subprocess
import sys
import warnings

import pytest

import waypost

NO_UNAVAILABLE = {"methodConfig": [{"name": [{}], "retryPolicy": {
    "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
    "retryableStatusCodes": ["DATA_LOSS"]}}]}


def test_config_warning_is_a_public_user_warning():
    assert issubclass(waypost.ConfigWarning, UserWarning)
    assert "ConfigWarning" in waypost.__all__


def test_the_warning_points_at_the_users_dial_call(shared_etcd, unique_key):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        ch = waypost.dial(f"etcd:///{shared_etcd.endpoint}?key={unique_key}", service_config=NO_UNAVAILABLE)
    ch.close()
    mine = [w for w in got if issubclass(w.category, waypost.ConfigWarning)]
    assert len(mine) == 1, [str(w.message) for w in got]
    assert "lacks UNAVAILABLE" in str(mine[0].message)
    assert (mine[0].filename, mine[0].lineno) == (__file__, line)


def test_shown_without_logging_configured_and_an_error_under_w_error():
    program = ("import waypost\n"
               f"waypost.parse_service_config({NO_UNAVAILABLE!r})\n")
    shown = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    assert "ConfigWarning: waypost: service config: methodConfig[0].retryPolicy.retryableStatusCodes" in shown.stderr
    failed = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", program], capture_output=True,
                            text=True, timeout=60, check=False)
    assert failed.returncode == 1 and "waypost.errors.ConfigWarning" in failed.stderr, failed.stderr


def test_pytest_warns_catches_it():
    with pytest.warns(waypost.ConfigWarning, match="lacks UNAVAILABLE"):
        waypost.parse_service_config(NO_UNAVAILABLE)
