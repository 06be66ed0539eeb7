"""A page's title and readable text (trafilatura), and, run as a script, the helper process that extracts
them for a worker (tools/extraction.py): pages in on its stdin, texts out on its stdout, one at a time.
It imports nothing of the package, and trafilatura only where it extracts: the worker, which reads the
constants below, never loads it."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import struct
import sys
from typing import BinaryIO

REQUEST = struct.Struct(">II")  # the URL's length, the page's length; then the URL, then the page
ANSWER = struct.Struct(">I")  # the length of the JSON that follows: {"title", "text"} or {"error"}
READY = b"R"  # written once trafilatura is imported: a page's deadline counts from then
PR_SET_PDEATHSIG = 1


def html_text(html: bytes, url: str) -> tuple[str | None, str]:
    """(title, main text) of a page; the whole visible text when no main content is recognised."""
    import trafilatura  # here: the worker, which reads the constants of this module, never loads it

    found = trafilatura.bare_extraction(html, url=url, with_metadata=True, favor_recall=True)
    document = None if isinstance(found, dict) else found  # a Document: no as_dict was asked
    if document is not None and document.text:
        return document.title, document.text
    return (document.title if document is not None else None), trafilatura.html2txt(html)


def _exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    return data if len(data) == size else None  # None: the worker closed the pipe (or is gone)


def serve(parent: int) -> None:
    """Pages from `parent` until it closes the pipe; killed with it (PR_SET_PDEATHSIG) if it dies first."""
    libc = ctypes.CDLL(None, use_errno=True)  # the C library this process has: no ldconfig run to find it
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above
        return
    html_text(b"<html><body><p>ready</p></body></html>", "http://localhost/")  # trafilatura loaded and warm
    pages, answers = sys.stdin.buffer, sys.stdout.buffer
    answers.write(READY)
    answers.flush()
    while (head := _exactly(pages, REQUEST.size)) is not None:
        url_size, html_size = REQUEST.unpack(head)
        url, html = _exactly(pages, url_size), _exactly(pages, html_size)
        if url is None or html is None:
            return
        try:
            title, text = html_text(html, url.decode("utf-8", "surrogateescape"))
            answer = {"title": title, "text": text}
        except Exception as exc:  # a page trafilatura cannot read is that page's error, not the helper's end
            answer = {"error": f"the page's text could not be extracted: {type(exc).__name__}: {exc}"}
        encoded = json.dumps(answer).encode()  # ASCII: any str survives, lone surrogates too
        answers.write(ANSWER.pack(len(encoded)) + encoded)
        answers.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
