"""--sandbox_network (issue 31 row 8): a bwrap sample gets a network namespace of its own that reaches
outward (a server in another network namespace, behind a veth pair with a 10.x address on this side)
and never this machine: not a server on the host's loopback, not one on the host's own addresses, not
a link-local (metadata) address, from the model's commands and from the verification's alike."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import source, tool_results, wait_for

from trajforge.environments import EnvironmentSettings, backend_for, netns
from trajforge.environments.bwrap import BwrapBackend
from trajforge.errors import SetupError

# One xdist worker builds the network to test against once for the module.
pytestmark = pytest.mark.xdist_group("sandbox_network")
# An HTTP server at address, port (0: a free one), which prints its port once it listens.
SERVE = (
    "import http.server, sys; "
    "server = http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), http.server.SimpleHTTPRequestHandler); "
    "print(server.server_address[1], flush=True); server.serve_forever()"
)
# What a sandboxed command tries: each address:port, "open" or "closed" (a second at most each).
# Every target at once, each given 1 s to answer: one after another, the unanswered ones took a second each.
PROBE = (
    "import json, socket, sys\n"
    "from concurrent.futures import ThreadPoolExecutor\n"
    "def probe(target):\n"
    "    host, port = target.rsplit(':', 1)\n"
    "    try:\n"
    "        socket.create_connection((host.strip('[]'), int(port)), timeout=1).close()\n"
    "        return 'open'\n"
    "    except OSError:\n"
    "        return 'closed'\n"
    "targets = sys.argv[1:]\n"
    "with ThreadPoolExecutor(len(targets) or 1) as pool:\n"
    "    print(json.dumps(dict(zip(targets, pool.map(probe, targets)))))\n"
)


@pytest.fixture(scope="module")
def outside():
    """A server "on the internet": in a network namespace of its own, at 10.x.y.2, which this machine
    reaches through a veth pair (10.x.y.1 on this side), also at the metadata address; and servers of
    this machine on its loopback and on all its addresses."""
    if os.geteuid() != 0 or shutil.which("ip") is None or netns.missing():
        pytest.skip("needs root, iproute2, pasta and nftables to build a network to test against")
    try:
        BwrapBackend.check(EnvironmentSettings(kind="bwrap", sandbox_network=True))
    except SetupError as exc:
        pytest.skip(f"bwrap cannot run here: {exc}")
    name, net = f"brtest{os.getpid()}", f"10.{random.randint(200, 250)}.{random.randint(0, 255)}"
    metadata = f"169.254.{random.randint(1, 254)}.{random.randint(1, 254)}"  # a link-local one of our own
    host_side, far_side = f"bt{os.getpid()}h"[:15], f"bt{os.getpid()}f"[:15]
    setup = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", host_side, "type", "veth", "peer", "name", far_side],
        ["ip", "link", "set", far_side, "netns", name],
        ["ip", "addr", "add", f"{net}.1/30", "dev", host_side],
        ["ip", "link", "set", host_side, "up"],
        ["ip", "-n", name, "addr", "add", f"{net}.2/30", "dev", far_side],
        ["ip", "-n", name, "addr", "add", f"{metadata}/32", "dev", far_side],
        ["ip", "-n", name, "link", "set", far_side, "up"],
        ["ip", "-n", name, "link", "set", "lo", "up"],
        ["ip", "route", "add", f"{metadata}/32", "via", f"{net}.2"],
    ]
    servers = []
    try:
        for step in setup:
            subprocess.run(step, check=True, capture_output=True)
        inside = ["ip", "netns", "exec", name]
        for argv in (
            [*inside, sys.executable, "-c", SERVE, f"{net}.2", "8080"],
            [*inside, sys.executable, "-c", SERVE, metadata, "80"],
            [sys.executable, "-c", SERVE, "127.0.0.1", "0"],
            [sys.executable, "-c", SERVE, "0.0.0.0", "0"],
        ):
            servers.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))
        # Each says its port once it listens; this machine's two take free ones (a random port may be another
        # process's, and a server that cannot bind it exits).
        loopback, everywhere = (int(server.stdout.readline() or 0) for server in servers[2:])
        targets = {
            "outside": f"{net}.2:8080",
            "metadata": f"{metadata}:80",
            "loopback": f"127.0.0.1:{loopback}",
            **{f"host {a}": f"{a}:{everywhere}" for a in host_ipv4(host_side)},
        }
        seen: dict = {}

        def listening() -> bool:
            seen.update(probe_here(list(targets.values())))
            return set(seen.values()) == {"open"}

        def said() -> str:
            gone = {" ".join(server.args[-2:]): server.returncode for server in servers if server.poll() is not None}
            return f"the servers, last seen {seen}, exited {gone}"

        wait_for(listening, 60, said)  # a minute: four Pythons starting on a loaded machine
        yield targets
    finally:
        for server in servers:
            server.kill()
            server.wait()
        subprocess.run(["ip", "route", "del", f"{metadata}/32"], capture_output=True)
        subprocess.run(["ip", "link", "del", host_side], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def host_ipv4(ours: str) -> list[str]:
    """This machine's own IPv4 addresses, our veth's among them, but the loopback's and those of veths
    that another test process may be removing meanwhile."""
    shown = json.loads(subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True).stdout)
    return [
        entry["local"]
        for link in shown
        if link["ifname"] != "lo" and (link["ifname"] == ours or not link["ifname"].startswith("bt"))
        for entry in link.get("addr_info", [])
    ]


def probe_here(targets: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, *targets], capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout)


def probe_command(targets: dict) -> str:
    return f"python3 -c {quote_sh(PROBE)} {' '.join(targets.values())}"


def quote_sh(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def expected(targets: dict) -> dict:
    return {target: "open" if name == "outside" else "closed" for name, target in targets.items()}


def test_a_sandboxed_command_reaches_outward_and_never_this_machine(outside, tmp_path):
    settings = EnvironmentSettings(kind="bwrap", run_dir=str(tmp_path), command_timeout=60, sandbox_network=True)

    async def body():
        env = await backend_for(settings).open({})
        try:
            return await env.exec(probe_command(outside))
        finally:
            await env.close()

    result = asyncio.run(body())
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == expected(outside)
    assert any(name.startswith("host 10.") for name in outside)  # the veth's own side: an address of the host


def test_in_a_run_the_model_and_the_verification_reach_outward_only(outside, run_here):
    """The model's command probes (its output in the trajectory); the verify command, run in the clean
    room's two-uid namespace, passes only when it sees what a sandbox should."""
    want = json.dumps(expected(outside), sort_keys=True)
    compare = "import json, sys; sys.exit(json.load(sys.stdin) != json.loads(sys.argv[1]))"
    check = f"python3 -c {quote_sh(compare)} {quote_sh(want)}"
    verify = f"{probe_command(outside)} | {check}"
    entry = {"prompt": f"probe [mock turns=1 command={quote(probe_command(outside), safe='')}]", "verify": verify}
    result = run_here([entry], "--environment=bwrap", "--sandbox_network", "--distribution=terminal_only")
    assert result.code == 0, result.stdout + result.stderr
    record = result.trajectories[0]
    assert record["metadata"]["verification"]["passed"] is True, record["metadata"]["verification"]
    seen = tool_results(record).replace('\\"', '"')  # the probe's JSON, inside the tool result's
    assert all(f'"{target}": "{state}"' in seen for target, state in expected(outside).items()), seen
    assert source(record)["prompt"].startswith("probe")


def test_without_pasta_sandbox_network_stops_the_run_saying_what_to_install(run_here, tmp_path, monkeypatch):
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("bwrap", "setpriv", "nsenter", "nft", "unshare", "sh", "true", "ip"):
        if found := shutil.which(tool):
            (tools / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(tools))
    result = run_here([{"prompt": "hi"}], "--environment=bwrap", "--sandbox_network")
    assert result.code == 2 and "apt-get install passt" in result.stderr, result.stderr
    assert not run_here.server.chat_requests()


def test_a_sample_s_pasta_ends_with_it(outside, tmp_path):
    settings = EnvironmentSettings(kind="bwrap", run_dir=str(tmp_path), command_timeout=60, sandbox_network=True)

    async def body():
        env = await backend_for(settings).open({})
        pasta = env.network.pasta.pid
        await env.exec("true")
        await env.close()
        return pasta

    pasta = asyncio.run(body())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pasta}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pasta}").exists()
