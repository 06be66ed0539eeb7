"""Issue 24's defects 1-5: what the user asked is what the run does. A resume keeps --keep, the prices
and the execution settings; every exit that can be continued prints one command that works pasted
into a shell (Ctrl-C and the budget stop included); a --model the server does not list stops the run
before any chat request, and a run in which no prompt finished may still change it.

Every run here passes --base_url (the scripted server's), so none needs a network namespace."""

from __future__ import annotations

import json
import re

from test_money import FLAGS
from test_resume import paste
from test_samples import CHECK, ONE_SLOT, SOLVE

from trajforge.cli.config import build_config
from trajforge.cli.flagtext import given

TOOLS = ["--distribution=terminal_only", "--environment=local"]


def test_defect_1_a_resume_keeps_keep_best(run_here, server):
    entries = [{"prompt": f"answer {SOLVE}", "verify": CHECK}, {"prompt": f"second {SOLVE}", "verify": CHECK}]
    first = run_here(entries, *ONE_SLOT, "--n_samples=4", "--keep=best", "--max_samples=1")
    assert first.code == 0, first.stdout + first.stderr
    assert len(first.trajectories) == 1
    resumed = run_here(entries, *ONE_SLOT, "--resume")  # neither --keep nor --n_samples
    assert resumed.code == 0, resumed.stdout + resumed.stderr
    assert len(resumed.batch_lines) == 8 and len(resumed.trajectories) == 2  # the best of each entry
    card = (resumed.run_dir / "README.md").read_text()
    assert re.search(r"keep\W+best", card) and not re.search(r"keep\W+all", card)


def test_defect_2_a_resume_keeps_the_prices(run_here, server):
    server.cost = None  # the endpoint reports no cost: only the prices give one
    entries = [{"prompt": "one [mock turns=0]"}, {"prompt": "two [mock turns=0]"}]
    prices = ["--price_input=1", "--price_output=2"]
    first = run_here(entries, *TOOLS, *prices, "--max_samples=1")
    assert first.code == 0 and first.statistics["cost_known"] is True, first.stdout + first.stderr
    paid = first.statistics["usage"]["cost"]
    resumed = run_here(entries, *TOOLS, "--resume")
    assert resumed.code == 0, resumed.stdout + resumed.stderr
    assert resumed.statistics["cost_known"] is True and resumed.statistics["usage"]["cost"] > paid > 0
    changed = run_here(entries, *TOOLS, "--resume", "--price_input=3", "--price_output=2")  # a price may change
    assert changed.code == 0 and "--price_input: 1.00 -> 3.00" in changed.stderr, changed.stderr
    assert json.loads((changed.run_dir / "run.json").read_text())["price_input"] == 3.0


def test_defect_3_a_resume_keeps_workers_concurrency_and_batch_size(run_here, tmp_path, server):
    entries = [{"prompt": "one [mock turns=0]"}, {"prompt": "two [mock turns=0]"}]
    first = run_here(entries, *TOOLS, "--num_workers=1", "--concurrency=3", "--max_samples=1", batch_size=5)
    assert first.code == 0, first.stdout + first.stderr
    flags = {"dataset_file": "prompts.jsonl", "run_name": "run", "output_dir": str(tmp_path / "out"), "resume": True}
    config = build_config(given(flags | {"base_url": server.base_url, "model": "test-model"}))
    assert (config.num_workers, config.concurrency, config.batch_size) == (1, 3, 5)
    config = build_config(given(flags | {"base_url": server.base_url, "model": "test-model", "concurrency": 4}))
    assert config.concurrency == 4 and config.changes == ("--concurrency: 3 -> 4",)


def test_defect_4_the_budget_stop_prints_a_command_that_continues(run, server):
    server.cost = 0.01
    entries = [{"prompt": f"budgeted task {i}"} for i in range(6)]
    first = run(entries, *FLAGS, "--num_workers=2", "--concurrency=2", "--max_cost=0.1")
    assert first.code == 3, first.stdout + first.stderr
    pasted = paste(first.stdout, run.tmp_path)
    assert pasted.returncode == 0, pasted.stdout + pasted.stderr  # the budget covers the rest: no second stop
    assert "--max_cost: 0.10 -> " in pasted.stderr
    stats = json.loads((first.run_dir / "statistics.json").read_text())
    assert stats["trajectories"] == 6 and stats["budget"]["stopped"] is False


def test_failed_prompts_print_a_command_that_continues(run, server):
    """Ctrl-C's command: test_resume.test_ctrl_c_saves_and_says_how_to_resume."""
    failing = run([{"prompt": "flaky [mock fail=500 times=1 turns=0]"}], *TOOLS, "--max_retries=0")
    assert failing.code == 1, failing.stdout + failing.stderr
    pasted = paste(failing.stdout, run.tmp_path)
    assert pasted.returncode == 0, pasted.stdout + pasted.stderr


def test_defect_5_a_model_the_server_does_not_list_stops_before_any_chat_request(run_here, server):
    server.models = ["test-model-large", "test-model-small", "embedder"]
    entries = [{"prompt": "one [mock turns=0]"}]
    wrong = run_here(entries, *TOOLS)  # --model=test-model
    assert wrong.code == 2, wrong.stdout + wrong.stderr
    assert "--model 'test-model' is not served here" in wrong.stderr and "'test-model-large'" in wrong.stderr
    assert not server.chat_requests()
    # No prompt of the run finished: the resume may name another model.
    fixed = run_here(entries, *TOOLS, "--resume", "--model=test-model-large")
    assert fixed.code == 0, fixed.stdout + fixed.stderr
    assert {r["body"]["model"] for r in server.chat_requests()} == {"test-model-large"}
    assert json.loads((fixed.run_dir / "run.json").read_text())["model"] == "test-model-large"
    # Once one has, the model is the run's.
    refused = run_here(entries, *TOOLS, "--resume", "--model=test-model-small")
    assert refused.code == 2 and "--model: this run" in refused.stderr
