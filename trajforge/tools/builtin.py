"""The built-in toolsets: their tool functions in the order the model sees them, and the checks that say
what this machine cannot offer. trajforge/builtin.py registers them by name; this module (which imports
every tool, and through them the model client) is imported only when a run needs its tools."""

from __future__ import annotations

from trajforge.tools import code_execution, file, image_gen, terminal, vision, web
from trajforge.tools.browser import tools as browser

TERMINAL = (terminal.terminal,)
FILE = (file.read_file, file.write_file, file.patch, file.search_files)
CODE_EXECUTION = (code_execution.execute_code,)
WEB = (web.web_extract, web.web_search)
VISION = (vision.vision_analyze,)
IMAGE_GEN = (image_gen.image_generate,)
BROWSER = browser.TOOLS
WEB_CHECK = web.search_configured
BROWSER_CHECK = browser.launchable
