"""Dataset loading in-process: every kind of bad line, byte-order marks, blank lines, --max_samples and
the prompt_index numbering (trajforge.run.dataset.load_dataset)."""

from __future__ import annotations

import json

import pytest

from trajforge.errors import UsageError
from trajforge.run.dataset import load_dataset


def dataset(tmp_path, *lines: str, encoding: str = "utf-8"):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding=encoding)
    return path


def problems(path, max_samples: int | None = None) -> str:
    with pytest.raises(UsageError) as raised:
        load_dataset(path, max_samples)
    return str(raised.value)


def test_every_kind_of_bad_line_is_named_and_nothing_loads(tmp_path):
    path = dataset(
        tmp_path,
        '{"prompt": "ok"}',
        "not json",
        "[1, 2]",
        '{"prompt": ""}',
        '{"prompt": "   "}',
        '{"text": "x"}',
        '{"prompt": 5}',
        '{"prompt": "x", "cwd": 5}',
        '{"prompt": "x", "image": ""}',
        '{"prompt": "x", "docker_image": null}',
        '"just a string"',
    )
    message = problems(path)
    assert message.splitlines() == [
        f"--dataset_file: {path} has 10 bad line(s); nothing was sent:",
        "  line 2: not valid JSON (Expecting value at column 1)",
        "  line 3: expected a JSON object, got list",
        '  line 4: needs a non-empty string "prompt"',
        '  line 5: needs a non-empty string "prompt"',
        '  line 6: has no "prompt" field',
        '  line 7: needs a non-empty string "prompt"',
        '  line 8: "cwd" must be a non-empty string',
        '  line 9: "image" must be a non-empty string',
        '  line 10: "docker_image" must be a non-empty string',
        "  line 11: expected a JSON object, got str",
    ]


def test_a_long_list_of_bad_lines_is_cut_after_twenty(tmp_path):
    message = problems(dataset(tmp_path, *["{"] * 25))
    assert "has 25 bad line(s)" in message and "line 20:" in message and "line 21:" not in message
    assert message.endswith("\n  ... and 5 more")


def test_missing_empty_and_non_utf8_files(tmp_path):
    absent = tmp_path / "absent.jsonl"
    assert problems(absent) == f"--dataset_file: {absent} does not exist or is not a file"
    assert problems(tmp_path) == f"--dataset_file: {tmp_path} does not exist or is not a file"
    blank = dataset(tmp_path, "", "  ", "\t")
    assert problems(blank) == f"--dataset_file: {blank} has no prompts"
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    assert problems(latin) == f"--dataset_file: {latin} is not UTF-8 text (invalid continuation byte at byte 32)"


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path):
    entries = load_dataset(dataset(tmp_path, '{"prompt": "first"}', '{"prompt": "second"}', encoding="utf-8-sig"))
    assert [e.data for e in entries] == [{"prompt": "first"}, {"prompt": "second"}]


def test_index_counts_non_blank_lines_and_entries_are_kept_whole(tmp_path):
    source = {"prompt": "Grüße ✓", "id": "t-1", "cwd": "sub", "image": "a:1", "answer": [1, 2]}
    repeated = '{"prompt": "a"}'
    path = dataset(tmp_path, "", repeated, "   ", json.dumps(source, ensure_ascii=False), "", repeated)
    entries = load_dataset(path)
    assert [(e.index, e.data) for e in entries] == [(0, {"prompt": "a"}), (1, source), (2, {"prompt": "a"})]


def test_max_samples_takes_the_first_entries_and_ignores_the_rest(tmp_path):
    path = dataset(tmp_path, *[json.dumps({"prompt": f"p{i}"}) for i in range(5)], "not json after the cut")
    assert [e.data["prompt"] for e in load_dataset(path, 3)] == ["p0", "p1", "p2"]
    assert len(load_dataset(path, 5)) == 5  # the bad line after the first five is never read
    assert "line 6: not valid JSON" in problems(path, 6)


def test_lines_the_record_writer_could_not_save_are_refused(tmp_path):
    nested = json.dumps({"prompt": "x", "extra": json.loads("[" * 300 + "]" * 300)})
    fits = json.dumps({"prompt": "x", "extra": json.loads("[" * 150 + "]" * 150)})
    path = dataset(
        tmp_path,
        '{"prompt": "x", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}",  # beyond json.loads' recursion
        nested,
        '{"prompt": "lone \\udc80 surrogate"}',
        '{"prompt": "x", "n": ' + str(2**64) + "}",
        '{"prompt": "x", "n": ' + str(-(2**63) - 1) + "}",
        fits,
        '{"prompt": "x", "n": ' + str(2**64 - 1) + "}",
    )
    lines = problems(path).splitlines()[1:]
    assert lines[0] == "  line 1: nested deeper than 200 levels: its trajectory could not be saved"
    assert lines[1] == "  line 2: nested deeper than 200 levels: its trajectory could not be saved"
    assert lines[2].startswith("  line 3: cannot be saved in a trajectory (") and "surrogates" in lines[2]
    assert lines[3].startswith("  line 4: cannot be saved in a trajectory (") and "64-bit" in lines[3]
    assert lines[4].startswith("  line 5: cannot be saved in a trajectory (")
    assert len(lines) == 5  # 150 levels and the largest unsigned 64-bit integer are fine


@pytest.mark.parametrize("cwd", ["..", "../../..", "a/../../b", "./../x", "a/b/../../.."])
def test_a_relative_cwd_that_leaves_the_workspace_is_refused(tmp_path, cwd):
    path = dataset(tmp_path, '{"prompt": "ok"}', json.dumps({"prompt": "x", "cwd": cwd}))
    assert problems(path).splitlines()[1:] == [f'  line 2: "cwd" {cwd!r} leaves the workspace']


@pytest.mark.parametrize("cwd", ["project", "a/../b", "./x/y", "/srv/app", "..a"])
def test_a_cwd_inside_the_workspace_or_absolute_loads(tmp_path, cwd):
    entries = load_dataset(dataset(tmp_path, json.dumps({"prompt": "x", "cwd": cwd})))
    assert entries[0].data["cwd"] == cwd
