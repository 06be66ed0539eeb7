"""Statistics over lists of numbers."""


def median(values: list[float]) -> float:
    """The middle value of `values`; for an even count, the mean of the two middle ones."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
