"""A page as text for the model: headings, visible text, and every link, button and form field on its own
line with a ref (e1, e2, ...) that browser_click and browser_type accept.

Refs are written into the page as a data attribute, so they name the element itself (no fragile
selector) and stay valid until the next snapshot or navigation.
"""

from __future__ import annotations

import re

from trajforge.tools.browser_runtime import PlaywrightError

REF_ATTRIBUTE = "data-agent-ref"
SNAPSHOT_LIMIT = 20_000  # characters

SNAPSHOT_JS = r"""
(REF) => {
  document.querySelectorAll(`[${REF}]`).forEach((el) => el.removeAttribute(REF));
  const INTERACTIVE = 'a[href], button, input:not([type="hidden"]), select, textarea, summary, [contenteditable=""], ' +
    '[contenteditable="true"], [role="button"], [role="link"], [role="checkbox"], [role="radio"], [role="tab"], ' +
    '[role="menuitem"], [role="option"], [role="switch"], [role="textbox"], [role="combobox"]';
  const SKIP = new Set(["SCRIPT", "STYLE", "NOSCRIPT", "TEMPLATE", "SVG", "CANVAS", "IFRAME", "HEAD"]);
  const BUTTON_TYPES = ["button", "submit", "reset", "image"];
  const lines = [];
  let words = [];
  let count = 0;
  const clean = (text) => (text || "").replace(/\s+/g, " ").trim();
  const flush = () => { const text = clean(words.join(" ")); if (text) lines.push(text); words = []; };
  const visible = (el) =>
    el.checkVisibility({ visibilityProperty: true }) || getComputedStyle(el).display === "contents";
  const role = (el) => {
    if (el.getAttribute("role")) return el.getAttribute("role");
    const tag = el.tagName.toLowerCase();
    if (tag === "input") {
      if (BUTTON_TYPES.includes(el.type)) return "button";
      if (["checkbox", "radio"].includes(el.type)) return el.type;
      return el.type === "search" ? "searchbox" : "textbox";
    }
    return { a: "link", select: "combobox", textarea: "textbox", summary: "button" }[tag] ||
      (el.isContentEditable ? "textbox" : tag);
  };
  const name = (el) => {
    const byId = (el.getAttribute("aria-labelledby") || "").split(/\s+/)
      .map((id) => document.getElementById(id)?.innerText || "").join(" ");
    const field = ["INPUT", "TEXTAREA", "SELECT"].includes(el.tagName);
    return clean(el.getAttribute("aria-label") || byId || el.labels?.[0]?.innerText ||
      (field ? (BUTTON_TYPES.includes(el.type) ? el.value : "") : el.innerText) ||
      el.getAttribute("placeholder") || el.getAttribute("title") || el.getAttribute("alt") || "").slice(0, 100);
  };
  const describe = (el, ref) => {
    let line = `${role(el)} "${name(el)}" [ref=${ref}]`;
    if (el.tagName === "A") line += ` -> ${el.getAttribute("href")}`;
    if (el.tagName === "SELECT") {
      const options = [...el.options].slice(0, 20).map((o) => clean(o.text)).join(" | ");
      line += ` value="${clean(el.selectedOptions[0]?.text)}" options: ${options}`;
    } else if (["checkbox", "radio"].includes(el.type)) {
      if (el.checked) line += " [checked]";
    } else if ((el.tagName === "INPUT" && !BUTTON_TYPES.includes(el.type)) || el.tagName === "TEXTAREA") {
      if (el.value) line += ` value="${clean(el.value).slice(0, 100)}"`;
    }
    if (el.disabled) line += " [disabled]";
    return line;
  };
  const walk = (node) => {
    for (const child of node.childNodes) {
      if (child.nodeType === Node.TEXT_NODE) { words.push(child.textContent); continue; }
      if (child.nodeType !== Node.ELEMENT_NODE || SKIP.has(child.tagName.toUpperCase()) || !visible(child)) continue;
      if (child.matches(INTERACTIVE)) {
        flush();
        const ref = `e${++count}`;
        child.setAttribute(REF, ref);
        lines.push(describe(child, ref));
        continue;
      }
      const heading = /^H([1-6])$/.exec(child.tagName);
      if (heading) { flush(); lines.push(`${"#".repeat(+heading[1])} ${clean(child.innerText)}`); continue; }
      if (child.tagName === "IMG") { if (child.alt) words.push(`[image: ${child.alt}]`); continue; }
      const block = !getComputedStyle(child).display.startsWith("inline");
      if (block) flush();
      walk(child);
      if (block) flush();
    }
  };
  walk(document.body || document.documentElement);
  flush();
  return lines.join("\n");
}
"""


async def snapshot(page) -> str:
    """The page as text, cut at SNAPSHOT_LIMIT characters with a marker."""
    try:
        text = await page.evaluate(SNAPSHOT_JS, REF_ATTRIBUTE)
    except PlaywrightError as exc:
        if "context was destroyed" not in str(exc):
            raise
        await page.wait_for_load_state()  # a navigation was under way: read the new page
        text = await page.evaluate(SNAPSHOT_JS, REF_ATTRIBUTE)
    if len(text) > SNAPSHOT_LIMIT:
        cut = len(text) - SNAPSHOT_LIMIT
        text = text[:SNAPSHOT_LIMIT] + f"\n[... {cut} more characters of the page cut ...]"
    return text


async def element(page, ref: str):
    """The element a snapshot named `ref`; ValueError/LookupError tell the model how to get a good ref."""
    if not re.fullmatch(r"e\d+", ref):
        raise ValueError(f"{ref!r} is not a ref; refs look like e12 and come from browser_snapshot")
    found = page.locator(f'[{REF_ATTRIBUTE}="{ref}"]')
    if not await found.count():
        raise LookupError(f"no element {ref} on the page now; call browser_snapshot for fresh refs")
    return found.first
