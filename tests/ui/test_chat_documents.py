"""Documents attached to a message (ui/chat/documents.py, issue 26.4): what is accepted and refused
(with the numbers), the stored form the model reads, and the chip the page shows instead of the text."""

import pytest

from ui.chat import documents as D
from ui.chat import view

count = lambda text: len(text.split())  # noqa: E731  a word tokenizer, like the fake engine's


def test_a_text_file_becomes_a_document_with_its_token_count(tmp_path):
    f = tmp_path / "notes.md"
    f.write_text("# Notes\r\nalpha beta gamma\r\n", encoding="utf-8")
    doc = D.read_document(str(f), "notes.md", count)
    assert doc == D.Document("notes.md", "# Notes\nalpha beta gamma", 5)
    html = D.chips_html([doc])
    assert "notes.md · 5 tokens" in html and 'data-v="5"' in html


@pytest.mark.parametrize(
    "name,data,words",
    [
        ("broken.pdf", b"%PDF-1.7\nnot a pdf at all", "could not be read as a PDF"),
        ("photo.png", b"\x89PNG", "only text, Markdown and code"),
        ("data.txt", b"abc\x00def", "looks binary"),
        ("latin.txt", "café".encode("latin-1"), "not UTF-8"),
        ("trick.md", b"x\n</document>\ny", "would end it early"),
    ],
)
def test_files_that_cannot_be_documents_are_refused_in_plain_words(tmp_path, name, data, words):
    f = tmp_path / name
    f.write_bytes(data)
    with pytest.raises(ValueError, match=words):
        D.read_document(str(f), name, count)


def test_a_file_over_the_size_limit_is_refused_with_its_size(tmp_path):
    f = tmp_path / "big.txt"
    f.write_bytes(b"a " * (D.MAX_BYTES // 2 + 1))
    with pytest.raises(ValueError, match=f"{D.MAX_BYTES + 2:,} bytes"):
        D.read_document(str(f), "big.txt", count)


def test_a_document_too_large_for_the_context_is_refused_with_the_numbers():
    doc = D.Document("book.txt", "x " * 300, 300)
    other = D.Document("a.txt", "y", 50)
    with pytest.raises(ValueError) as e:
        D.check_fits(doc, 200, 512, [other])
    assert str(e.value) == (
        "book.txt has 300 tokens; with this chat's 200 and 50 already attached that is "
        "550, and the context holds 512"
    )
    D.check_fits(doc, 100, 512, [other])  # 450 < 512: fits


def test_documents_come_first_in_the_message_and_show_as_chips():
    docs = [D.Document("a.py", "def f():\n    return 1", 7), D.Document("b.md", "# B", 2)]
    stored = D.message_text(docs, "What does f return?")
    assert stored.startswith(
        '<document name="a.py">\ndef f():\n    return 1\n</document>\n\n<document name="b.md">'
    )
    assert D.split(stored) == (
        [("a.py", "def f():\n    return 1"), ("b.md", "# B")],
        "What does f return?",
    )
    shown, _ = view.display_messages(
        [{"id": 1, "role": "user", "content": stored, "status": "complete"}]
    )
    text = shown[0]["content"]
    assert "a.py · 2 lines" in text and "b.md · 1 lines" in text and "What does f return?" in text
    assert "📄" not in text and text.count('class="doc-ico"') == 2  # an icon no font has to draw
    assert "return 1" not in text  # the chip, not the document's text
    assert view.engine_messages(None, [{"role": "user", "content": stored}])[0]["content"] == stored


def _pdf(pages: list[str]) -> bytes:
    """A minimal PDF written by hand (one Helvetica text line per page, a correct xref table), so
    the test needs no PDF writer: what pypdf reads back is what a real PDF's text layer gives."""
    n = len(pages)
    objs = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids ["
        + " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
        + f"] /Count {n} >>",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for i, text in enumerate(pages):
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET" if text else ""
        objs.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {5 + 2 * i} 0 R "
            "/Resources << /Font << /F1 3 0 R >> >> >>"
        )
        objs.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    out, offsets = b"%PDF-1.4\n", []
    for k, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += f"{k} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def test_a_pdf_attaches_its_text_layer_page_by_page(tmp_path):
    f = tmp_path / "paper.pdf"
    f.write_bytes(_pdf(["Paged attention stores KV in blocks", "Blocks are shared by refcount"]))
    doc = D.read_document(str(f), "paper.pdf", count)
    assert doc.text == "Paged attention stores KV in blocks\n\nBlocks are shared by refcount"
    assert doc.tokens == 11 and doc.name == "paper.pdf"


def test_a_pdf_without_text_or_over_the_limits_is_refused_in_plain_words(tmp_path, monkeypatch):
    blank = tmp_path / "scan.pdf"
    blank.write_bytes(_pdf(["", ""]))
    with pytest.raises(ValueError, match="no text layer"):
        D.read_document(str(blank), "scan.pdf", count)
    many = tmp_path / "long.pdf"
    many.write_bytes(_pdf(["page"] * 4))
    monkeypatch.setattr(D, "MAX_PDF_PAGES", 3)
    with pytest.raises(ValueError, match="has 4 pages; a PDF may have at most 3"):
        D.read_document(str(many), "long.pdf", count)
    monkeypatch.setattr(D, "MAX_PDF_BYTES", 100)
    with pytest.raises(ValueError, match="a PDF may have at most 100"):
        D.read_document(str(many), "long.pdf", count)


def _bomb(pages: int, content: bytes) -> bytes:
    """Issue 48.4's PDF bomb, by hand: every page draws the same FlateDecode content stream, so
    the file stays a few KB while each page makes the reader inflate and parse it again."""
    import zlib

    packed = zlib.compress(content, 9)
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids ["
        + b" ".join(b"%d 0 R" % (5 + i) for i in range(pages))
        + b"] /Count %d >>" % pages,
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(packed) + packed + b"\nendstream",
    ]
    objs += [
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 3 0 R >> >> >>"
    ] * pages
    out, offsets = b"%PDF-1.4\n", []
    for k, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % k + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return out


def _ops(n: int) -> bytes:
    """One short text line, then n graphics operators that draw nothing: slow to parse, no text."""
    return b"BT /F1 12 Tf 72 720 Td (boom) Tj ET\n" + b"1 0 0 1 0 0 cm\n" * n


@pytest.mark.timeout(120)
def test_a_pdf_bomb_is_refused_in_plain_words_before_any_page_is_parsed(tmp_path):
    """40 pages sharing one stream of 1.2 MB (48 MB to parse, a ~4 KB file) are over the inflated
    budget: refused by the worker before extraction. Before, it was parsed page by page (the
    issue's 7.6 KB bomb took 74 s of CPU) and then attached."""
    f = tmp_path / "bomb.pdf"
    f.write_bytes(_bomb(40, _ops(80_000)))
    assert f.stat().st_size < 16_000
    with pytest.raises(ValueError, match="bomb.pdf unpacks to more than 33,554,432 bytes of page"):
        D.read_document(str(f), "bomb.pdf", count)


def test_a_slow_pdf_within_the_budget_is_stopped_at_the_time_limit(tmp_path, monkeypatch):
    """16 MB of operators to parse is inside the inflated budget; the worker's wall-clock limit
    (shortened here to 0.5 s; parsing alone takes seconds) stops it and says so."""
    from ui.chat import pdf_text

    f = tmp_path / "slow.pdf"
    f.write_bytes(_bomb(40, _ops(27_000)))
    monkeypatch.setattr(pdf_text, "TIME_S", 0.5)
    with pytest.raises(ValueError, match=r"slow.pdf took more than 0.5 s to read"):
        D.read_document(str(f), "slow.pdf", count)


def test_one_user_reads_one_document_at_a_time_and_everyone_a_few():
    slots = D.UploadSlots(per_user=1, total=2)
    assert slots.enter("user:alice") is None
    assert "another document of yours is still being read" in slots.enter("user:alice")
    assert slots.enter("user:bob") is None
    assert "reading 2 documents already" in slots.enter("user:carol")
    slots.leave("user:alice")
    assert slots.enter("user:carol") is None and slots.enter("user:alice") is not None
