"""vision_analyze and image_generate against the scripted OpenAI-compatible server; execute_code in the
prompt's environment; images moved through a container's environment too."""

from __future__ import annotations

import asyncio
import base64
import re
import struct
import time
from pathlib import Path

from tool_session import call, tool_session

from trajforge.environments import EnvironmentSettings
from trajforge.mock.model import solid_png
from trajforge.tools.transfer import read_bytes

ALPHA = "batch-runner-test/alpha:1"  # busybox only: base64, but no python


def in_session(scenario, **settings):
    async def go():
        async with tool_session(**settings) as session:
            return await scenario(session)

    return asyncio.run(go())


def test_vision_sends_a_url_as_it_is_and_counts_its_tokens(server):
    async def scenario(session):
        result = await call(session, "vision_analyze", image_url="http://127.0.0.1:1/cat.png", question="A cat?")
        return result, dict(session.usage)

    blocked, usage = in_session(scenario, model_url=server.base_url)  # the model's server would fetch it for us
    assert blocked == {"error": "blocked: 127.0.0.1 is a loopback address"} and not server.requests
    result, usage = in_session(scenario, model_url=server.base_url, allow_private_urls=True)
    assert result == {
        "image": "http://127.0.0.1:1/cat.png",
        "analysis": "(mock vision) To 'A cat? ': the image at http://127.0.0.1:1/cat.png shows one flat colour, "
        "without text or objects.",
    }
    (request,) = server.chat_requests()
    body = request["body"]
    assert body["model"] == "vision-test" and "tools" not in body and not body.get("stream")
    image_part = {"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/cat.png"}}
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "A cat?"}, image_part]}]
    assert usage["prompt_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_vision_sends_a_workspace_image_as_a_data_url(server):
    png = solid_png(3, 2, b"\x01\x02\x03")

    async def scenario(session):
        await session.env.write_file("pics/dot.png", png)
        await session.env.write_file("notes.txt", "not an image")
        return [
            await call(session, "vision_analyze", image_url=path) for path in ("pics/dot.png", "notes.txt", "nope.png")
        ]

    found, not_image, missing = in_session(scenario, model_url=server.base_url)
    assert "the image/png image (" in found["analysis"]
    (request,) = server.chat_requests()  # only the real image reached the model
    sent = request["body"]["messages"][0]["content"][1]["image_url"]["url"]
    assert sent == "data:image/png;base64," + base64.b64encode(png).decode()
    assert not_image == {"error": "ValueError: notes.txt is not a PNG, JPEG, GIF or WEBP image"}
    assert missing["error"].startswith("FileNotFoundError: cannot read nope.png")


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return struct.unpack(">II", data[16:24])


def test_image_generate_saves_the_image_in_the_workspace(server):
    async def scenario(session):
        result = await call(session, "image_generate", prompt="A red boat!", size="256x128")
        saved = await read_bytes(session.env, result["path"], 10**6)
        listing = await session.env.exec("ls -a . images")
        return result, saved, listing.output, dict(session.usage)

    result, saved, listing, usage = in_session(scenario, model_url=server.base_url)
    assert re.fullmatch(r"images/a-red-boat-[0-9a-f]{6}\.png", result["path"])
    assert (result["url"], result["bytes"], result["revised_prompt"]) == (None, len(saved), "A red boat!")
    assert png_size(saved) == (256, 128)
    assert ".transfer" not in listing  # the base64 go-between is gone
    (request,) = [r for r in server.requests if r["path"] == "/v1/images/generations"]
    assert request["body"] == {"model": "image-test", "prompt": "A red boat!", "size": "256x128", "n": 1}
    # The images API reports input/output tokens; they count as the prompt's prompt/completion tokens.
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (3, 256, 259)


def test_image_generate_downloads_an_image_given_as_a_url(server):
    async def scenario(session):
        result = await call(session, "image_generate", prompt="a kite [mock image=url]")
        return result, await read_bytes(session.env, result["path"], 10**6)

    result, saved = in_session(scenario, model_url=server.base_url, allow_private_urls=True)  # served on 127.0.0.1
    assert result["url"] == f"http://127.0.0.1:{server.port}/_mock/image.png"
    assert saved == solid_png(64, 64, b"\x3c\x8c\xc8")


def test_image_generate_reports_bad_sizes_and_endpoint_failures(server):
    async def scenario(session):
        return await call(session, "image_generate", prompt="x", size="big")

    assert in_session(scenario, model_url=server.base_url) == {"error": "size must look like 1024x1024, got 'big'"}
    refused = in_session(lambda session: call(session, "image_generate", prompt="x"))  # nothing listens there
    assert refused["error"].startswith("ModelCallFailed: ")  # a tool error, not a crash of the prompt


def test_execute_code_returns_stdout_stderr_and_the_exit_code():
    code = "\n".join(
        ["import sys", "print('to stdout')", "print('to stderr', file=sys.stderr)", "open('made.txt', 'w').write('x')"]
    )
    code += "\nsys.exit(3)"

    async def scenario(session):
        result = await call(session, "execute_code", code=code)
        broken = await call(session, "execute_code", code="def broken(:\n")
        listing = await session.env.exec("ls -a")
        return result, broken, listing.output.split()

    result, broken, listing = in_session(scenario)
    assert result == {"stdout": "to stdout\n", "stderr": "to stderr\n", "exit_code": 3}
    assert broken["exit_code"] == 1 and "SyntaxError" in broken["stderr"] and "error" not in broken
    # its files stay; ours are gone (.tmp is the workspace's TMPDIR, there before any command)
    assert sorted(listing) == [".", "..", ".tmp", "made.txt"]


def test_execute_code_kills_the_program_and_its_children_on_timeout(tmp_path):
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, time\n"
        f"child = subprocess.Popen(['sleep', '60'])\nopen({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\ntime.sleep(60)\n"
    )
    started = time.monotonic()
    result = in_session(lambda session: call(session, "execute_code", code=code, timeout=1))
    assert time.monotonic() - started < 10
    assert result["stdout"] == "started\n" and result["exit_code"] == 124
    assert result["error"] == "command timed out after 1s"  # the call counts as a failure
    child = Path(f"/proc/{pid_file.read_text()}/stat")
    for _ in range(50):
        if not child.exists() or " Z " in child.read_text():  # gone, or dead and waiting for its reaper
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the program's child ({child}) outlived the timeout")


def test_images_travel_through_a_container_environment(docker_host, server, tmp_path):
    """image_generate saves into the container and vision_analyze reads it back from there: the
    environment reads text, so the bytes come back base64 through busybox's own tools."""
    settings = EnvironmentSettings(
        kind="docker", command_timeout=10.0, default_image=ALPHA, run_name="tools-test", run_dir=str(tmp_path)
    )

    async def scenario(session):
        made = await call(session, "image_generate", prompt="a green field", size="32x16")
        seen = await call(session, "vision_analyze", image_url=made["path"])
        where = await session.env.exec("pwd; cat /etc/batch-runner-test-image")
        code = await call(session, "execute_code", code="print(1)")
        return made, seen, where.output.split(), code

    made, seen, where, code = in_session(scenario, model_url=server.base_url, environment=settings)
    assert where[1] == ALPHA  # it ran in the container
    sent = server.chat_requests()[0]["body"]["messages"][0]["content"][1]["image_url"]["url"]
    assert png_size(base64.b64decode(sent.split(",", 1)[1])) == (32, 16)
    assert made["bytes"] == len(base64.b64decode(sent.split(",", 1)[1])) and "analysis" in seen
    assert code == {"stdout": "", "stderr": "no python in this environment\n", "exit_code": 127}
