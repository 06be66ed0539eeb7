"""The file toolset: read, write, patch and search files in the task's environment."""

from __future__ import annotations

import shlex

from trajforge.tools.session import ToolSession

READ_LIMIT = 32_000  # characters of a file returned in one read


async def read_file(session: ToolSession, path: str, offset: int = 1, limit: int = 500) -> dict:
    """Read a text file and return its lines, numbered.

    Args:
        path: file path, relative to the working directory or absolute
        offset: first line to return (1-based)
        limit: how many lines to return at most
    """
    lines = (await session.env.read_file(path)).splitlines()
    first = max(offset, 1)
    chosen = lines[first - 1 : first - 1 + max(limit, 0)]
    content = "\n".join(f"{first + i:6}\t{line}" for i, line in enumerate(chosen))
    if len(content) > READ_LIMIT:
        content = content[:READ_LIMIT] + "\n[... cut: read fewer lines with offset and limit ...]"
    return {"path": path, "content": content, "total_lines": len(lines)}


async def write_file(session: ToolSession, path: str, content: str) -> dict:
    """Create or overwrite a text file (parent directories are created).

    Args:
        path: file path, relative to the working directory or absolute
        content: the whole new content of the file
    """
    await session.env.write_file(path, content)
    return {"path": path, "bytes_written": len(content.encode())}


async def patch(session: ToolSession, path: str, old_string: str, new_string: str, replace_all: bool = False) -> dict:
    """Replace an exact piece of text in a file. The old text must occur exactly once unless
    replace_all is true.

    Args:
        path: file path, relative to the working directory or absolute
        old_string: the exact text to find, including whitespace
        new_string: the text to put in its place
        replace_all: replace every occurrence instead of requiring exactly one
    """
    text = await session.env.read_file(path)
    found = text.count(old_string)
    if not old_string or found == 0:
        return {"error": f"old_string not found in {path}"}
    if found > 1 and not replace_all:
        return {"error": f"old_string occurs {found} times in {path}; add context or set replace_all"}
    await session.env.write_file(path, text.replace(old_string, new_string))
    return {"path": path, "replacements": found if replace_all else 1}


async def search_files(
    session: ToolSession, pattern: str, target: str = "content", path: str = ".", limit: int = 50
) -> dict:
    """Search file contents with a regular expression (like grep -rn), or file names with a glob
    (like find -name).

    Args:
        pattern: extended regular expression for contents, or a glob such as *.py for names
        target: "content" to search inside files, "files" to search file names
        path: directory to search in
        limit: how many matches to return at most
    """
    if target not in ("content", "files"):
        return {"error": 'target must be "content" or "files"'}
    where, what = shlex.quote(path), shlex.quote(pattern)
    if target == "content":
        command = f"grep -rnE -e {what} -- {where} 2>/dev/null | head -n {int(limit)}"
    else:
        command = f"find {where} -name {what} -not -path '*/.*' 2>/dev/null | head -n {int(limit)}"
    result = await session.env.exec(command)
    if result.error:
        return {"error": result.error}
    matches = result.output.splitlines()
    return {"matches": matches, "count": len(matches), "truncated": len(matches) >= int(limit)}
