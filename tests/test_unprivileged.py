"""The sandbox a command cannot leave: in bwrap every command, the agent's and the verification's, runs as
a non-root uid in a user namespace of its own with no capability, whoever started the runner, and hits
its limits (processes, memory, file size, tmpfs) as ordinary errors. Real bwrap, through the environment API."""

from __future__ import annotations

import asyncio

from test_sandbox import bwrap, settings  # noqa: F401  (the fixture)

from trajforge.environments import backend_for

PROBE = (
    "grep CapEff /proc/self/status; id -u; "
    "mount -o remount,rw,bind /usr 2>/dev/null && echo remounted-usr; "
    "mount -o remount,rw,bind /etc 2>/dev/null && echo remounted-etc; "
    "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)' 2>/dev/null && echo raw-socket; "
    "touch x && echo workspace-writable; grep NoNewPrivs /proc/self/status"
)


async def _probe(env_settings) -> tuple[str, str]:
    env = await backend_for(env_settings).open({})
    try:
        agent = await env.exec(PROBE)
        await env.enter_clean_room()
        verification = await env.exec(PROBE)
        return agent.output, verification.output
    finally:
        await env.close()


def test_commands_have_no_capability_and_a_non_root_uid(bwrap, tmp_path):  # noqa: F811
    for output in asyncio.run(_probe(settings("bwrap", tmp_path))):
        lines = output.split()
        assert lines[:3] == ["CapEff:", "0000000000000000", "1000"], output
        assert "remounted-usr" not in lines and "remounted-etc" not in lines and "raw-socket" not in lines
        assert "workspace-writable" in lines and "NoNewPrivs:\t1" in output, output


def test_docker_containers_have_no_capability_and_no_new_privileges(docker_host, tmp_path):
    env_settings = settings("docker", tmp_path, default_image="batch-runner-test/alpha:1")
    for output in asyncio.run(_probe(env_settings)):
        assert "CapEff:\t0000000000000000" in output and "NoNewPrivs:\t1" in output, output
        assert "workspace-writable" in output
        assert "remounted-usr" not in output and "raw-socket" not in output
