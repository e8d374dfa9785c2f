"""Text tables within 120 columns: the flexible column takes what is left, other long cells wrap, nothing is cut."""

from mixprec.output.report.text_table import Column, Heading, layout, text_table


def _joined(lines, column_start):
    return "".join(line[column_start:].strip() for line in lines)


def test_the_flexible_column_takes_the_room_left_and_wraps():
    reason = "word " * 60
    lines = text_table([Column("name"), Column("reason", flex=True)], [("a", reason.strip())], width=60)
    assert max(len(line) for line in lines) <= 60 and len(lines) > 4
    assert _joined(lines[2:], 6).replace(" ", "") == reason.replace(" ", "")  # all of it, in order


def test_a_long_identifier_wraps_instead_of_being_cut():
    name = "scaled_dot_product_attention_" * 4
    columns = [Column("layer"), Column("n", right=True), Column("why", flex=True)]
    lines = text_table(columns, [(name, "3", "short"), ("x", "12", "s")], width=50)
    assert max(len(line) for line in lines) <= 50
    body = [line for line in lines[2:]]
    width = layout(columns, [(name, "3", "short")], width=50)[0]
    assert "".join(line[:width].strip() for line in body[:-1]) == name  # every character, in order
    assert body[-1].startswith("x") and body[-1].split()[1] == "12"


def test_headings_span_the_table_and_rows_under_them_are_indented():
    rows = [Heading("module.path (Linear)"), ("x", "1"), ("yy", "22")]
    lines = text_table([Column("a"), Column("b", right=True)], rows)
    assert lines[2] == "module.path (Linear)"
    assert lines[0].startswith("  a ") and lines[3] == "  x    1" and lines[4] == "  yy  22"
