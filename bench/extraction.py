"""What web_extract's text extraction costs per honest page: in a thread of the worker, as before
(trafilatura in-process), against the worker's extraction helper process (tools/extraction.py), which a
hostile page's deadline can kill.

    PYTHONPATH=. python bench/extraction.py --repeats 20

Pages: a short article, a 60 KB page of 800 paragraphs, a 2 MB page (web_extract's cap). Each figure is
a median in ms per page, wall time as the tool waits for it and CPU time (the worker's and the helper's
together); the helper's start (once per worker, trafilatura's import) is given apart. Then a page of
one table row of 20,000 cells: how long the tool waits with a 2 s deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from trajforge.tools.extraction import Extractor
from trajforge.tools.page_text import html_text

TICKS = 100  # clock ticks per second in /proc/PID/stat (USER_HZ)
ARTICLE = (
    b"<html><head><title>Tide pools</title></head><body><nav>Home | About</nav><article><h1>Tide pools</h1>"
    + b"<p>Anemones, sea stars and small crabs live there and survive the changes of the tides.</p>" * 6
    + b"</article><footer>Copyright</footer></body></html>"
)
PAGES = {
    "article (0.6 KB)": ARTICLE,
    "800 paragraphs (60 KB)": b"<html><body>"
    + b"".join(b"<p>Paragraph %d: the quick brown fox jumps over the lazy dog.</p>" % i for i in range(800))
    + b"</body></html>",
    "2 MB of paragraphs": (
        b"<html><body>"
        + b"".join(b"<p>Paragraph %d: the quick brown fox jumps over the lazy dog.</p>" % i for i in range(30_000))
    )[:2_000_000],
}
WIDE_ROW = b"<html><body><table><tr>" + b"<td>a</td>" * 20_000 + b"</tr></table></body></html>"


def helper_cpu(extractor: Extractor) -> float:
    """CPU seconds of the extractor's idle helpers so far."""
    total = 0
    for helper in extractor._idle:
        with open(f"/proc/{helper.process.pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


async def timed(extract, html: bytes, repeats: int, cpu=lambda: 0.0) -> tuple[float, float]:
    """Median wall seconds per page, and CPU seconds per page (this process's and `cpu()`'s)."""
    walls = []
    cpu_before, own_before = cpu(), time.process_time()
    for _ in range(repeats):
        started = time.perf_counter()
        await extract(html)
        walls.append(time.perf_counter() - started)
    return statistics.median(walls), (cpu() - cpu_before + time.process_time() - own_before) / repeats


async def main(repeats: int) -> None:
    url = "https://example.org/page"
    extractor = Extractor(helpers=1)
    started = time.perf_counter()
    await extractor.text(ARTICLE, url, 60)
    print(f"the helper's start (once per worker): {1000 * (time.perf_counter() - started):.0f} ms")
    for name, html in PAGES.items():
        assert await extractor.text(html, url, 60) == html_text(html, url)  # the same text as before
        before = await timed(lambda page: asyncio.to_thread(html_text, page, url), html, repeats)
        after = await timed(lambda page: extractor.text(page, url, 60), html, repeats, lambda: helper_cpu(extractor))
        print(
            f"{name:24} wall {1000 * before[0]:7.1f} -> {1000 * after[0]:7.1f} ms (x{after[0] / before[0]:.2f}), "
            f"CPU {1000 * before[1]:7.1f} -> {1000 * after[1]:7.1f} ms (x{after[1] / before[1]:.2f})"
        )
    started = time.perf_counter()
    try:
        await extractor.text(WIDE_ROW, url, 2.0)
    except Exception as exc:
        print(
            f"one table row of 20,000 cells (200 KB), deadline 2 s: {type(exc).__name__} after "
            f"{time.perf_counter() - started:.2f} s (trafilatura alone: ~10 s; ~40 min at 2 MB)"
        )
    await extractor.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    asyncio.run(main(parser.parse_args().repeats))
