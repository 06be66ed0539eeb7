"""The images of the task folders a run is about to run, built before any worker starts: once per build
context (an image already tagged with its digest, from an earlier run or invocation, is used as it is),
BUILDS_AT_ONCE at a time (each tag by one build only), with no network, each within its build timeout and
the task's limits; built again when an image its FROM names has changed since (docker_build.py). A failed
build's output goes to builds/<task>.log in the run folder; the task's samples then fail as `setup_failed`
(environments/docker.py reads the log), without a model call."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from rich.markup import escape

from trajforge.environments.folder_task import KEY, FolderSettings, build_log
from trajforge.run.task_folders import as_text, build_context, image_tag
from trajforge.verification.host_folders import task_files

BUILDS_AT_ONCE = 2  # each build has the task's CPUs and memory (docker_build.py): two at once, not one per task


def build_images(
    entries: Iterable[dict], run_dir: str, say: Callable[[str], None], processes: int, at_once: int = BUILDS_AT_ONCE
) -> int:
    """Build what `entries` need and is not on the engine yet, `at_once` builds at a time, each one's RUN
    steps at most `processes` processes at once (--max_processes, 0: no limit) where the runner can bound
    them (build_cgroup.py; else it says so once); returns how many builds failed."""
    wanted: dict[str, dict] = {}
    for entry in entries:
        settings = FolderSettings.of(entry)
        if settings and settings.build:
            wanted.setdefault(entry["docker_image"], entry)
    if not wanted:
        return 0
    from trajforge.environments.build_cgroup import build_cgroup, place
    from trajforge.environments.docker import connect  # the Docker SDK: loaded by runs that build an image only
    from trajforge.environments.docker_build import bases, build, current

    client = connect()
    try:
        # What each was built from, or is to be: the images its FROM lines name, as they are now.
        environments = {tag: _environment(entry) for tag, entry in wanted.items()}
        made_from = {
            tag: bases(client, as_text(files.get("Dockerfile", b""), "replace")) for tag, files in environments.items()
        }
        missing = {tag: entry for tag, entry in wanted.items() if not current(client, tag, made_from[tag])}
        hierarchy, why = place(client) if missing and processes else ("", "")
    finally:
        client.close()
    if why:
        say(f"[yellow]warning:[/] {escape(f'--max_processes not enforced on task images being built: {why}')}")
    numbered = {tag: number for number, tag in enumerate(missing, 1)}

    def make(tag: str) -> bool:
        """Build one image; whether it built (a failure's output is kept in the run folder)."""
        entry = missing[tag]
        task, log = entry[KEY], Path(build_log(run_dir, entry))
        say(f"building the image of task {task['name']} ({numbered[tag]} of {len(missing)})")
        context = build_context(environments[tag])
        absent = [image for image, found in made_from[tag].items() if not found]
        if image_tag(task["name"], context) != tag:
            built, output = False, "environment/ changed since the run loaded it: run again\n"
        elif absent:  # the engine would pull it, from its own network
            built, output = False, f"{', '.join(absent)}: not on the Docker engine, and the runner pulls no image\n"
        else:
            try:
                with build_cgroup(hierarchy, processes) as parent:
                    built, output = build(context, tag, FolderSettings.of(entry), made_from[tag], parent)  # type: ignore[arg-type]
            except OSError as exc:  # not bounded: not built
                built, output = False, f"the build's cgroup (--max_processes) could not be made: {exc}\n"
        if built:
            log.unlink(missing_ok=True)
            return True
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(output, encoding="utf-8")
        say(f"the image of task {task['name']} did not build; its output: {log}")
        return False

    # Different tags at once, each tag taken by one thread: one build per tag. Daemon threads, joined by the
    # main thread: Ctrl-C stops the run at once, as it did a build of its own (its engine build ends with it).
    todo: queue.SimpleQueue[str] = queue.SimpleQueue()
    for tag in missing:
        todo.put(tag)
    built: list[bool] = []
    raised: list[BaseException] = []

    def builder() -> None:
        while not raised:
            try:
                tag = todo.get_nowait()
            except queue.Empty:
                return
            try:
                built.append(make(tag))
            except BaseException as exc:  # the run's, as it was when the builds ran on its thread
                raised.append(exc)

    threads = [
        threading.Thread(target=builder, name="task-image", daemon=True) for _ in range(min(at_once, len(missing)))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if raised:
        raise raised[0]
    return built.count(False)


def _environment(entry: dict) -> dict[str, bytes]:
    """The entry's environment/ as it is now (task_files); empty when it cannot be read (gone, or changed since
    the load: the build says so)."""
    try:
        return task_files(entry[KEY]["folder"], "environment")
    except OSError:
        return {}
