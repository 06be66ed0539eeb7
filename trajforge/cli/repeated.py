"""Flags that may be given more than once (the table's `repeats`): Fire keeps only the last of a flag given
twice, so their values are joined into the first, comma separated, before Fire reads the command line:
`--task_root=a --task_root b` is `--task_root=a,b`."""

from __future__ import annotations

from collections.abc import Collection


def joined(argv: list[str], repeatable: Collection[str]) -> list[str]:
    """`argv` with every value of a repeatable flag gathered into its first place. Arguments after a lone
    "--" (Fire's own flags) are left as they are."""
    end = len(argv) - 1 - argv[::-1].index("--") if "--" in argv else len(argv)
    out: list[str] = []
    values: dict[str, list[str]] = {}
    place: dict[str, int] = {}
    index = 0
    while index < end:
        argument = argv[index]
        index += 1
        written, equals, value = argument.partition("=")
        name = written.lstrip("-").replace("-", "_")
        if not written.startswith("--") or name not in repeatable or (not equals and index == end):
            out.append(argument)
            continue
        if not equals:  # "--flag value"
            value, index = argv[index], index + 1
        if name not in place:
            place[name] = len(out)
            out.append("")
        values.setdefault(name, []).append(value)
    for name, at in place.items():
        out[at] = f"--{name}=" + ",".join(values[name])
    return out + argv[end:]
