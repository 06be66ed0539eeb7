"""Environments reached only through commands (bwrap, docker, singularity, modal). The file tools
become commands too, so they see exactly the files the prompt's commands see, with the same rights."""

from __future__ import annotations

from trajforge.environments import FILE_LIMIT, OUTPUT_LIMIT, EnvironmentSettings, file_too_big

# What a container runs while the prompt's commands come in: busybox has neither bash nor `sleep infinity`.
KEEP_ALIVE = ["sh", "-c", "while :; do sleep 3600; done"]
TOO_BIG = 3  # exit status of READ_SCRIPT when the file is over the limit; it prints the size
READ_SCRIPT = (
    f'size=$(wc -c < "$1") || exit 1; if [ "$size" -gt {FILE_LIMIT} ]; then echo "$size"; exit {TOO_BIG}; fi; '
    'exec cat -- "$1"'
)
WRITE_SCRIPT = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'


class CommandEnvironment:
    settings: EnvironmentSettings

    async def run(self, argv: list[str], timeout: float, stdin: bytes | None = None, limit: int = OUTPUT_LIMIT) -> dict:
        """Run argv in the working directory, stderr merged into stdout; the result of execute()."""
        raise NotImplementedError

    async def execute(self, command: str, timeout: float | None = None) -> dict:
        return await self.run(["sh", "-c", command], self.settings.limit(timeout))

    async def read_file(self, path: str) -> str:
        argv = ["sh", "-c", READ_SCRIPT, "sh", path]
        result = await self.run(argv, self.settings.command_timeout, limit=2 * FILE_LIMIT)
        if result["exit_code"] == TOO_BIG and result["output"].strip().isdigit():
            raise file_too_big(path, int(result["output"]))
        _raise_if_failed(result, "read", path)
        return result["output"]

    async def write_file(self, path: str, data: str) -> None:
        result = await self.run(["sh", "-c", WRITE_SCRIPT, "sh", path], self.settings.command_timeout, data.encode())
        _raise_if_failed(result, "write", path)


def _raise_if_failed(result: dict, verb: str, path: str) -> None:
    if result["error"] or result["exit_code"]:
        raise OSError(f"cannot {verb} {path}: {(result['error'] or result['output']).strip()}")
