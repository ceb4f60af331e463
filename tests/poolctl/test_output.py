"""What poolctl prints for people: aligned tables and `key: value` blocks."""

import io

from poolctl.output import cell, details, table


def test_cells_are_short_and_readable():
    assert cell("2026-11-30T09:44:52.123456Z") == "2026-11-30 09:44:52"
    assert cell(None) == cell("") == cell([]) == cell({}) == "-"
    assert cell(True) == "yes" and cell(0) == "0"
    assert cell({"a": 1, "b": {"c": 2}}) == "a=1 b={c=2}"
    assert cell(["a100", "h100"]) == "a100,h100"


def test_a_table_aligns_its_columns_and_picks_dotted_keys():
    out = io.StringIO()
    rows = [{"id": 7, "held": {"cpu": 500}}, {"id": 12345, "held": {}}]
    table(rows, [("ID", "id"), ("CPU", "held.cpu"), ("TWICE", lambda r: r["id"] * 2)], out=out)
    assert out.getvalue().splitlines() == [
        "ID     CPU  TWICE",
        "7      500  14",
        "12345  -    24690",
    ]
    empty = io.StringIO()
    table([], [("ID", "id")], out=empty)
    assert empty.getvalue() == "(none)\n"


def test_details_indent_nested_objects_and_leave_out_their_empty_fields():
    out = io.StringIO()
    details({"id": 3, "resources": {"cpu": 1000, "zones": []}, "route": {}}, out=out)
    assert out.getvalue().splitlines() == ["id     3", "resources:", "  cpu: 1000", "route  -"]
