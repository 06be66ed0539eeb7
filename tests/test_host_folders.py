"""A task's host folders stay in their place (trajforge/verification/host_folders.py): a `workspace`, a
directory-valued `tests` and a `cwd` that leave the dataset file's folder (or a --task_root), symlinks
followed, stop the run at load naming the line and the field, with no request sent; a symlink inside a
workspace brings nothing of its target; and a root runner reads a dataset's folders with the rights of the
dataset file's owner, so a file only root may read never reaches a sandbox. Each attack beside an honest twin,
through the real batch_runner.py against the scripted server."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import tool_results, write_dataset
from test_tasks import backend, flags, steer  # noqa: F401  (backend: the fixture, local, bwrap and docker)

from trajforge.cli.repeated import joined
from trajforge.verification.host_folders import HostFolders
from trajforge.verification.tree_reader import Unreadable

MARK = f"HOSTSECRET{secrets.token_hex(6)}"  # in the host's files only: never in a sandbox, a record, a request
NOBODY = 65534


@pytest.fixture
def place(tmp_path) -> Path:
    """data/ (the dataset's folder: repo/ with a real src/ and a symlink up/ to ../.., tests/, a symlink
    etc -> /etc), elsewhere/repo2/ (for --task_root) and secret/ (a 0700 folder, its file 0600)."""
    data = tmp_path / "data"
    (data / "repo" / "src").mkdir(parents=True)
    (data / "repo" / "code.txt").write_text("HONEST-REPO\n")
    (data / "repo" / "up").symlink_to("../..")
    (data / "tests").mkdir()
    (data / "tests" / "check.sh").write_text("grep -q HONEST-REPO code.txt\n")
    (data / "etc").symlink_to("/etc")
    (tmp_path / "elsewhere" / "repo2").mkdir(parents=True)
    (tmp_path / "elsewhere" / "repo2" / "code.txt").write_text("HONEST-ELSEWHERE\n")
    (tmp_path / "decoy").mkdir()
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    (secret / "secret.txt").write_text(MARK + "\n")
    (secret / "secret.txt").chmod(0o600)
    return tmp_path


LOOK = steer("cat code.txt; pwd")


@pytest.mark.parametrize(
    ("field", "fields"),
    [
        ("workspace", {"workspace": "/root"}),
        ("workspace", {"workspace": "../elsewhere/repo2"}),  # climbs out (the honest twin names a --task_root)
        ("workspace", {"workspace": "etc"}),  # a symlink in the dataset's folder, to /etc
        ("workspace", {"workspace": "repo/up/secret"}),  # a symlink of the repository, out of it
        ("tests", {"tests": "/etc"}),
        ("tests", {"tests": "../secret"}),
        ("cwd", {"workspace": "repo", "cwd": "up"}),  # through a symlink of the workspace, out of it
        ("cwd", {"workspace": "repo", "cwd": "src/../../.."}),
    ],
)
def test_a_folder_out_of_its_place_stops_the_run_at_load(place, run_here, server, field, fields):
    dataset = write_dataset(place / "data" / "d.jsonl", [{"prompt": "fine"}, {"prompt": "task " + LOOK, **fields}])
    result = run_here(dataset, *flags("local"))
    assert result.code == 2, result.stdout + result.stderr
    assert f'line 2: "{field}"' in result.stderr and "nothing was sent" in result.stderr, result.stderr
    assert "line 1" not in result.stderr
    assert server.requests == []  # not even the endpoint check: the dataset is refused first
    assert not result.run_dir.exists() or not list(result.run_dir.glob("batch_*.jsonl"))


def test_folders_in_the_dataset_s_folder_or_a_task_root_run(place, run_here, server):
    elsewhere = place / "elsewhere"
    entries = [
        {"prompt": "here " + LOOK, "workspace": "repo"},
        {"prompt": "cwd " + LOOK, "workspace": "repo", "cwd": "src"},  # the workspace lands in the cwd
        {"prompt": "tests " + LOOK, "workspace": "repo", "tests": "tests", "verify": 'sh "$TESTS_DIR/check.sh"'},
        {"prompt": "climbing " + LOOK, "workspace": "../elsewhere/repo2"},
        {"prompt": "absolute " + LOOK, "workspace": str(elsewhere / "repo2")},
    ]
    dataset = write_dataset(place / "data" / "d.jsonl", entries)
    # Repeated, as a user writes it (Fire alone would keep only the last one).
    result = run_here(dataset, *flags("local"), f"--task_root={place / 'decoy'}", f"--task_root={elsewhere}")
    assert result.code == 0, result.stdout + result.stderr
    seen = {json.loads(r["metadata"]["source"])["prompt"].split()[0]: tool_results(r) for r in result.trajectories}
    assert all("HONEST-REPO" in seen[name] for name in ("here", "cwd", "tests")), seen
    assert "/src\\n" in seen["cwd"], seen["cwd"]
    assert "HONEST-ELSEWHERE" in seen["climbing"] and "HONEST-ELSEWHERE" in seen["absolute"]
    (tested,) = (r for r in result.trajectories if r["conversations"][1]["value"].startswith("tests"))
    assert tested["metadata"]["verification"]["passed"] is True


def test_a_task_root_that_loops_is_refused_naming_the_flag(run_here, server, tmp_path):
    """(review 13) Path.resolve raised RuntimeError on a loop of links: a traceback, exit 1. Its twin: a
    --task_root that is a link to a folder is taken."""
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    dataset = write_dataset(tmp_path / "d.jsonl", [{"prompt": "p"}])
    refused = run_here(dataset, "--distribution=terminal_only", f"--task_root={tmp_path / 'a'}")
    assert refused.code == 2 and "--task_root: Symlink loop" in refused.stderr, refused.stderr
    assert server.chat_requests() == []
    taken = run_here(dataset, "--distribution=terminal_only", f"--task_root={tmp_path / 'link'}", run_name="twin")
    assert taken.code == 0, taken.stderr


def test_a_worker_without_the_dataset_file_reads_no_folder(place):
    """A Ray node without the driver's files: the worker starts, and a task's folder is refused, not read."""
    folders = HostFolders.of(place / "data" / "missing.jsonl")
    assert folders.roots == ()
    with pytest.raises(Unreadable, match="outside"):
        folders.read("repo")


def test_a_resume_keeps_the_task_roots_and_a_new_one_may_replace_them(place, run_here, server):
    entries = [{"prompt": "elsewhere " + LOOK, "workspace": "../elsewhere/repo2"}]
    dataset = write_dataset(place / "data" / "d.jsonl", entries)
    first = run_here(dataset, *flags("local"), f"--task_root={place / 'elsewhere'}", "--max_samples=1")
    assert first.code == 0, first.stdout + first.stderr
    write_dataset(dataset, [*entries, {"prompt": "again " + LOOK, "workspace": "../elsewhere/repo2"}])
    again = run_here(dataset, *flags("local"), "--resume")  # run.json's --task_root
    assert again.code == 0, again.stdout + again.stderr
    assert all("HONEST-ELSEWHERE" in tool_results(r) for r in again.trajectories) and len(again.trajectories) == 2
    moved = run_here(dataset, *flags("local"), "--resume", f"--task_root={place / 'decoy'}")  # may change
    assert moved.code == 2 and 'line 1: "workspace"' in moved.stderr, moved.stderr


def test_task_root_comma_separated_or_repeated_is_one_list():
    assert joined(["--task_root=/a", "--x=1", "--task_root", "/b", "--task-root=/c,/d"], ["task_root"]) == [
        "--task_root=/a,/b,/c,/d",
        "--x=1",
    ]
    assert joined(["--x=1", "--", "--task_root=/a"], ["task_root"]) == ["--x=1", "--", "--task_root=/a"]


def test_a_symlink_inside_a_workspace_brings_nothing_of_its_target(backend, place, run_here, server):  # noqa: F811
    repo = place / "data" / "repo"
    (repo / "leak.txt").symlink_to(place / "secret" / "secret.txt")
    (repo / "leakdir").symlink_to(place / "secret")
    (place / "data" / "lone.txt").write_text(MARK)  # in the dataset's folder, but outside the workspace
    (repo / "lone.txt").symlink_to("../lone.txt")
    look = steer("cat code.txt; cat leak.txt leakdir/secret.txt lone.txt; ls -la")
    dataset = write_dataset(place / "data" / "d.jsonl", [{"prompt": "look " + look, "workspace": "repo"}])
    result = run_here(dataset, *flags(backend), timeout=240)
    assert result.code == 0, result.stdout + result.stderr
    (record,) = result.trajectories
    assert "HONEST-REPO" in tool_results(record)  # the workspace's own files came
    assert MARK not in json.dumps(record) and MARK not in json.dumps(server.requests)


# -- the rights of the dataset file's owner --------------------------------------------------------------


def root_only_folder(tmp_path: Path, mark: str) -> Path:
    """tmp_path/secret, a 0700 root folder holding secret.txt, a 0600 root file with `mark`; skips the test
    for a runner that is not root (it reads with its own rights already)."""
    if os.geteuid() != 0:
        pytest.skip("a runner that is not root reads with its own rights already")
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    (secret / "secret.txt").write_text(mark + "\n")
    (secret / "secret.txt").chmod(0o600)
    return secret


@pytest.fixture
def nobody_place(tmp_path):
    """A dataset folder owned by nobody (in a /tmp folder every user can reach), and a 0700 root folder in
    tmp_path holding a 0600 root file with MARK."""
    secret = root_only_folder(tmp_path, MARK)
    (secret / "ws").mkdir(mode=0o755)
    (secret / "ws" / "code.txt").write_text("IN-A-ROOT-FOLDER\n")
    data = Path(tempfile.mkdtemp(prefix="nobody-dataset-", dir="/tmp"))
    try:
        data.chmod(0o755)
        for name, content in (("honest", "HONEST-NOBODY\n"), ("linked", "LINKED-CODE\n"), ("tests", "true\n")):
            (data / name).mkdir()
            (data / name / "code.txt").write_text(content)
        # What its owner could not make (fs.protected_hardlinks), made here by root: the dataset's own folder
        # holds a hard link to a file only root may read.
        os.link(secret / "secret.txt", data / "linked" / "hard.txt")
        os.link(secret / "secret.txt", data / "tests" / "hard.txt")
        (data / "linked" / "soft.txt").symlink_to(secret / "secret.txt")
        for path in [data, *data.rglob("*")]:
            if not (path.name == "hard.txt" or path.is_symlink()):
                os.chown(path, NOBODY, NOBODY)
        yield data, secret
    finally:
        shutil.rmtree(data)


def nobody_dataset(data: Path, entries: list[dict]) -> Path:
    dataset = write_dataset(data / "d.jsonl", entries)
    os.chown(dataset, NOBODY, NOBODY)
    return dataset


def test_a_root_runner_reads_a_dataset_s_folders_with_its_owner_s_rights(nobody_place, run_here, server):
    data, secret = nobody_place
    verify = 'sh "$TESTS_DIR/code.txt" && cat "$TESTS_DIR"/*.txt'
    attack = [
        {"prompt": "honest " + LOOK, "workspace": "honest"},
        {"prompt": "linked " + steer("cat code.txt hard.txt soft.txt"), "workspace": "linked"},
        {"prompt": "rootfolder " + LOOK, "workspace": str(secret / "ws")},
        {"prompt": "hidden " + LOOK, "workspace": "honest", "tests": "tests", "verify": verify},
    ]
    result = run_here(nobody_dataset(data, attack), *flags("bwrap"), f"--task_root={secret}")
    assert result.code == 2, result.stdout + result.stderr
    said = result.stderr
    for line, field in ((2, "workspace"), (3, "workspace"), (4, "tests")):
        assert f'line {line}: "{field}"' in said, said
    assert said.count("Permission denied") == 3 and "uid 65534" in said and "line 1" not in said, said
    assert server.requests == [] and MARK not in result.stdout + said

    check = 'grep -q HONEST-NOBODY "$TESTS_DIR/code.txt"'
    honest = [attack[0], {**attack[3], "tests": "honest", "verify": check}]  # a tests folder its owner can read
    result = run_here(nobody_dataset(data, honest), *flags("bwrap"), run_name="honest")
    assert result.code == 0, result.stdout + result.stderr
    seen = [tool_results(record) for record in result.trajectories]
    assert len(seen) == 2 and all("HONEST-NOBODY" in text for text in seen)  # read by the helper, as nobody
    assert all(
        r["metadata"]["verification"]["passed"] for r in result.trajectories if "hidden" in r["metadata"]["source"]
    )


def test_the_copy_itself_reads_with_the_owner_s_rights(nobody_place):
    """A folder that became unreadable after the load (or a race) is still read as the owner at the copy."""
    data, secret = nobody_place
    folders = HostFolders.of(nobody_dataset(data, [{"prompt": "p"}]), [secret])
    assert folders.owner is not None and folders.owner.uid == NOBODY
    assert folders.read("honest") == {"code.txt": b"HONEST-NOBODY\n"}
    for folder in ("linked", str(secret / "ws")):
        with pytest.raises(Unreadable, match=r"Permission denied.*uid 65534"):
            folders.read(folder)
    assert HostFolders.of(secret / "secret.txt", [data]).read(str(data / "linked")).keys() == {"code.txt", "hard.txt"}
