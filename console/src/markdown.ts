// Agent text as Markdown. `marked` turns it into HTML with every piece of raw HTML the agent
// wrote escaped (shown as text, never parsed), and DOMPurify then keeps only inert markup
// (no scripts, handlers, styles or `javascript:` links), so nothing an agent writes can run.

import DOMPurify from "dompurify";
import { Marked } from "marked";

const escapes: Record<string, string> = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (text: string) => text.replace(/[&<>"']/g, (c) => escapes[c]);

const parser = new Marked({
  gfm: true,
  // Agents break lines where they mean them (and stream text line by line): keep them.
  breaks: true,
  async: false,
  renderer: {
    // Block and inline HTML in the agent's text: its source, as text (a block keeps its lines).
    html: ({ text, block }) =>
      block ? `<p>${escapeHtml(text.trimEnd()).replace(/\n/g, "<br>")}</p>\n` : escapeHtml(text),
  },
});

// Links open in a new tab and tell the target nothing about the console.
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noreferrer noopener");
  }
});

/** `text` rendered as Markdown into a fresh element of class `className`. */
export function markdown(text: string, className: string): HTMLElement {
  const html = parser.parse(text) as string;
  const clean = DOMPurify.sanitize(html, {
    RETURN_DOM_FRAGMENT: true,
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select"],
    FORBID_ATTR: ["style"],
  });
  const box = document.createElement("div");
  box.className = className;
  box.append(clean);
  return box;
}
