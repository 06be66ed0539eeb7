"""The money wrapper (money/metered.py) in-process, against the real scripted model's server on
127.0.0.1 and a real money database in tmp_path: the agent's chat calls and the tools' vision and image
calls are answered from the response cache for their sample, paid as soon as each reply comes (a bad
one too, before it is retried), stopped by the budget or an unknown cost before a request is sent,
paced after a 429; and it is the one place in the package that does any of this."""

from __future__ import annotations

import ast
import asyncio
import sqlite3
from pathlib import Path

import pytest

from trajforge.caller import Caller
from trajforge.model.chat import ChatModel
from trajforge.model.settings import ModelSettings
from trajforge.model.tool_model import ToolModel
from trajforge.money.errors import BudgetReached, CostUnknown
from trajforge.money.pricing import Prices
from trajforge.money.spending import MoneySettings, Spending
from trajforge.money.store import FILE_NAME, Store

PACKAGE = Path(__file__).resolve().parents[1] / "trajforge"
# What a call asks of the money database: only the wrapper may ask it.
PER_CALL = {
    "cached",
    "reserve",
    "admit",
    "pay",
    "keep",
    "forget",
    "release",
    "price_later",
    "stop_unknown_cost",
    "slot",
}


def model_settings(server, **changes) -> ModelSettings:
    base = {"model": "test-model", "base_url": server.base_url, "api_key": "k", "max_retries": 2}
    return ModelSettings(**base | changes)


def chat(server, folder: Path, prompts: list[tuple[str, str]], settings=None, heard=None, **limits) -> list:
    """(prompt, scope) after (prompt, scope) through a fresh ChatModel each (a new client, as a resumed
    run has) on the money database in `folder`: each Completion, or the exception it raised; `heard`
    collects the kinds of the attempts that were retried."""

    folder.mkdir(exist_ok=True)

    async def go() -> list:
        spending = Spending(MoneySettings(folder=str(folder), **limits))
        results = []
        try:
            for prompt, scope in prompts:
                model = ChatModel(settings or model_settings(server), spending)
                try:
                    messages = [{"role": "user", "content": prompt}]
                    on_retry = (lambda kind, _: heard.append(kind)) if heard is not None else None
                    results.append(await model.complete(messages, [], Caller(scope, on_retry=on_retry)))
                except (BudgetReached, CostUnknown) as exc:
                    results.append(exc)
                finally:
                    await model.close()
        finally:
            await spending.close()
        return results

    return asyncio.run(go())


def test_a_chat_call_is_paid_once_then_answered_from_the_cache_for_its_own_sample_only(server, tmp_path):
    first, again, other = chat(server, tmp_path, [("hello", "a"), ("hello", "a"), ("hello", "b")])
    assert len(server.chat_requests()) == 2  # the second call of sample a was not sent
    assert again.message == first.message and again.usage == first.usage and again.retries == 0
    assert first.usage["cost"] > 0 and other.usage["cost"] == first.usage["cost"]
    totals = Store(tmp_path).totals()
    assert (totals.paid_calls, totals.hits) == (2, 1)
    assert totals.spent == pytest.approx(2 * first.usage["cost"])
    assert totals.saved == pytest.approx(first.usage["cost"])


def test_the_tools_vision_and_image_calls_go_through_the_same_cache_and_ledger(server, tmp_path):
    image = {"model": "image-test", "prompt": "a red square", "size": "64x64"}

    async def go() -> list:
        spending = Spending(MoneySettings(folder=str(tmp_path)))
        answers = []
        try:
            for _ in range(2):
                tools = ToolModel(model_settings(server), chat_model="vision-test", spending=spending)
                answers.append(await tools.chat([{"role": "user", "content": "what is this?"}], Caller("s")))
                answers.append(await tools.generate_image(image, Caller("s")))
                await tools.close()
        finally:
            await spending.close()
        return answers

    seen, drawn, seen_again, drawn_again = asyncio.run(go())
    paths = [request["path"] for request in server.requests]
    assert paths == ["/v1/chat/completions", "/v1/images/generations"]  # the second round was not sent
    assert server.requests[0]["body"]["model"] == "vision-test"
    assert seen_again == seen and drawn_again == drawn
    assert drawn[0]["data"][0]["b64_json"] and drawn[1]["cost"] > 0 and drawn[1]["completion_tokens"] == 256
    totals = Store(tmp_path).totals()
    assert (totals.paid_calls, totals.hits) == (2, 2)
    assert totals.spent == pytest.approx(seen[1]["cost"] + drawn[1]["cost"])


def test_a_bad_reply_is_paid_before_it_is_retried_and_never_cached(server, tmp_path):
    heard = []
    (completion,) = chat(server, tmp_path, [("[mock upstream_error cost=0.01 times=1] hi", "s")], heard=heard)
    assert completion.retries == 1 and heard == ["bad_reply"] and completion.message["content"]
    totals = Store(tmp_path).totals()
    assert totals.paid_calls == 2  # the failed answer is in the ledger too
    assert totals.spent == pytest.approx(0.01 + completion.usage["cost"])
    (cached,) = sqlite3.connect(tmp_path / FILE_NAME).execute("SELECT count(*) FROM replies").fetchone()
    assert cached == 1


def test_an_unknown_cost_under_a_cost_limit_stops_the_run_before_the_next_request(server, tmp_path):
    results = chat(server, tmp_path, [("[mock no_cost] hi", "a"), ("[mock no_cost] hi", "b")], max_cost=1.0)
    assert [type(result) for result in results] == [CostUnknown, CostUnknown]
    assert len(server.chat_requests()) == 1 and Store(tmp_path).totals().stopped == CostUnknown.reason
    # Without a limit the same reply is kept with its cost unknown (None, never $0); at prices, it is priced.
    (unlimited,) = chat(server, tmp_path / "no_limit", [("[mock no_cost] hi", "a")])
    assert unlimited.usage["cost"] is None
    priced = model_settings(server, prices=Prices(input=1.0, output=2.0))
    (known,) = chat(server, tmp_path / "priced", [("[mock no_cost] hi", "a")], settings=priced, max_cost=1.0)
    assert known.usage["cost"] == pytest.approx(
        (known.usage["prompt_tokens"] * 1.0 + known.usage["completion_tokens"] * 2.0) / 1e6
    )


def test_the_budget_stops_a_call_before_it_is_sent(server, tmp_path):
    prompts = [("[mock cost=0.01] hi", "a"), ("[mock cost=0.01] hi", "b")]
    first, stopped = chat(server, tmp_path, prompts, max_cost=0.015)
    assert first.usage["cost"] == 0.01 and isinstance(stopped, BudgetReached)
    assert len(server.chat_requests()) == 1
    # A call answered from the cache costs nothing: it still comes when the budget is spent.
    (again,) = chat(server, tmp_path, [("[mock cost=0.01] hi", "a")], max_cost=0.015)
    assert again.message == first.message and len(server.chat_requests()) == 1


def test_a_429_is_retried_and_pauses_every_session_of_the_run(server, tmp_path):
    heard = []
    (completion,) = chat(server, tmp_path, [("[mock fail=429 times=1 retry_after=0.2] hi", "s")], heard=heard)
    assert completion.retries == 1 and heard == ["http_429"]
    db = sqlite3.connect(tmp_path / FILE_NAME)
    (pause_until,) = db.execute("SELECT value FROM state WHERE name LIKE 'pause_until:%'").fetchone()
    assert pause_until > 0  # the shared pause other sessions wait for before their next request


def test_token_ids_ride_in_the_request_and_the_reply_and_come_back_from_the_cache(server, tmp_path):
    settings = model_settings(server, token_ids="on")
    first, again = chat(server, tmp_path, [("hello", "a"), ("hello", "a")], settings=settings)
    (request,) = server.chat_requests()
    assert request["body"]["return_token_ids"] is True and request["body"]["logprobs"] is True
    assert first.tokens["prompt_token_ids"] and first.tokens["token_ids"] and first.tokens_missing == ""
    assert again.tokens == first.tokens and first.finish_reason == again.finish_reason == "stop"


def test_without_a_money_database_every_call_goes_to_the_endpoint_priced(server):
    async def go() -> list:
        model = ChatModel(model_settings(server))
        try:
            return [await model.complete([{"role": "user", "content": "hello"}], [], Caller("a")) for _ in range(2)]
        finally:
            await model.close()

    first, second = asyncio.run(go())
    assert len(server.chat_requests()) == 2 and first.usage["cost"] == second.usage["cost"] > 0


def _calls_on_spending(tree: ast.AST) -> list[str]:
    """The per-call methods called on something named `spending` (a name or an attribute)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in PER_CALL:
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "spending") or (
                isinstance(owner, ast.Attribute) and owner.attr == "spending"
            ):
                found.append(node.attr)
    return found


def test_the_wrapper_is_the_one_place_that_asks_the_money_database_about_a_call():
    askers, wrappers, money_imports = {}, {}, []
    for path in PACKAGE.rglob("*.py"):
        name = str(path.relative_to(PACKAGE))
        tree = ast.parse(path.read_text())
        if _calls_on_spending(tree):
            askers[name] = sorted(set(_calls_on_spending(tree)))
        built = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Metered"]
        if built:
            wrappers[name] = len(built)
        if name == "model/client.py":
            money_imports = [
                n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and "money" in (n.module or "")
            ]
    assert list(askers) == ["money/metered.py"], askers
    assert wrappers == {"model/chat.py": 1}  # ChatModel: the agent's calls, and the ToolModel's through it
    assert money_imports == []
