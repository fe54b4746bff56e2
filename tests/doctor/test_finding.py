"""helpers.doctor.finding: a finding keeps only the three statuses."""

import pytest

from helpers.doctor import finding


def test_check_rejects_unknown_status():
    with pytest.raises(ValueError, match="ok"):
        finding.Check("x", "maybe", "m")


def test_ok_has_nothing_to_fix():
    c = finding.ok("python", "3.11.7")
    assert (c.name, c.status, c.message, c.fix) == ("python", "ok", "3.11.7", "")
