"""A --tools file (tests/test_own_tools.py): a plain function, a session function, one that raises, and
what is not a tool (an imported function, a private one)."""

from __future__ import annotations

from os.path import join  # imported: not a tool of this file

PRICES = {"apple": 3, "pear": 5}


def price_of(item: str, quantity: int = 1) -> dict:
    """The price of some items in cents.

    Args:
        item: what to buy (apple or pear)
        quantity: how many
    """
    if item not in PRICES:
        raise KeyError(f"we sell no {item}")
    return {"item": item, "cents": PRICES[item] * quantity}


async def shelf(session, name: str) -> str:
    """What a shelf file of the sample's workspace holds.

    Args:
        name: the shelf's file name
    """
    result = await session.env.exec(f"cat {join('shelves', name)}", timeout=10)
    return result.output.strip()


def _discount(cents: int) -> int:
    return cents // 2
