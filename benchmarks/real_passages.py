"""Real passages and real queries for the recall benchmarks (issue 49).

kb's vector index must find the true neighbours of real embeddings, not of
random vectors. This module cuts real text as kb cuts a document
(kb.apps.eval_retrieval.document_chunks(): the title as first paragraph, at
most 200 words per passage) from these sources, in this order:

1. scifact: the SciFact corpus (KB_SHARED_DIR/eval/scifact), 8,219 passages.
2. wcxb: the main text of the 1,497 WCXB development pages (hand-made).
3. extraction: kb's extract stage on the 400 pages of eval/extraction.
4. x: the texts of the X fixtures (fixtures/x).
5. packages: the long descriptions (README) of the installed Python
   packages (`*.dist-info/METADATA`).
6. manpages: the English manual pages of the machine (sections 1 to 8,
   rendered by groff as `man` renders them).
7. docstrings: the docstrings of the installed Python modules, of
   Python's own library and of Debian's Python packages, one document per
   module.

The shared sets hold about 27,000 passages. Sources 5 to 7 are real text
that people write and bookmark (package docs, manuals and API docs) and fill the set
to 100,000 passages and more. The order is fixed, so `--passages N` gives
the same passages on every machine with the same packages.

Queries of three kinds: the SciFact train queries (real questions), the
titles of WCXB pages (real titles of real pages), and the first line of a
docstring (real one-line summaries).
"""

from __future__ import annotations

import ast
import email
import gzip
import json
import os
import site
import subprocess
import sysconfig
import sys
from collections.abc import Iterator
from pathlib import Path

from bench_quality_cv import DATA, SPLIT

SHARED = DATA.parent.parent  # KB_SHARED_DIR (eval/scifact is two levels down)
SOURCES = ("scifact", "wcxb", "extraction", "x", "packages", "manpages", "docstrings")


def _scifact() -> Iterator[tuple[str, dict]]:
    from kb.apps.eval_retrieval import load_beir

    corpus, _, _ = load_beir(DATA, SPLIT)
    yield from corpus.items()


def _wcxb() -> Iterator[tuple[str, dict]]:
    for path in sorted((SHARED / "eval" / "wcxb-dev" / "dev" / "ground-truth").glob("*.json")):
        truth = json.loads(path.read_text())["ground_truth"]
        yield f"wcxb-{path.stem}", {"title": truth.get("title") or "", "text": truth.get("main_content") or ""}


def _extraction() -> Iterator[tuple[str, dict]]:
    from kb.enrich.extract import extract_html

    snippets = json.loads((SHARED / "eval" / "extraction" / "snippets.json").read_text())
    for path in sorted((SHARED / "eval" / "extraction" / "html").glob("*.html.gz")):
        page_id = path.name.split(".")[0]
        extracted = extract_html(gzip.decompress(path.read_bytes()), (snippets.get(page_id) or {}).get("url"))
        if extracted.text:
            yield f"extraction-{page_id}", {"title": extracted.title or "", "text": extracted.text}


def _texts_in(value) -> Iterator[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            if key in ("full_text", "text") and isinstance(inner, str) and len(inner.split()) > 3:
                yield inner
            else:
                yield from _texts_in(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _texts_in(inner)


def _x() -> Iterator[tuple[str, dict]]:
    seen: set[str] = set()
    for path in sorted((SHARED / "fixtures" / "x").glob("*.json")):
        for number, text in enumerate(_texts_in(json.loads(path.read_text()))):
            if text not in seen:
                seen.add(text)
                yield f"x-{path.stem}-{number}", {"title": "", "text": text}


def _site_packages() -> list[Path]:
    """The installed packages, then Python's own library and Debian's
    Python packages (their docstrings fill the set past 100,000)."""
    roots = [*site.getsitepackages(), sysconfig.get_paths()["stdlib"], "/usr/lib/python3/dist-packages"]
    return list(dict.fromkeys(Path(p) for p in roots if Path(p).is_dir()))


def _packages() -> Iterator[tuple[str, dict]]:
    for root in _site_packages():
        for meta in sorted(root.glob("*.dist-info/METADATA")):
            message = email.message_from_string(meta.read_text(errors="replace"))
            body = message.get_payload() if not message.is_multipart() else ""
            if isinstance(body, str) and len(body.split()) > 20:
                yield f"package-{meta.parent.name}", {"title": message.get("Summary") or "", "text": body}


MAN_PAGES_PER_FAMILY = 40


def _manpages() -> Iterator[tuple[str, dict]]:
    """The English manual pages, rendered as text. A page that is only a
    link to another page (`.so`) is skipped: its text comes once. At most
    MAN_PAGES_PER_FAMILY pages of one family (the name up to its first `_`
    or `.`): the Google Cloud CLI alone has 15,000 pages of one form."""
    families: dict[str, int] = {}
    for section in sorted(Path("/usr/share/man").glob("man[1-8]")):
        for path in sorted(section.glob("*.gz")):
            family = path.name.replace("_", ".").split(".")[0]
            if path.is_symlink() or families.get(family, 0) >= MAN_PAGES_PER_FAMILY:
                continue
            families[family] = families.get(family, 0) + 1
            source = gzip.decompress(path.read_bytes())
            if source.lstrip().startswith(b".so "):
                continue
            rendered = subprocess.run(["groff", "-Tutf8", "-man", "-P-cbu"], input=source,
                                      capture_output=True, timeout=60).stdout.decode(errors="replace")
            body = "\n".join(rendered.strip().splitlines()[1:-1])  # not the header and footer lines
            paragraphs = [" ".join(p.split()) for p in body.split("\n\n")]
            text = "\n\n".join(p for p in paragraphs if p)
            if len(text.split()) > 20:
                yield f"man-{path.name[:-3]}", {"title": path.name[:-3], "text": text}


def _module_docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (SyntaxError, ValueError, RecursionError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node)
            if text and len(text.split()) > 5:
                found.append(text)
    return found


def _docstrings() -> Iterator[tuple[str, dict]]:
    for root in _site_packages():
        for path in sorted(root.rglob("*.py")):
            if any(part in ("tests", "test", "site-packages", "dist-packages") for part in path.relative_to(root).parts[:-1]):
                continue
            docs = _module_docstrings(path)
            if docs:
                yield f"doc-{path.relative_to(root).as_posix()}", {"title": "", "text": "\n\n".join(docs)}


READERS = {"scifact": _scifact, "wcxb": _wcxb, "extraction": _extraction, "x": _x,
           "packages": _packages, "manpages": _manpages, "docstrings": _docstrings}


def passages(count: int | None, cache: Path | None = None) -> list[dict]:
    """The first `count` passage rows of the sources, in order, each with
    its `kind` (the source). With `cache`, the rows are kept in
    cache/passages-N.jsonl (cutting them again takes minutes)."""
    from kb.apps.eval_retrieval import document_chunks

    kept = cache / f"passages-{count or 'all'}.jsonl" if cache else None
    if kept and kept.is_file():
        return _unique_documents([json.loads(line) for line in kept.read_text().splitlines()])
    rows: list[dict] = []
    for kind in SOURCES:
        before = len(rows)
        for doc_id, doc in READERS[kind]():
            for row in document_chunks(doc_id, doc):
                row["kind"] = kind
                rows.append(row)
            if count is not None and len(rows) >= count:
                break
        print(f"{kind}: {len(rows) - before} passages", file=sys.stderr, flush=True)
        if count is not None and len(rows) >= count:
            break
    rows = _unique_documents(rows[:count] if count is not None else rows)
    if kept:
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _unique_documents(rows: list[dict]) -> list[dict]:
    """The rows with one id per document: a module of the same path in two
    library folders (the venv's and Debian's) gives two documents of one
    name. The passages of a document lie next to each other, so a name
    that comes back after another document is a second document."""
    seen: dict[str, int] = {}
    previous = None
    renamed = None
    for row in rows:
        doc_id = row["tweet_id"]
        if doc_id != previous:
            seen[doc_id] = seen.get(doc_id, 0) + 1
            renamed = doc_id if seen[doc_id] == 1 else f"{doc_id}#{seen[doc_id]}"
            previous = doc_id
        if renamed != doc_id:
            row["tweet_id"] = renamed
            row["chunk_id"] = f"{renamed}:{row['position']}"
    return rows


def queries(per_kind: int, rows: list[dict]) -> list[tuple[str, str]]:
    """(kind, text) queries: SciFact train queries, WCXB page titles, first
    lines of docstrings, `per_kind` of each kind that the rows hold."""
    from kb.apps.eval_retrieval import load_beir

    out: list[tuple[str, str]] = []
    _, scifact_queries, _ = load_beir(DATA, SPLIT)
    out += [("scifact", q) for q in list(scifact_queries.values())[:per_kind]]
    kinds = {r["kind"] for r in rows}
    if "wcxb" in kinds:
        titles = [doc["title"] for _, doc in _wcxb() if len(doc["title"].split()) >= 3]
        out += [("wcxb", t) for t in titles[::max(1, len(titles) // per_kind)][:per_kind]]
    if "docstrings" in kinds:
        firsts = []
        for r in rows:
            if r["kind"] == "docstrings" and r["position"] == 0:
                line = r["text"].strip().splitlines()[0]
                if 4 <= len(line.split()) <= 20:
                    firsts.append(line)
        out += [("docstrings", f) for f in firsts[::max(1, len(firsts) // per_kind)][:per_kind]]
    return out


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = passages(int(sys.argv[1]) if len(sys.argv) > 1 else None)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["kind"]] = counts.get(r["kind"], 0) + 1
    print(json.dumps({"passages": len(rows), "by_kind": counts, "words": sum(len(r["text"].split()) for r in rows)}))
