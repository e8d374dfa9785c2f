"""The escaping helpers: every control, format and bidi character visible, HTML special characters as entities,
long fields cut, class tokens from a closed vocabulary."""

import html.parser

import pytest

from mixprec.output.escape import ELLIPSIS, FIELD_LIMIT, css_token, cut, html_text, terminal, terminal_lines

# what an attacker puts in a layer name: title change, screen clear, OSC 52 clipboard write, C1 CSI, bidi
HOSTILE = {
    "\x1b]0;pwned\x07": "\\x1b]0;pwned\\x07",
    "\x1b[2J": "\\x1b[2J",
    "\x1b]52;c;cm0gLXJmIH4=\x07": "\\x1b]52;c;cm0gLXJmIH4=\\x07",
    "\x9b31m": "\\x9b31m",  # C1 control sequence introducer
    "\x7f": "\\x7f",
    "\x00\r\n\t\x0b\x0c": "\\x00\\x0d\\x0a\\x09\\x0b\\x0c",
    "\u202eevil": "\\u202eevil",
    "\u200e\u200f\u202a\u202b\u202c\u202d": "\\u200e\\u200f\\u202a\\u202b\\u202c\\u202d",
    "\u2066\u2067\u2068\u2069": "\\u2066\\u2067\\u2068\\u2069",
    "\u00ad\u200b\ufeff\U000e0041": "\\xad\\u200b\\ufeff\\U000e0041",  # other format characters (tag characters)
    "\u2028\u2029": "\\u2028\\u2029",  # line and paragraph separators
    "\ud800": "\\ud800",  # a lone surrogate (JSON allows it; printing it raised UnicodeEncodeError)
}


@pytest.mark.parametrize("raw, shown", HOSTILE.items())
def test_terminal_shows_every_control_format_and_bidi_character_as_a_visible_escape(raw, shown):
    assert terminal(raw) == shown
    assert terminal("layer_" + raw + "_1") == "layer_" + shown + "_1"


def test_printable_text_is_left_as_it_is():
    for text in ("linear_3", "model.layers.0.self_attn", "été → fp32", "层_1", "a b", "\\x1b typed by hand"):
        assert terminal(text) == text
        assert terminal_lines(text) == text


def test_every_code_point_that_is_not_printable_is_escaped():
    text = "".join(chr(c) for c in range(0x30000) if not 0xD800 <= c < 0xE000) + "\ud800"
    shown = terminal(text, limit=None)
    assert shown.isprintable()
    assert all(c.isprintable() for c in terminal_lines(text).replace("\n", ""))


def test_terminal_lines_keeps_line_breaks_only():
    assert terminal_lines("a\nb\x1b[2J\r\n") == "a\nb\\x1b[2J\\x0d\n"


def test_long_fields_are_cut_with_an_ellipsis():
    name = "n" * 5_000_000 + "\x1b[2J"
    shown = terminal(name)
    assert len(shown) == FIELD_LIMIT and shown.endswith(ELLIPSIS) and "\x1b" not in shown
    assert terminal(name, limit=10) == "n" * 9 + ELLIPSIS
    assert cut(cut(name, 50), 50) == cut(name, 50)  # cutting twice changes nothing
    assert terminal("x" * FIELD_LIMIT) == "x" * FIELD_LIMIT
    assert len(terminal(name, limit=None)) == 5_000_000 + len("\\x1b[2J")


class _Elements(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))

    def handle_data(self, data):
        self.text.append(data)


def test_html_text_makes_no_element_and_no_attribute_whatever_the_text():
    payload = "\"'><script>alert(1)</script><img src=x onerror=alert(2)>&amp;\u202e\x1b"
    parser = _Elements()
    parser.feed(f'<div title="{html_text(payload)}">{html_text(payload)}</div>')
    assert parser.tags == [("div", [("title", "\"'><script>alert(1)</script><img src=x onerror=alert(2)>&amp;"
                                               "\\u202e\\x1b")])]  # fmt: skip
    assert "".join(parser.text) == parser.tags[0][1][0][1]


def test_css_token_comes_from_the_vocabulary():
    vocabulary = {"float32", "bfloat16"}
    assert css_token("bfloat16", vocabulary) == "bfloat16"
    assert css_token('x" onmouseover="alert(1)', vocabulary) == "other"
    assert css_token("float32 hl", vocabulary) == "other"
    assert css_token(["float32"], vocabulary, default="none") == "none"
