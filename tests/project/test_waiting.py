"""The bounded wait used by every test: returns the first truthy value, or fails saying what was awaited."""

from __future__ import annotations

import itertools

import pytest

from harness.waiting import holds_within, wait_until


def test_returns_the_first_truthy_value():
    counter = itertools.count()
    assert wait_until(lambda: next(counter) >= 3 and "done", 5, interval=0) == "done"


def test_failure_names_what_was_awaited_and_the_last_value():
    with pytest.raises(AssertionError, match=r"^not within 0\.05 s: the backend to leave \(last value: \[\]\)$"):
        wait_until(list, 0.05, "the backend to leave", interval=0.01)


def test_without_a_description_the_lambda_source_is_shown():
    values: list[int] = []
    with pytest.raises(AssertionError) as err:
        wait_until(lambda: len(values) == 2, 0.05, interval=0.01)
    assert "lambda: len(values) == 2" in str(err.value)
    assert "(last value: False)" in str(err.value)


def test_holds_within_is_a_measurement():
    assert holds_within(lambda: True, 0.05)
    assert not holds_within(lambda: 0, 0.05, interval=0.01)
