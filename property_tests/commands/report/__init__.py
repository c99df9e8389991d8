"""The report: report.json (``document.py``), report.html, summary.md, ``mla-fuse report``."""
