"""The one rule for names that become file names, folder names and command words: run ids,
campaign names and their point ids, the testbed's guests and neighbours.

A name is letters, digits, '.', '_', '+' and '-', begins with a letter or a digit (no
leading dot, so neither '.' nor '..'), has no path separator, no space and no shell
character, and is at most MAX_LENGTH characters. '+' is in because a campaign's point ids
join neighbour groups with it (2cpu+1membw).

    check_name("p03-rtds-b77500-r1", "RUN_ID")     # returns it
    check_name("../../etc/x", "RUN_ID")             # BadName, one line naming the rule

Standard library only: it runs on hosts and guests too.
"""

from __future__ import annotations

import re

MAX_LENGTH = 128  # well under a file name's 255 bytes, with room for suffixes (.1, -r3)
PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
RULE = (
    f"letters, digits, '.', '_', '+' and '-', beginning with a letter or a digit, at most "
    f"{MAX_LENGTH} characters"
)


class BadName(ValueError):
    """A name outside the rule."""


def check_name(value: object, what: str) -> str:
    """`value` if it is a name; BadName naming `what` and the rule otherwise."""
    if not isinstance(value, str) or not PATTERN.fullmatch(value):
        raise BadName(f"{what}={value!r} is not a name: {RULE}")
    if len(value) > MAX_LENGTH:
        raise BadName(f"{what} is {len(value)} characters long: a name is {RULE}")
    return value
