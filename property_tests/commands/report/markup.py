"""Markup shared by the HTML report's sections (``html.py``, ``cells.py``): the page's
inline style and small builders that escape every value they are given as text."""

from __future__ import annotations

from html import escape

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1800px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top;text-align:left}
th{background:#f3f3f3}pre{background:#f6f6f6;padding:4px 6px;white-space:pre-wrap;word-break:break-all;margin:2px 0}
.verdict{padding:1px 8px;border-radius:3px;color:#fff;font-weight:bold}.verdict.PASS{background:#1a7f37}
.verdict.FAIL{background:#c62828}.verdict.ERROR{background:#6a1b9a}.note{color:#555;font-style:italic}
tr.FAIL td:last-child,tr.fail td:last-child,tr.crash td:last-child,tr.hang td:last-child,td.rate{color:#c62828;font-weight:bold}
.legend span{margin-right:1.2em}.scroll{overflow-x:auto}svg text{font-size:11px}code.flag{margin-right:.4em}
.top{display:flex;flex-wrap:wrap;gap:0 2.5em}.top h2{margin-top:.4em}.new,.zero{color:#c62828;font-weight:bold}.known{color:#555}
"""


def text(value) -> str:
    return "" if value is None else escape(str(value))


def table(headers: list[str], rows: list[list], table_id: str = "", row_attrs: list[str] | None = None) -> str:
    """A table of markup (no header row where ``headers`` is empty): a cell is its content, or
    ``(attributes, content)``; ``row_attrs`` holds each row's attributes (all of it escaped already)."""
    attrs = row_attrs or [""] * len(rows)
    head = f"<tr>{''.join(f'<th>{escape(header)}</th>' for header in headers)}</tr>" if headers else ""
    body = "".join(f"<tr{attr}>" + "".join(f"<td{cell[0]}>{cell[1]}</td>" if isinstance(cell, tuple) else
                                           f"<td>{cell}</td>" for cell in row) + "</tr>"
                   for row, attr in zip(rows, attrs))
    identity = f' id="{table_id}"' if table_id else ""
    return f"<table{identity}>{head}{body}</table>"


def section(section_id: str, title: str, body: str) -> str:
    return f'<section id="{section_id}"><h2>{escape(title)}</h2>{body}</section>'


