"""The MCP SDK and what it imports, copied from this interpreter's site-packages into a folder every uid may
read, for the system's Python of the same version: bwrap's sandbox user (nobody's host uid when the runner
is root) reaches nothing under /root, where a pyenv interpreter lives. Used by tests/test_mcp.py and
bench/mcp_start.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SYSTEM_PYTHON = "/usr/bin/python3"
MODULES = "import sys, mcp.server.mcpserver; print(*(getattr(m, '__file__', None) for m in list(sys.modules.values())))"


def system_python_fits() -> bool:
    """The system's Python is this one's version (the SDK's compiled modules are built for it)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}."
    found = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version)"], capture_output=True, text=True)
    return found.returncode == 0 and found.stdout.startswith(version)


def copy_sdk(folder: Path) -> Path:
    """`folder`/sdk holding the SDK's packages (for PYTHONPATH), the whole of `folder` readable by all."""
    site = next(path for path in sys.path if path.endswith("site-packages"))
    files = subprocess.run([sys.executable, "-c", MODULES], capture_output=True, text=True, check=True).stdout.split()
    tops = {Path(file).relative_to(site).parts[0] for file in files if file.startswith(site + os.sep)}
    sdk = folder / "sdk"
    sdk.mkdir()
    for top in tops:
        source = Path(site) / top
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, sdk / top)
    for info in Path(site).glob("*.dist-info"):  # importlib.metadata asks some of them for their version
        shutil.copytree(info, sdk / info.name)
    subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)
    return sdk
