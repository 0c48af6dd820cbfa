"""Every area's allow-list names entries that exist in docs/differences.md; the shared
helpers behave as the areas rely on."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from .common import VOLATILE, Allowed, compare, doc_anchors, masked, missing_anchors, shape

HERE = Path(__file__).resolve().parent
AREAS = sorted(p.parent.name for p in HERE.glob("*/allowed.py"))


@pytest.mark.parametrize("area", AREAS)
def test_allow_list_anchors_exist(area):
    module = importlib.import_module(f"{__package__}.{area}.allowed")
    entries = module.ALLOWED
    assert all(isinstance(e, Allowed) and e.reason.strip() for e in entries)
    assert missing_anchors(entries) == []


def test_shape_is_recursive_and_merges_array_items():
    value = {"a": 1, "b": [{"x": "s"}, {"x": "t", "y": None}], "c": [], "d": 1.5, "e": True}
    assert shape(value) == {
        "a": "number",
        "b": [{"x": "string", "y": "null"}],
        "c": [],
        "d": "number",
        "e": "boolean",
    }
    assert shape([1, "x"]) == ["number|string"]


def test_masking_and_variables():
    value = {"uptime": 5, "node": "rabbit@h", "listeners": [{"port": 5672, "node": "rabbit@h"}]}
    out = masked(value, ["uptime", "listeners[].port"], {"node": "rabbit@h"})
    assert out == {
        "uptime": VOLATILE,
        "node": "{node}",
        "listeners": [{"port": VOLATILE, "node": "{node}"}],
    }


def test_compare_kinds():
    a = {"status": 200, "shape": {"a": "number", "b": "string"}, "body": {"a": 1, "b": "x"}}
    b = {"status": 201, "shape": {"a": "string", "c": "null"}, "body": {"a": "1", "c": None}}
    kinds = {(d.kind, d.path) for d in compare("c", a, b)}
    assert kinds == {("status", ""), ("type", "a"), ("missing", "b"), ("extra", "c")}
    same = {"status": 200, "shape": {"a": "number"}, "body": {"a": VOLATILE}}
    assert compare("c", same, {**same, "body": {"a": 7}}) == []
    assert [d.kind for d in compare("c", same, {**same, "body": {"a": VOLATILE}})] == []
    assert [
        d.kind for d in compare("c", {**same, "body": {"a": 1}}, {**same, "body": {"a": 2}})
    ] == ["value"]


def test_doc_anchors_include_headings():
    assert "connections" in doc_anchors()
