"""Foreign text made safe to show a person: nothing in it can steer a terminal or pass for ours.

Everything an execution produced (its output, messages, tracebacks, return value, file and
tool names) is written by the program or reaches us through it. Shown raw, it could move the
cursor, erase or recolour lines, set the window title, or reorder a line with bidirectional
controls, and so forge or hide what psych-sandbox says about the run. :func:`visible` turns
every character that can do any of that into a visible escape (``\\x1b``, ``\\u202e``):

- C0 controls, DEL and C1 controls (category Cc: ESC, CR, backspace, the 8-bit CSI...);
- format characters (Cf: bidi embeddings, overrides and isolates U+202A-202E and
  U+2066-2069, the marks U+200E, U+200F and U+061C, zero-width characters, the BOM);
- line and paragraph separators (Zl, Zp), which some terminals and viewers break lines on;
- lone surrogates (Cs), which cannot even be encoded for output;
- :data:`SUMMARY_MARK`, the character that starts every line psych-sandbox writes about a run
  in human output, so foreign text can never show one, not even on a line the terminal
  wrapped.

Newline and tab are escaped too, unless the caller shows a block of lines (``block=True``):
then the text is split into lines at newlines only, and each line is shown after a fixed
gutter, so a newline can only start another gutter line, and a tab only moves right of it.
A backslash is left as it is, so a literal ``\\x1b`` in foreign text reads like an escaped
one; the ``--json`` output is the exact record.
"""

from __future__ import annotations

import unicodedata

#: Starts every line of the CLI's own report about a run; never shown from foreign text.
SUMMARY_MARK = "\u25c6"  # ◆

#: Where foreign text shown as a block of lines is set off from everything else.
GUTTER = "  | "

_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _escape(char: str) -> str:
    point = ord(char)
    if point < 0x100:
        return f"\\x{point:02x}"
    if point < 0x10000:
        return f"\\u{point:04x}"
    return f"\\U{point:08x}"


def _visible_line(text: str, keep_tab: bool) -> str:
    if text.isprintable() and SUMMARY_MARK not in text:
        return text  # the common case, decided in C: nothing here needs an escape
    return "".join(
        _escape(c)
        if c == SUMMARY_MARK
        or (unicodedata.category(c) in _ESCAPED_CATEGORIES and not (keep_tab and c == "\t"))
        else c
        for c in text
    )


def visible(text: str, *, block: bool = False) -> str:
    """``text`` with every character that could steer a terminal shown as an escape.

    With ``block``, the result is one line per line of ``text`` (split at newlines only; a
    final newline ends the last line rather than starting an empty one), each after
    :data:`GUTTER`, joined by newlines, and tabs are kept.
    """
    if not block:
        return _visible_line(text, keep_tab=False)
    lines = text.split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return "\n".join(GUTTER + _visible_line(line, keep_tab=True) for line in lines)
