"""The id blocks' constants agree: every id of the largest domain number's block is below 2**53."""

from apps_registry.models import DOMAIN_NUMBER_MAX, MESSAGE_ID_BLOCK_BITS, MESSAGE_ID_BLOCK_SIZE


def test_the_largest_domain_numbers_block_ends_below_two_to_the_53():
    assert MESSAGE_ID_BLOCK_SIZE == 2**MESSAGE_ID_BLOCK_BITS
    assert (DOMAIN_NUMBER_MAX + 1) * MESSAGE_ID_BLOCK_SIZE == 2**53
