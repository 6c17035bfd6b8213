import pytest

from tiering.content.units import format_bytes, parse_fraction, parse_size


@pytest.mark.parametrize("text,expected", [
    ("64GiB", 64 << 30), ("100MB", 100_000_000), ("1.5KiB", 1536), ("4096", 4096), ("10 gb", 10**10),
    (0, 0), (123, 123), ("2TiB", 2 << 40), ("7b", 7),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "GiB", "-5", "1.2.3MB", "64XB", -1, True, None, 3.5, "40%"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_parse_fraction():
    assert parse_fraction("40%") == pytest.approx(0.4)
    assert parse_fraction(0.95) == 0.95
    assert parse_fraction(1) == 1.0
    for bad in ("140%", "x%", -0.1, "0.5", True):
        with pytest.raises(ValueError):
            parse_fraction(bad)


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 << 30) == "3.0 GiB"
