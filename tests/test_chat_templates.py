"""export/openai.jsonl and preferences.jsonl as a trainer takes them: loaded with `datasets` (two runs that
offered different tools, in one load, either order) and rendered, every row, through the published chat
templates of four model families with transformers' own renderer, the way TRL's SFT and DPO trainers call
`tokenizer.apply_chat_template(messages, tools=tools)`. The templates are in tests/fixtures/chat_templates/
(README.md there says where each comes from).

Checked per rendered row: each tool call renders as the object the model wrote (the arguments of
trajectories.jsonl, parsed), each offered tool is listed once (no second listing from a system message),
and what the templates show of reasoning and tool results is there, unicode as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import ROOT, running_here

from trajforge.export.loading import features

transformers_templates = pytest.importorskip("transformers.utils.chat_template_utils")
pytestmark = pytest.mark.xdist_group("test_chat_templates.two_runs")  # made once, on one worker
TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
FAMILIES = {  # family -> (template file, the tokens its template reads)
    "Qwen2.5": ("qwen2_5.jinja", {}),
    "Qwen3": ("qwen3.jinja", {}),
    "Llama 3.1": ("llama3_1.jinja", {"bos_token": "<|begin_of_text|>"}),
    "Hermes 3": ("hermes3.jinja", {"bos_token": "<|begin_of_text|>"}),
}
# How each family writes a call: Qwen and Hermes {"name", "arguments"} in <tool_call> tags, Llama 3.1
# {"name", "parameters"} as the whole assistant turn.
HERMES_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)
LLAMA_CALL = re.compile(r"<\|start_header_id\|>assistant<\|end_header_id\|>\n\n(\{\"name\": .*?)<\|eot_id\|>", re.S)
UNICODE = "héllo 你好 🚀"
COMMAND = "echo%20h%C3%A9llo%20%E4%BD%A0%E5%A5%BD%20%F0%9F%9A%80"  # percent-encoded UNICODE, for the mock
SOLVE = "[mock turns=1 calls=1 alternate command=echo%2042%20>%20answer.txt]"  # passes in even sessions
CHECK = 'test "$(cat answer.txt)" = 42'
EXPORTS = "--export=openai,llamafactory"
# One worker, one slot: a prompt's sessions run in order, so `alternate` passes exactly the even ones.
ONE_SLOT = ["--distribution=terminal_only", "--environment=local", "--num_workers=1", "--concurrency=1"]


def rendered_calls(family: str, text: str) -> list[dict]:
    if family == "Llama 3.1":
        return [{"name": c["name"], "arguments": c["parameters"]} for c in map(json.loads, LLAMA_CALL.findall(text))]
    # The system text's own example call (`{"name": <function-name>, ...}`) is not JSON: not a call.
    return [json.loads(found) for found in HERMES_CALL.findall(text) if "<function-name>" not in found]


def render(family: str, messages: list[dict], tools: list[dict]) -> str:
    name, tokens = FAMILIES[family]
    template = (TEMPLATES / name).read_text()
    texts, _ = transformers_templates.render_jinja_template(
        conversations=[messages], tools=tools, chat_template=template, **tokens
    )
    return texts[0]


def recorded_calls(record: dict) -> list[dict]:
    """Every call of a trajectory as the model wrote it (trajectories.jsonl): its arguments parsed, or
    {"_unparsed": text} when they are not a JSON object (docs/exports.md)."""
    out = []
    for turn in record["conversations"]:
        for call in json.loads(turn["tool_calls"]):
            try:
                arguments = json.loads(call["arguments"])
            except ValueError:
                arguments = None
            written = arguments if isinstance(arguments, dict) else {"_unparsed": call["arguments"]}
            out.append({"name": call["name"], "arguments": written})
    return out


def calls_of(messages: list[dict]) -> list[dict]:
    return [
        {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}
        for message in messages
        for call in message.get("tool_calls") or []
    ]


def listed_once(text: str, tools: list[dict]) -> bool:
    """Each offered tool's description appears once (as written, or JSON-escaped by tojson)."""
    for tool in tools:
        description = tool["function"]["description"]
        forms = {description, json.dumps(description, ensure_ascii=False)[1:-1]}
        if sum(text.count(form) for form in forms) != 1:
            return False
    return "function calling AI model. You are given" not in text  # the record's own system text: absent


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, module_server):
    """Run "tools": multi-turn, parallel calls, broken arguments (a tool error), unicode, reasoning and a
    verified entry (preference pairs); run "web": other tools offered (web ones too), its own pair.
    Every entry but the parallel ones makes one call per turn (`calls=1`), which Llama 3.1 can render.
    Made once for the module, whose tests only read them (pytestmark keeps them on one xdist worker)."""
    with running_here(tmp_path_factory.mktemp("two_runs"), module_server) as run_here:
        return _two_runs(run_here)


def _two_runs(run_here):
    entries = [
        {"prompt": "explore [mock turns=3 calls=1]"},
        {"prompt": "all at once [mock calls=3]"},
        {"prompt": "broken [mock calls=1 bad_json]"},
        {"prompt": f"unicode {UNICODE} [mock turns=2 calls=1 reasoning=think command={COMMAND}]"},
        {"prompt": f"answer {SOLVE}", "verify": CHECK},
    ]
    first = run_here(entries, *ONE_SLOT, "--n_samples=2", EXPORTS, run_name="tools")
    assert first.code == 0, first.stdout + first.stderr
    web = ["--distribution=terminal_web", "--environment=local", "--num_workers=1", "--concurrency=1"]
    entries = [{"prompt": f"web answer {SOLVE}", "verify": CHECK}, {"prompt": "look it up [mock turns=2]"}]
    second = run_here(entries, *web, "--n_samples=2", "--allow_private_urls=True", EXPORTS, run_name="web")
    assert second.code == 0, second.stdout + second.stderr
    return first, second


def test_the_preferences_line_docs_show_has_the_shapes_the_run_writes(two_runs):
    text = (ROOT / "docs" / "verification.md").read_text()
    shown = text[text.index('  {"prompt": [{"role": "user"') :]
    shown = shown[: shown.index("  ```")].replace("{...}", "{}").replace("[...]", "[]")
    documented = json.loads(shown)  # "..." stands for any value
    written = json.loads((two_runs[0].run_dir / "preferences.jsonl").read_text().splitlines()[0])
    assert documented.keys() == written.keys()
    assert isinstance(documented["tools"], list) and documented["tools"][0].keys() == written["tools"][0].keys()
    call = next(m for m in written["chosen"] if m.get("tool_calls"))
    result = next(m for m in written["chosen"] if m["role"] == "tool")
    assert documented["chosen"][0].keys() == call.keys() and documented["chosen"][1].keys() == result.keys()
    for message in (documented["chosen"][0], call):  # a call's arguments are an object, as templates take them
        assert isinstance(message["tool_calls"][0]["function"]["arguments"], dict)


def load(files: list[Path], kind: str, cache: Path):
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    paths = [str(f) for f in files]
    return datasets.load_dataset("json", data_files=paths, split="train", features=features(kind), cache_dir=cache)


def test_both_files_of_two_runs_load_together_in_either_order(two_runs, tmp_path):
    first, second = two_runs
    for kind, name in (("openai", "export/openai.jsonl"), ("preferences", "preferences.jsonl")):
        files = [first.run_dir / name, second.run_dir / name]
        sizes = [len(f.read_text().splitlines()) for f in files]
        for order, cache in ((files, "forward"), (files[::-1], "backward")):
            loaded = load(order, kind, tmp_path / kind / cache)
            assert loaded.num_rows == sum(sizes)
        tools = [{t["function"]["name"] for t in json.loads(f.read_text().splitlines()[0])["tools"]} for f in files]
        assert tools[0] != tools[1]  # the runs offered different tools, so their schemas differ in shape


def conversations(two_runs, tmp_path) -> list[tuple[str, list[dict], list[dict], list[dict]]]:
    """(file, messages, tools, the calls as the model wrote them) for every row of both files of both runs,
    as `datasets` loads them; a preference pair gives two: prompt + chosen and prompt + rejected."""
    openai_files = [run.run_dir / "export" / "openai.jsonl" for run in two_runs]
    records = [record for run in two_runs for record in run.trajectories]
    rows = load(openai_files, "openai", tmp_path / "openai")
    out = []
    for row, record in zip(rows, records, strict=True):
        assert calls_of(row["messages"]) == recorded_calls(record)  # objects as written, before any template
        out.append(("openai.jsonl", row["messages"], row["tools"], recorded_calls(record)))
    answers = [row["messages"][1:] for row in rows]
    pairs = load([run.run_dir / "preferences.jsonl" for run in two_runs], "preferences", tmp_path / "pairs")
    assert pairs.num_rows == 2  # one per run
    for pair in pairs:
        for side in ("chosen", "rejected"):
            assert pair[side] in answers  # shaped as openai.jsonl shapes a trajectory's answer
            out.append(("preferences.jsonl", pair["prompt"] + pair[side], pair["tools"], calls_of(pair[side])))
    return out


def check_rendered(family: str, text: str, messages: list[dict], tools: list[dict], written: list[dict]) -> None:
    assert rendered_calls(family, text) == written  # every call, in order, the object the model wrote
    assert listed_once(text, tools), family
    if family == "Llama 3.1":
        return  # it writes tool results as JSON text and shows no reasoning
    for message in messages:
        if message["role"] == "tool":
            assert message["content"] in text
        if family == "Qwen3" and message["role"] == "assistant" and message["reasoning_content"]:
            assert f"<think>\n{message['reasoning_content'].strip()}\n</think>" in text


def test_every_row_renders_through_four_families_with_calls_as_written(two_runs, tmp_path):
    jinja2 = pytest.importorskip("jinja2")
    table, examples = {}, {}
    every = conversations(two_runs, tmp_path)
    assert any(len(calls_of([m])) >= 3 for _, messages, _, _ in every for m in messages)  # parallel calls
    assert any(c["arguments"].keys() == {"_unparsed"} for *_, written in every for c in written)  # a tool error
    assert any(UNICODE in json.dumps(written, ensure_ascii=False) for *_, written in every)
    for family in FAMILIES:
        for file, messages, tools, written in every:
            counts = table.setdefault((family, file), {"rows": 0, "rendered": 0, "refused": 0})
            counts["rows"] += 1
            parallel = any(len(m.get("tool_calls") or []) > 1 for m in messages)
            if family == "Llama 3.1" and parallel:
                # Its published template allows one call per assistant turn: a limit of the model's format.
                with pytest.raises(jinja2.TemplateError, match="only supports single tool-calls"):
                    render(family, messages, tools)
                counts["refused"] += 1
                continue
            text = render(family, messages, tools)
            check_rendered(family, text, messages, tools, written)
            counts["rendered"] += 1
            if UNICODE in text and family not in examples:
                examples[family] = next(line for line in text.splitlines() if UNICODE in line and "name" in line)
    print("\n| family | file | rows | rendered | refused by the template |\n|---|---|---|---|---|")
    for (family, file), counts in table.items():
        print(f"| {family} | {file} | {counts['rows']} | {counts['rendered']} | {counts['refused']} |")
    for family, line in examples.items():
        print(f"{family}: {line}")
    assert set(examples) == set(FAMILIES)
    assert all(c["rendered"] + c["refused"] == c["rows"] for c in table.values())
    assert all(c["refused"] == 0 for (family, _), c in table.items() if family != "Llama 3.1")


def tokenizer(family: str):
    """A tokenizer that has the family's chat template and no vocabulary to speak of: enough for the
    template paths TRL takes (tokenize=False), without a model download."""
    tokenizers = pytest.importorskip("tokenizers")
    fast = pytest.importorskip("transformers").PreTrainedTokenizerFast
    vocabulary = tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>")
    name, tokens = FAMILIES[family]
    return fast(
        tokenizer_object=tokenizers.Tokenizer(vocabulary), chat_template=(TEMPLATES / name).read_text(), **tokens
    )


def test_trl_takes_preferences_as_a_conversational_preference_dataset(two_runs, tmp_path):
    data_utils = pytest.importorskip("trl.data_utils")
    qwen3 = tokenizer("Qwen3")
    pairs = load([run.run_dir / "preferences.jsonl" for run in two_runs], "preferences", tmp_path / "pairs")
    for pair in pairs:
        assert data_utils.is_conversational(pair)
        # As TRL's DPO trainer calls it: the row's own tools, prompt and prompt + each answer.
        text = data_utils.maybe_apply_chat_template(pair, qwen3, tools=pair["tools"])
        assert text["prompt"].endswith("<|im_start|>assistant\n") and text["prompt"].count("<tools>\n{") == 1
        for side in ("chosen", "rejected"):
            assert rendered_calls("Qwen3", text["prompt"] + text[side]) == calls_of(pair[side])
            assert "<tools>" not in text[side]
    rows = load([run.run_dir / "export" / "openai.jsonl" for run in two_runs], "openai", tmp_path / "openai")
    for row in rows:  # and openai.jsonl as a conversational language-modeling dataset
        assert data_utils.is_conversational(row)
        text = data_utils.maybe_apply_chat_template({"messages": row["messages"]}, qwen3, tools=row["tools"])["text"]
        assert rendered_calls("Qwen3", text) == calls_of(row["messages"])
