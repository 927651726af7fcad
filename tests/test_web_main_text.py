"""Main-text extraction keeps content and tables, drops boilerplate, finds titles; clipping marks the cut."""

from __future__ import annotations

from amapreduce.web.main_text import clip_page_text, extract_main_text, title_of

HTML = (
    "<html><head><title>Atlas: Testland</title></head><body>"
    "<nav>Home | Countries | Login | Subscribe</nav><article><h1>Testland</h1>"
    "<p>Testland is a kingdom whose capital is Probe City.</p>"
    "<table><tr><th>Capital</th><td>Probe City</td></tr><tr><th>Population</th><td>1,234,567</td></tr></table>"
    "</article><footer>All rights reserved by Footer Corp</footer></body></html>"
)


def test_html_keeps_tables_as_markdown_and_drops_boilerplate() -> None:
    title, text = extract_main_text(HTML.encode(), "text/html")
    assert title == "Atlas: Testland"
    assert "| Population | 1,234,567 |" in text
    assert "Probe City" in text
    assert "Footer Corp" not in text
    assert "Subscribe" not in text


def test_title_falls_back_to_h1_then_heading_then_name() -> None:
    assert extract_main_text(b"<html><body><h1>Only <b>H1</b></h1><p>body text here</p></body></html>",
                             "text/html").title == "Only H1"
    assert extract_main_text(b"# Notes on X\n\nbody", "text/markdown").title == "Notes on X"
    assert extract_main_text(b"", "text/plain", url="corpus://c/dir/file.txt").title == "file.txt"


def test_plain_text_passes_through_decoded_and_is_titled_by_file_name() -> None:
    title, text = extract_main_text("Zürich facts\nline two".encode("latin-1"), "text/plain",
                                     url="corpus://c/zurich.txt", encoding="latin-1")
    assert (title, text) == ("zurich.txt", "Zürich facts\nline two")


def test_title_of_takes_the_first_heading() -> None:
    assert title_of("intro\n\n## Second level  \n# Later", "x") == "Second level"
    assert title_of("no heading", "name.md") == "name.md"


def test_clip_page_text_marks_the_cut() -> None:
    text = "word " * 100
    cut, was_cut = clip_page_text(text, 103)
    assert was_cut and cut.endswith("...(truncated)") and len(cut) <= 103 + len("\n...(truncated)")
    assert clip_page_text("short", 100) == ("short", False)


def test_meta_charset_is_honoured_without_a_header_charset() -> None:
    page = ("<html><head><meta charset='windows-1252'><title>Z\u00fcrich</title></head><body><article>"
            "<p>Z\u00fcrich is the largest city of Switzerland, on the lake of the same name.</p>"
            "</article></body></html>").encode("cp1252")
    title, text = extract_main_text(page, "text/html")
    assert title == "Z\u00fcrich"
    assert "Z\u00fcrich is the largest city" in text
    assert extract_main_text(page, "text/html", encoding="cp1252").text == text


def test_markdown_escapes_that_a_model_would_copy_are_removed() -> None:
    page = ("<html><body><article><p>The zone is America/Sao_Paulo and the code is A*B for the long sample "
            "sentence here.</p><table><tr><td>x|y</td><td>snake_case</td></tr></table></article></body></html>")
    text = extract_main_text(page.encode(), "text/html").text
    assert "America/Sao_Paulo" in text and "A*B" in text and "snake_case" in text
    assert "\\_" not in text
