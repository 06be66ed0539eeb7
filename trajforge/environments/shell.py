"""Environments reached through commands: every backend. The file operations are commands too, so they
see exactly the files the prompt's commands see, with the same rights, and fail the same way everywhere."""

from __future__ import annotations

import io
import secrets
import shlex
import tarfile
from abc import abstractmethod

from trajforge.environments import FILE_LIMIT, OUTPUT_LIMIT, EnvironmentSettings
from trajforge.environments.contract import (
    Environment,
    ExecResult,
    file_is_directory,
    file_missing,
    file_not_regular,
    file_too_big,
)

# What a container runs while the prompt's commands come in: busybox has neither bash nor `sleep infinity`.
KEEP_ALIVE = ["sh", "-c", "while :; do sleep 3600; done"]
# In a container whose pid 1 is KEEP_ALIVE: every other process (the caller survives, pid 1 ignores it);
# twice, for a process that forked meanwhile.
KILL_ALL = ["sh", "-c", "kill -9 -1 2>/dev/null; kill -9 -1 2>/dev/null; exit 0"]
# Exit statuses of READ_SCRIPT and WRITE_SCRIPT that name why they did nothing; for TOO_BIG it prints the size.
TOO_BIG, MISSING, DIRECTORY, SPECIAL = 3, 4, 5, 6
# A FIFO, a device or a socket is refused before it is opened: reading /dev/zero never ends, opening a
# FIFO waits for a writer. Only a regular file's size is asked for, and only then is it read.
NOT_SPECIAL = f'[ -d "$1" ] || [ -f "$1" ] || exit {SPECIAL}; '
READ_SCRIPT = (
    f'[ -e "$1" ] || exit {MISSING}; [ -d "$1" ] && exit {DIRECTORY}; {NOT_SPECIAL}'
    f'size=$(wc -c < "$1") || exit 1; if [ "$size" -gt {FILE_LIMIT} ]; then echo "$size"; exit {TOO_BIG}; fi; '
    'exec cat -- "$1"'
)
# Its folder is found without a subshell and dirname, and made only when missing (mkdir): each process
# started is a millisecond of the kernel's, more in a sandbox.
WRITE_SCRIPT = (
    f'if [ -e "$1" ]; then {NOT_SPECIAL}fi; case $1 in */*) dir=${{1%/*}} ;; *) dir=. ;; esac; '
    '[ -d "${dir:-/}" ] || mkdir -p -- "${dir:-/}" && cat > "$1"'
)
# A command in the clean room comes on stdin, so no argv in /proc (its shell's, bwrap's) holds it: the
# expected answer a verify command compares with stays out of reach of a symlink to /proc/*/cmdline. It
# gets a fresh HOME that no agent process could have prepared, made after they are gone: by the runner, its
# path the shell's $1 (clean_home: 2.3 ms of CPU less than a mktemp process), else by mktemp,
# and Python reads neither a user site (a .pth file there runs at every start) nor the cwd (a json.py).
# Git in the agent's repository would run what its config names: every repository's config is the
# runner's by now (GIT_NEUTRAL); these hold besides, and for a repository git would find elsewhere.
GIT_SAFE = {"core.fsmonitor": "false", "core.hooksPath": "/dev/null", "core.pager": "cat", "core.editor": "true"}
# diff.external is not among them: "false" would make every `git diff` print nothing; the agent's configs
# are the runner's by the time anything runs (GIT_NEUTRAL), and they name no external diff.
GIT_SAFE |= {"core.sshCommand": "false", "credential.helper": "", "gpg.program": "false"}
# The agent wrote the object database: no commit-graph or multi-pack index of its may stand for the commits.
GIT_SAFE |= {"core.commitGraph": "false", "core.multiPackIndex": "false"}
GIT_SAFE |= {"gpg.ssh.program": "false", "gpg.x509.program": "false", "gpg.ssh.defaultKeyCommand": "false"}
GIT_SAFE |= {"log.showSignature": "false", "core.attributesFile": "/dev/null", "core.excludesFile": "/dev/null"}
# An untracked cache the agent wrote into its index would answer `git status` for what is new.
GIT_SAFE |= {"core.untrackedCache": "false"}
# The agent's repository, read by the verifier's uid; a folder that merely looks like a repository
# (one the agent moved its .git to) is none unless a command names it with --git-dir.
GIT_SAFE |= {"safe.directory": "*", "safe.bareRepository": "explicit"}
# No system or global config or attributes, no replace refs (`git replace` would make an object id stand
# for other content), and GIT_SAFE: for the verify command's git and the clean room's own.
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_ATTR_NOSYSTEM": "1"}
GIT_ENV |= {"GIT_NO_REPLACE_OBJECTS": "1", "GIT_CONFIG_COUNT": str(len(GIT_SAFE))}
GIT_ENV |= {
    name: text
    for n, (key, value) in enumerate(GIT_SAFE.items())
    for name, text in ((f"GIT_CONFIG_KEY_{n}", key), (f"GIT_CONFIG_VALUE_{n}", value))
}
GIT_VARIABLES = " ".join(f"{name}={shlex.quote(value)}" for name, value in GIT_ENV.items())
CLEAN_MAIN = (
    "c=$(cat) && exec </dev/null && HOME=${1:-$(mktemp -d)} || exit 125; set --; "
    'export HOME TMPDIR="$HOME" AS_AGENT="${AS_AGENT:-}" PYTHONNOUSERSITE=1 PYTHONSAFEPATH=1 '
    'PYTHONPYCACHEPREFIX="$HOME/.pycache" '
    f"{GIT_VARIABLES}; "
    'eval "$c"'
)
# First every descriptor above 2 is closed (bwrap's of the worker's user namespace, userns.OPENED_AT): dash
# names only 3-9 in a redirection, so bash closes one above 9 and then runs the rest in sh (the command still
# waits on stdin; a bash and a sh more, 2.7 ms of CPU a command). Without bash such a descriptor stays open.
CLOSE_ALL = 'for f in /proc/$$/fd/*; do n=${f##*/}; case $n in *[!0-9]* | [0-2]) ;; *) eval "exec $n>&-" ;; esac; done'
THEN_SH = CLOSE_ALL + '; exec sh -c "$1" sh "$2"'
CLEAN_SHELL = (
    'for f in /proc/$$/fd/*; do n=${f##*/}; case $n in *[!0-9]* | [0-2]) ;; [3-9]) eval "exec $n>&-" ;; '
    "*) high=1 ;; esac; done; "
    'if [ -n "${high:-}" ] && command -v bash >/dev/null; then '
    f'exec bash -c {shlex.quote(THEN_SH)} bash {shlex.quote(CLEAN_MAIN)} "${{1:-}}"; fi; {CLEAN_MAIN}'
)
# The hash of a file the clean room trusts as the task left it: BLAKE2b where there is b2sum (3x sha256sum's
# speed without SHA instructions), else SHA-256 (busybox). Both sides choose alike; lines of the one never
# match lines of the other.
HASH = "if command -v b2sum >/dev/null; then hash=b2sum; else hash=sha256sum; fi"
# Every file in a pack folder under $1 as the task left it, a line each (`HASH  PATH`, physical paths), made
# when the agent begins (agent_begins, before any command of its): the scan's record of the packs it need not
# verify again when the agent's git has merely freshened them (git sets a pack's mtime, so its ctime, when it
# would write an object the pack holds), and in docker, whose carried files are all new to it. A rewrite of
# a pack's bytes under its name, its size and its trailer kept, changes its hash; ctime could not tell.
PACKS_SCRIPT = (
    HASH
    + r"""
root=$(cd "$1" && pwd -P) || exit 1
find "$root" -path '*/objects/pack/*' -type f -exec "$hash" -- {} +"""
)
# Removes, under $1, what would let a verifier read something other than the agent's work: symlinks
# resolving outside $1 (/proc/self/cmdline, /dev, /etc), FIFOs, sockets and devices; prints each removed
# after $MARK (so that what a command says on stderr is not read as a removed file). Then every git folder
# git would accept there goes through GIT_NEUTRAL, $PACKS the file holding stdin (PACKS_SCRIPT's record)
# when $RECORD is set, else /dev/null (no record: no mktemp, cat and rm).
# Any step that fails fails the scan (exit status not 0).
ESCAPES_SCRIPT = r"""root=$(cd "$1" && pwd -P) || exit 1
if [ -n "$RECORD" ]; then PACKS=$(mktemp) && trap 'rm -f -- "$PACKS"' EXIT && cat > "$PACKS" || exit 1
else PACKS=/dev/null; fi; export PACKS
find "$root" \( -type l -o -type p -o -type s -o -type b -o -type c \) -exec sh -c '
root=$1; shift
for f; do
  if [ -L "$f" ] && t=$(readlink -f -- "$f"); then
    case "$t" in "$root" | "$root"/*) continue ;; esac
  fi
  rm -f -- "$f" && printf "%s%s\n" "$MARK" "${f#"$root"/}" || exit 1
done' sh "$root" {} + || exit 1
find "$root" \( -name .git -o -path '*/.git/*/HEAD' -type f \) -exec sh -c "$GIT_NEUTRAL" sh "$root" {} +"""
# Every git folder of the workspace git would open: a `.git` folder and those in it (a submodule's in
# modules/, a worktree's in worktrees/), the folder a `.git` file (`gitdir: ...`) or link names, and a
# worktree's `commondir`. One that lies outside the workspace is no repository of the verifier's: the
# `.git` file or `commondir` naming it goes (printed). In each, a config of the runner's replaces the
# agent's (only the format a reader needs is kept: no filter, driver, program, hook or include of the
# agent's is left to run, whatever its name), and attributes of the runner's in info/attributes, which
# outrank every .gitattributes: no path has a diff, filter or merge driver, so `git diff` shows the bytes
# that changed. No info/exclude hides a new file from `git status`, no info/grafts gives a commit other
# parents, and no entry of the index is marked for git to pass over (unmark). No lock of the agent's
# (`*.lock`: index.lock, config.lock, a ref's) stops the neutraliser's git or the verifier's. The verifier's
# uid, which has no capability where git checks with access(), may pass into each folder (objects and refs
# included). A step that fails ends the scan with an error: the clean room fails closed.
GIT_NEUTRAL = (
    r"""root=$1; shift
inside() { case "$1" in "$root"/*) return 0 ;; esac; return 1; }
drop() { rm -rf -- "$1" && printf '%s%s\n' "$MARK" "${1#"$root"/}" || exit 1; }
# What a `.git` file or `commondir` names, read whole as git reads it (trailing newlines off); false for
# text of more than one line or with a carriage return, which git would read as another path than its
# first line: such a file goes.
named() { c=$(cat -- "$1") || return 1; c=${c#"$2"}; case "$c" in *"
"* | *"$(printf '\r')"* | "") return 1 ;; esac; printf '%s' "$c"; }
KEEP='^(core\.repositoryformatversion|extensions\.(objectformat|refstorage|compatobjectformat))$'
own() {
  g=$1; kept=
  if [ -f "$g/config" ] && [ ! -L "$g/config" ] && command -v git >/dev/null; then
    kept=$(cd / && git config --file "$g/config" --get-regexp "$KEEP")
  fi
  # ({\} is find's name placeholder: GIT_NEUTRAL's own text is an argument of a find -exec, in which no
  # other argument may hold that placeholder as it is written for this find)
  find "$g" -mindepth 1 -name '*.lock' -prune -exec rm -rf -- {\} + || exit 1
  rm -rf -- "$g/config" "$g/config.worktree" || exit 1
  { printf '[core]\n\tbare = false\n'
    printf '%s\n' "$kept" | while read -r key value; do
      case "$value" in "" | *[!A-Za-z0-9]*) continue ;; esac
      printf '[%s]\n\t%s = %s\n' "${key%%.*}" "${key#*.}" "$value"
    done; } > "$g/config" || exit 1
  if [ -L "$g/info" ] || { [ -e "$g/info" ] && [ ! -d "$g/info" ]; }; then rm -rf -- "$g/info"; fi
  mkdir -p -- "$g/info" && rm -rf -- "$g/info/attributes" "$g/info/exclude" "$g/info/grafts" || exit 1
  printf '* !diff !filter !merge\n' > "$g/info/attributes" || exit 1
  for d in "$g/objects" "$g/refs"; do if [ -d "$d" ]; then chmod go+x "$d" || exit 1; fi; done
  d=$g; while inside "$d"; do chmod go+x "$d" || exit 1; d=${d%/*}; done
}
common() {
  [ -e "$1/commondir" ] || [ -L "$1/commondir" ] || return 0
  c=$(named "$1/commondir" "") || { drop "$1/commondir"; return 0; }
  case "$c" in /*) ;; *) c=$1/$c ;; esac
  if c=$(readlink -f -- "$c") && [ -d "$c" ] && inside "$c"; then own "$c"; verify_objects "$c"
  else drop "$1/commondir"; fi
}
# The index is written again with no stat data of the agent's: git trusts an entry whose stat data matches
# its file and uses the entry's blob id without reading the file, so an entry holding the file's own lstat
# data and the task's blob id hid a change. Every entry is given again (`ls-files -s | --index-info`: its
# mode, blob id, stage and path kept, so what the agent staged stays staged) with zero stat data, which no
# file matches (its ctime is never 0), and without the assume-unchanged and skip-worktree marks, which git
# passes over (`ls-files -v` tags them h, s or S). A split index is joined first: entries of its shared
# part that are given unchanged would keep their stat data. A sparse index is expanded by a git whose
# config (the runner's) has no sparse checkout. The config, hooks included, is the runner's by now, and
# GIT_ENV holds. Each stage of the pipe says when it fails (on fd 3, read by $(...)), and a second look
# must find no mark and no ctime but 0:0: a git that could not write the index (a full disk) leaves them,
# and the scan fails.
unmark() {
  [ -f "$1/index" ] && command -v git >/dev/null || return 0
  (cd / && GIT_DIR=$1 git update-index --no-split-index) >&2 || exit 1
  failed=$( { { (cd / && GIT_DIR=$1 git ls-files -s -z) || echo x >&3; } \
    | { (cd / && GIT_DIR=$1 git update-index -z --index-info) >&2 || echo x >&3; }; } 3>&1 )
  [ -z "$failed" ] || exit 1
  v=$(cd / && GIT_DIR=$1 git ls-files -v --debug) || exit 1
  left=$(printf '%s\n' "$v" | grep -e '^[hsS] ' -e '^  ctime: ' | grep -v '^  ctime: 0:0$')
  if [ -n "$left" ]; then echo "an entry of ${1#"$root"/}/index kept a mark or stat data" >&2; exit 1; fi
}
# Git checks that a commit's and its root tree's file hash to their ids when it parses them, not the trees
# it walks below: a loose object of the agent's under the id of HEAD:tests, listing its own tests, fooled
# `git diff COMMIT` and `git status`. So every object file the agent could have written must hold the
# object its name says, in each object folder git reads for the repository (its objects and every
# alternate `git count-objects -v` lists). A file's ctime is the kernel's, never the agent's to set
# (writing, renaming, linking a file all set it), so files whose ctime is before $SINCE (when the
# agent begins: after the task's setup, in seconds of the same kernel's clock; 0 where unknown, or where the files were
# carried: docker) are left as they are; an alternate outside the workspace is checked whole (any earlier
# process could have written it). A loose object's id is checked as git would serve it (packs first):
# the new ids are packed (pack-objects, from whatever copy git reads) and index-pack, which computes each
# id from the content, must find the same ids. A pack with a new file (.pack, .idx, ...) is checked whole
# (verify-pack: each object's id computed, the index compared) unless each of its files (.pack, .idx,
# .rev, ...) is, path and hash, in the record of the packs the task left ($PACKS, PACKS_SCRIPT's): a
# hash is a sequential read, a verify-pack inflates and hashes every object (seconds for 100 MB of deltas).
# A file git cannot hash, or a record that is empty or missing, is no match. No symbolic link may stand in an object
# folder (an old file would answer for another id), nor a name with a newline (git reads a pack of any
# name; the list of files is read a line a name). Each folder is checked once for each repository.
checked=
nl='
'
# A folder read a line a name (the alternates, the pack list) cannot have a newline in its own path either.
lines() {
  case "$1" in *"$nl"*) echo "a newline in the path of the object folder ${1#"$root"/}" >&2; exit 1 ;; esac
}
verify_objects() {
  [ -d "$1/objects" ] && command -v git >/dev/null || return 0
  o=$(readlink -f -- "$1/objects") || exit 1
  lines "$o"
  listed=$(cd / && GIT_DIR=$1 git -c core.quotePath=false count-objects -v) || exit 1
  printf '%s\n' "$listed" | sed -n 's/^alternate: //p' > "$scratch/alternates" || exit 1
  printf '%s\n' "$o" >> "$scratch/alternates" || exit 1
  while IFS= read -r d; do
    case "$d" in \"*) echo "an alternate of ${1#"$root"/} has a quoted path" >&2; exit 1 ;; esac
    d=$(readlink -f -- "$d") || exit 1
    lines "$d"
    # A pair a line each (neither path holds a newline): a space in one cannot make two pairs read alike.
    case "$checked" in *"$nl$nl$o$nl$d$nl$nl"*) continue ;; esac
    checked="$checked$nl$nl$o$nl$d$nl$nl"
    since=$SINCE; inside "$d" || since=0
    if [ -n "$(find "$d" -type l -o -name "*$nl*")" ]; then
      echo "a link or a name with a newline in the object folder ${d#"$root"/}" >&2; exit 1
    fi
    files=$(find "$d" -type f -exec stat -c '%Z %n' {\} +) || exit 1
    printf '%s\n' "$files" | since=$since d=$d/ awk '
      BEGIN { since = ENVIRON["since"]; d = ENVIRON["d"] }  # not -v, which reads a backslash as an escape
      { p = substr($0, index($0, " ") + 1); if ($1 + 0 < since + 0 || substr(p, 1, length(d)) != d) next
        r = substr(p, length(d) + 1)
        loose = r ~ /^[0-9a-f][0-9a-f]\/[0-9a-f]+$/ && (length(r) == 41 || length(r) == 65)
        if (loose) print substr(r, 1, 2) substr(r, 4)
        else if (r ~ /^pack\//) { sub(/\.[^.\/]*$/, "", p); print "pack " p } }' >> "$scratch/new" || exit 1
    sort -u "$scratch/new" > "$scratch/ids" && : > "$scratch/new" || exit 1
    sed -n 's/^pack //p' "$scratch/ids" | while IFS= read -r pack; do
      [ -f "$pack.idx" ] && [ -f "$pack.pack" ] || continue
      if now=$($hash -- "$pack".*); then  # grep's 1: no line of now's is missing from the record
        printf '%s\n' "$now" | grep -vxF -f "$PACKS" >/dev/null; [ $? -eq 1 ] && continue
      fi
      (cd / && GIT_DIR=$1 git verify-pack -- "$pack.idx") >&2 || exit 1
    done || exit 1
    grep -v '^pack ' "$scratch/ids" > "$scratch/loose" || [ ! -s "$scratch/loose" ] || exit 1
    [ -s "$scratch/loose" ] || continue
    (cd / && GIT_DIR=$1 git pack-objects -q --window=0 --stdout) < "$scratch/loose" > "$scratch/p.pack" || exit 1
    (cd / && GIT_DIR=$1 git index-pack -o "$scratch/p.idx" "$scratch/p.pack") >/dev/null || exit 1
    (cd / && GIT_DIR=$1 git show-index) < "$scratch/p.idx" | cut -d ' ' -f 2 | sort -u > "$scratch/got" || exit 1
    rm -f -- "$scratch/p.pack" "$scratch/p.idx" || exit 1
    if ! cmp -s "$scratch/loose" "$scratch/got"; then
      echo "an object file in ${d#"$root"/} does not hold the object its name says" >&2; exit 1
    fi
  done < "$scratch/alternates"
}
neutral() { own "$1"; common "$1"; verify_objects "$1"; unmark "$1"; }
# Then the index of the repository whose work tree is $2 is refreshed: with no stat data, git's plumbing
# (diff-files, diff-index) called every file changed. `update-index --refresh` reads each file and gives an
# entry its file's stat data only where the file holds the entry's blob; nothing of the agent's runs now to
# change one after. A refresh that fails (a full disk) leaves no stat data: every file reads as changed,
# never one as unchanged. A folder in a .git folder (a submodule's, a worktree's) is refreshed through the
# `.git` file of its work tree.
refresh() {
  [ -f "$1/index" ] && command -v git >/dev/null || return 0
  (cd "$2" && GIT_DIR=$1 GIT_WORK_TREE=$2 git update-index -q --refresh) >/dev/null 2>&1 || :
}
"""
    + HASH
    + r"""
scratch=$(mktemp -d) || exit 1
trap 'rm -rf -- "$scratch"' EXIT
for f; do
  if [ "${f##*/}" = HEAD ]; then  # a submodule's or worktree's folder in a .git folder
    g=${f%/HEAD}; case "$g" in */.git) continue ;; esac
    if [ -d "$g/objects" ] || [ -f "$g/commondir" ]; then neutral "$g"; fi
  elif [ -L "$f" ]; then
    if g=$(readlink -f -- "$f") && [ -d "$g" ] && inside "$g"; then neutral "$g"; refresh "$g" "${f%/*}"
    else drop "$f"; fi
  elif [ -d "$f" ]; then
    neutral "$f"; refresh "$f" "${f%/*}"
  elif [ -f "$f" ]; then
    case "$(head -c 8 -- "$f")" in "gitdir: ") ;; *) drop "$f"; continue ;; esac
    g=$(named "$f" "gitdir: ") || { drop "$f"; continue; }
    case "$g" in /*) ;; *) g=${f%/*}/$g ;; esac
    if g=$(readlink -f -- "$g") && [ -d "$g" ] && inside "$g"; then neutral "$g"; refresh "$g" "${f%/*}"
    else drop "$f"; fi
  fi
done"""
)
NOTED = 20  # removed paths named in verification.output; the rest are counted


class Executable(bytes):
    """The content of a file that is to be executable (a task's script kept with its mode)."""


def tar_archive(files: dict[str, bytes]) -> bytes:
    """An uncompressed tar of `files` (relative path -> content), each 0644, or 0755 when Executable."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if isinstance(data, Executable) else 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class CommandEnvironment(Environment):
    settings: EnvironmentSettings

    @abstractmethod
    async def run(
        self, argv: list[str], timeout: float, stdin: bytes | None = None, limit: int = OUTPUT_LIMIT
    ) -> ExecResult:
        """Run argv in the working directory, stderr merged into stdout, output capped at `limit` bytes."""

    clean = False  # set by enter_clean_room: every later command runs there
    dropped: tuple[str, ...] = ()  # what fresh_copy left out of the work folder it carried (remove_escapes names it)
    cwd: str  # the working directory of every command, set by the backend
    # Seconds on the clock of the kernel the files are on, after the task's setup and before the agent's
    # first command (agent_begins): no object file whose ctime is before it is the agent's (0: any may be,
    # and the clean room checks every one)
    agent_since = 0
    packs = b""  # PACKS_SCRIPT's record, made at agent_begins: the packs the clean room need not verify again

    async def agent_begins(self, verified: bool) -> None:
        # Before any command of the agent's: whatever hashes the files is as the task left it. A record that
        # cannot be made is none (every new pack is verified); it may be long: one line a pack file.
        if not verified:  # no clean room will read it: no command
            return
        found = await self.run(
            ["sh", "-c", PACKS_SCRIPT, "sh", self.scan_root], self.settings.command_timeout, limit=FILE_LIMIT
        )
        self.packs = b"" if found.error or found.exit_code else found.output.encode()

    @property
    def scan_root(self) -> str:
        """Where the clean room removes escapes: the working directory, unless the backend says otherwise."""
        return self.cwd

    async def exec(self, command: str, timeout: float | None = None, *, capped: bool = True) -> ExecResult:
        limit = self.settings.limit(timeout) if capped or not timeout else timeout
        if self.clean:
            return await self.run(["sh", "-c", CLEAN_SHELL, "sh", await self.clean_home()], limit, command.encode())
        return await self.run(["sh", "-c", command], limit)

    async def clean_home(self) -> str:
        """A fresh HOME for the clean room's next command, made by the runner, as the command sees its path; ""
        where the command makes its own (mktemp in its TMPDIR)."""
        return ""

    async def enter_clean_room(self) -> str:
        await self.end_agent_processes()
        self.clean = True
        await self.clean_variables()
        return await self.remove_escapes()

    async def remove_escapes(self) -> str:
        mark = f"removed-{secrets.token_hex(8)}:"  # what the scan prints before a removed file's name
        variables = {
            "HOME": "/",
            "MARK": mark,
            "SINCE": str(self.agent_since),
            "RECORD": "1" if self.packs else "",
            "GIT_NEUTRAL": GIT_NEUTRAL,
        }
        # Exported by the scan's own shell, not by an `env` before it: one exec less (two with confined's shell).
        own = " ".join(f"{name}={shlex.quote(value)}" for name, value in variables.items())
        exports = f"export {own} {GIT_VARIABLES}"
        scan = ["sh", "-c", f"{exports}\n{ESCAPES_SCRIPT}", "sh", self.scan_root]
        found = await self.run(scan, self.settings.command_timeout, self.packs or None)
        said = found.output.splitlines()
        if found.error or found.exit_code:
            errors = "\n".join(line for line in said if not line.startswith(mark))
            why = (found.error or errors).strip() or f"the scan exited {found.exit_code}"
            raise OSError(f"cannot clean the workspace before verification: {why}")
        return self.removed_note([line[len(mark) :] for line in said if line.startswith(mark)])

    def removed_note(self, found: list[str]) -> str:
        """remove_escapes' note: what fresh_copy left out and what the scan removed (`found`), "" for nothing."""
        removed = [*self.dropped, *found]
        if not removed:
            return ""
        named = ", ".join(removed[:NOTED]) + (f" and {len(removed) - NOTED} more" if len(removed) > NOTED else "")
        what = "links out of the workspace, FIFOs, sockets, devices, git folders outside it"
        return f"[removed before verification ({what}): {named}]\n"

    async def end_agent_processes(self) -> None:
        """End every process the agent's commands left running (a backend without a way says so in docs)."""

    async def clean_variables(self) -> None:
        """Make the variables of the clean room's commands: the system PATH, nothing the agent could set."""

    async def read_file(self, path: str) -> str:
        argv = ["sh", "-c", READ_SCRIPT, "sh", path]
        result = await self.run(argv, self.settings.command_timeout, limit=2 * FILE_LIMIT)
        if not result.error and result.exit_code == MISSING:
            raise file_missing(path)
        if not result.error and result.exit_code == DIRECTORY:
            raise file_is_directory(path)
        _raise_if_special(result, path)
        if result.exit_code == TOO_BIG and result.output.strip().isdigit():
            raise file_too_big(path, int(result.output))
        _raise_if_failed(result, "read", path)
        return result.output

    async def write_file(self, path: str, data: str | bytes) -> None:
        data = data.encode() if isinstance(data, str) else data
        result = await self.run(["sh", "-c", WRITE_SCRIPT, "sh", path], self.settings.command_timeout, data)
        _raise_if_special(result, path)
        _raise_if_failed(result, "write", path)

    async def write_files(self, files: dict[str, bytes]) -> None:
        # One command for a whole repository, not one per file: tar unpacks it in the working directory.
        if files:
            result = await self.run(["tar", "-xf", "-"], self.settings.command_timeout, tar_archive(files))
            _raise_if_failed(result, "write", f"{len(files)} files")


def _raise_if_special(result: ExecResult, path: str) -> None:
    if not result.error and result.exit_code == SPECIAL:
        raise file_not_regular(path)


def _raise_if_failed(result: ExecResult, verb: str, path: str) -> None:
    if result.error or result.exit_code:
        raise OSError(f"cannot {verb} {path}: {(result.error or result.output).strip()}")
