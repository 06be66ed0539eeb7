"""Amounts of money kept as whole cents."""


def cents_to_text(cents: int) -> str:
    """1234 -> "12.34", 1205 -> "12.05", 7 -> "0.07"."""
    return f"{cents // 100}.{cents % 100}"
