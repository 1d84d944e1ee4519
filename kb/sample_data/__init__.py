"""The sample capture that `kb demo` runs on.

x/page-*.json are raw X `Bookmarks` responses, as the capture stage keeps
them: 40 bookmarks over three pages, then one page with cursors only (X ends
a timeline so). benchmarks/make_sample_data.py wrote them; the posts are
written for this project. Change the posts there and run it again; do not edit the
pages by hand (a test compares them with what the generator writes).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

SAMPLE_DIR = Path(__file__).resolve().parent / "x"


class DemoQuery(NamedTuple):
    """A search that `kb demo` runs, and the author whose post must answer it."""

    query: str
    expected_author: str  # X handle, without "@"
    why: str


DEMO_QUERIES: tuple[DemoQuery, ...] = (
    DemoQuery("vector database", "dbinternals",
              "a post of @dbinternals starts with the words 'A vector database'"),
    DemoQuery("sourdough bread", "crumbandcrust",
              "two posts of @crumbandcrust are about sourdough bread"),
    DemoQuery("roman empire", "JuliaFerrante_h",
              "@JuliaFerrante_h writes about the Roman Empire under Trajan and in the third century"),
    DemoQuery("Zephyrine-9", "kitchenphysics",
              "a rare exact keyword: it occurs in one post only, and no semantic neighbour may push it out"),
    DemoQuery("how do I restore a database backup", "sysadmin_sam",
              "a question in other words than the posts: 'never restored', 'point-in-time recovery'"),
)


def sample_pages() -> list[Path]:
    """The sample pages in capture order (page-0001.json first)."""
    pages = sorted(SAMPLE_DIR.glob("page-*.json"))
    if not pages:
        raise FileNotFoundError(
            f"No sample pages in {SAMPLE_DIR}. The package data is missing: reinstall kb, "
            "or run `python benchmarks/make_sample_data.py` in a source tree.")
    return pages
