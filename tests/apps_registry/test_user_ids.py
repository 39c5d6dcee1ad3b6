"""One user, one id: the user-id, range and name rules, each defined once."""

from __future__ import annotations

import pytest

from apps_registry.models import UserRange
from apps_registry.selectors import UserId, user_id_parse
from foundation.names import domain_name_valid


@pytest.mark.parametrize("text, parsed", [
    ("ANZ-123223", UserId("ANZ", 123223)),
    ("ANZ-0", UserId("ANZ", 0)),
    ("a.b_c-999999999999999999", UserId("a.b_c", 999999999999999999)),
    ("ANZ-0123223", None),  # a leading zero would make a second id for user 123223
    ("ANZ-١٢٣٢٢٣", None),  # Arabic-Indic digits
    ("ANZ-１２３", None),  # full-width digits
    ("ANZ-5\n", None),
    ("ANZ-5 ", None),
    (" ANZ-5", None),
    ("ANZ-", None),
    ("ANZ-1234567890123456789", None),  # beyond a bigint
    ("-5", None),
    (None, None),
])
def test_a_user_id_is_an_app_name_a_dash_and_plain_ascii_digits(text, parsed):
    assert user_id_parse(text) == parsed


@pytest.mark.parametrize("a, b, overlap", [
    ((0, 10), (10, 20), True), ((0, 10), (11, 20), False), ((5, None), (100, 200), True),
    ((5, None), (0, 4), False), ((0, None), (7, None), True), ((3, 3), (3, 3), True),
])
def test_two_user_ranges_overlap_when_each_starts_before_the_other_ends(a, b, overlap):
    assert UserRange(*a).overlaps(UserRange(*b)) is overlap
    assert UserRange(*b).overlaps(UserRange(*a)) is overlap


def test_containment_is_overlap_with_a_single_user():
    assert UserRange(10, 20).contains(10) and UserRange(10, 20).contains(20)
    assert not UserRange(10, 20).contains(21) and UserRange(10, None).contains(10**17)


@pytest.mark.parametrize("name, ok", [("domain-01", True), ("a", True), ("-x", False), ("domain-01\n", False),
                                      ("d" * 65, False), ("dömain", False)])
def test_domain_names(name, ok):
    assert domain_name_valid(name) is ok
