"""What a new user meets first: the dataset card's snippet, what the docs say of a kill -9."""

from __future__ import annotations

from conftest import ROOT, run_cli

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


def test_a_resume_of_a_mistyped_run_name_names_the_close_runs_and_sends_nothing(run_here, server):
    made = run_here([{"prompt": "ok"}], *FLAGS, run_name="nightly_qwen")
    assert made.code == 0
    sent = len(server.chat_requests())
    # No --batch_size: a resume takes it from run.json, so the old message asked for it, and with it a new run began.
    command = run_here.command([{"prompt": "ok"}], "--resume", run_name="nightly_qwne")[2:]
    for extra in ((), ("--batch_size=2",)):
        code, _, stderr = run_cli([arg for arg in command if not arg.startswith("--batch_size")] + list(extra))
        assert code == 2, stderr
        assert "no run folder" in stderr and "nightly_qwne" in stderr and "--run_name=nightly_qwen" in stderr
        assert not (run_here.tmp_path / "out" / "nightly_qwne").exists()
    assert len(server.chat_requests()) == sent
    # The honest twin: the right name resumes (nothing left: a re-merge, no request).
    assert run_here([{"prompt": "ok"}], "--resume", run_name="nightly_qwen").code == 0
    assert len(server.chat_requests()) == sent
