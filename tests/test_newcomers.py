"""What a new user meets first: the dataset card's snippet, what the docs say of a kill -9."""

from __future__ import annotations

from conftest import ROOT

FLAGS = ["--distribution=terminal_only"]


def test_the_cards_load_snippet_imports_what_it_uses(run_here):
    for exports in ((), ("--export=openai",)):
        result = run_here([{"prompt": "ok"}], *FLAGS, *exports, run_name=f"card{len(exports)}")
        card = (result.run_dir / "README.md").read_text()
        snippet = card[card.index("```python") + len("```python") : card.rindex("```")]
        imported = snippet.split("import ", 1)[1].split("#")[0].split("\n")[0]
        body = snippet.split("\n", 2)[2]
        for name in (name.strip() for name in imported.split(",")):
            assert f"{name}(" in body, (name, snippet)


def test_the_docs_say_that_requests_in_flight_at_a_kill_9_are_paid_again():
    text = " ".join((ROOT / "docs" / "resume.md").read_text().split())
    assert "Their model requests that were in flight are paid for again by the resume" in text
