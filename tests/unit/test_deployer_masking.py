"""Which parts of a worker's line `runyard.deployer.masking` replaces (pure)."""

from __future__ import annotations

from runyard.deployer.masking import MASK, masker


def test_every_value_is_masked_the_longest_first_and_short_ones_are_left() -> None:
    mask = masker(["abc", "s3cr3t", "s3cr3t-and-more", "a.b*c(d"])
    assert mask is not None
    line = "key=s3cr3t-and-more other=s3cr3t re=a.b*c(d short=abc axbxc(d"
    assert mask(line) == f"key={MASK} other={MASK} re={MASK} short=abc axbxc(d"


def test_no_value_long_enough_is_no_mask() -> None:
    assert masker([]) is None
    assert masker(["abc", ""]) is None
