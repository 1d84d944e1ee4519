"""Write the sample capture that `kb demo` runs on.

A developer runs this once, after a change to the posts below:

    .venv/bin/python benchmarks/make_sample_data.py

It writes kb/sample_data/x/page-0001.json, page-0002.json, ... Each
file is one raw X `Bookmarks` GraphQL response, as the capture stage keeps
it: the same envelope, entry kinds and tweet object shapes that the X web
client receives. The posts, authors and links are written for this project;
no part comes from a real capture. The link targets are example.com and
example.org addresses, and the media addresses are never fetched.

The output is deterministic: ids, t.co codes and media codes come from
hashes of stable names, not from a random state. Thus a re-run writes the
same bytes, and tests/test_sample_data.py can check that the shipped pages
are exactly what this script writes.

Shapes, and the real capture that each one follows (../shared/fixtures/x):
- Two user formats. Most authors have the current format (name and
  screen_name in `core`, the bio in `profile_bio`); two authors have the
  older format (everything in `legacy`). Real captures hold both.
- legacy.full_text is HTML-escaped ("&amp;"), and entity indices count
  characters of the escaped text. note_tweet text is not escaped.
- A long post (weighted length over 280) keeps its text in note_tweet;
  legacy.full_text is cut at a word boundary near 275 characters, and
  legacy.entities keeps only the entities inside the cut.
- Several photos of one post share one t.co address and one pair of indices.
- A card names its target only by a t.co address. For a long post, that
  address is only in the note_tweet entity set. A poll card names
  "https://twitter.com", which no entity holds.
- An X Article post has the full text "https://t.co/...", lang "zxx", a
  card that has only a rest_id, and article.article_results.result.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

# The pages ship inside the package; this generator stays outside it.
OUTPUT_DIR = Path(__file__).resolve().parents[1] / "kb" / "sample_data" / "x"
# X's default page size is 20; smaller pages give the demo several pages.
PAGE_SIZES = (15, 15, 10)

SNOWFLAKE_EPOCH_MS = 1288834974657  # X's snowflake ids count from 2010-11-04
TWEET_TIME_FORMAT = "%a %b %d %H:%M:%S +0000 %Y"
WEB_APP_SOURCE = '<a href="https://mobile.twitter.com" rel="nofollow">Twitter Web App</a>'
IPHONE_SOURCE = '<a href="http://twitter.com/download/iphone" rel="nofollow">Twitter for iPhone</a>'
LINK_MARK = re.compile(r"\{link:(?P<url>[^}]+)\}")
MENTION = re.compile(r"(?<![\w@])@(\w{1,15})")
HASHTAG = re.compile(r"(?<![\w#&])#(\w+)")
BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


# ---------------------------------------------------------------------------
# Content: authors and posts
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Author:
    handle: str
    name: str
    bio: str
    joined: str  # "2015-03-02 10:00"
    location: str
    followers: int
    # "current": name in `core`, bio in `profile_bio`; "older": all in `legacy`.
    user_format: str = "current"


@dataclass(frozen=True)
class Photo:
    alt: str
    width: int = 1600
    height: int = 1200


@dataclass(frozen=True)
class Video:
    duration_s: int
    # "amplify" (media key 13_) or "native" (media key 7_).
    kind: str = "native"
    width: int = 1280
    height: int = 720
    # X does not sort variants; one post keeps them out of order, so that a
    # reader must choose by bitrate, not by position.
    shuffled: bool = False


@dataclass(frozen=True)
class Gif:
    alt: str


@dataclass(frozen=True)
class Card:
    # "summary_large_image" or "summary": the target is the post's last link.
    kind: str
    title: str
    description: str


@dataclass(frozen=True)
class Poll:
    choices: tuple[tuple[str, int], ...]
    duration_minutes: int = 1440


@dataclass(frozen=True)
class Article:
    title: str
    preview: str
    published: str
    # Draft.js blocks: (type, text, link), where link is None or
    # (anchor words in the text, URL). No blocks: the preview-only shape
    # that a timeline gives when the request does not ask for the body.
    blocks: tuple[tuple[str, str, tuple[str, str] | None], ...] = ()


@dataclass(frozen=True)
class Post:
    key: str  # a stable name; ids and codes are derived from it
    author: str
    posted: str  # "2026-01-12 08:41"
    text: str = ""
    lang: str = "en"
    photos: tuple[Photo, ...] = ()
    video: Video | None = None
    gif: Gif | None = None
    card: Card | Poll | None = None
    article: Article | None = None
    quote: str | None = None  # key of the quoted post
    reply_to: str | None = None  # key of the post this one answers
    limited_replies: bool = False  # wrapped in TweetWithVisibilityResults
    source: str = WEB_APP_SOURCE


AUTHORS = {a.handle: a for a in (
    Author("dbinternals", "Mara Lindqvist",
           "Database internals: storage engines, indexes, query execution. Opinions are my own.",
           "2013-05-14 09:20", "Stockholm", 48210),
    Author("vectorlab_ai", "Priya Raman",
           "Search & retrieval engineer. Embeddings, ANN indexes, evaluation.",
           "2017-09-03 16:02", "Bengaluru", 22975),
    Author("ml_papers_daily", "Lena Park",
           "One machine learning paper a day, explained in plain words.",
           "2019-01-21 07:45", "Seoul", 131408, user_format="older"),
    Author("sysadmin_sam", "Sam Carter",
           "Ops engineer. PostgreSQL, backups, on-call stories.",
           "2011-11-30 22:10", "Leeds, England", 9114),
    Author("crumbandcrust", "Tomasz Nowak",
           "Home baker. Sourdough, rye, long fermentation.",
           "2020-04-02 18:33", "Kraków", 35630),
    Author("kitchenphysics", "Dev Okafor",
           "Food science for home cooks: heat, water, salt and time.",
           "2016-06-18 12:00", "Lagos", 77402, user_format="older"),
    Author("JuliaFerrante_h", "Julia Ferrante",
           "Historian of the Roman world. Roads, coins and ordinary lives.",
           "2014-02-27 08:15", "Roma", 60877),
    Author("istoriya_rim", "Алексей Смирнов",
           "История Древнего Рима простыми словами.",
           "2018-10-09 19:40", "Санкт-Петербург", 15302),
    Author("brotzeit_de", "Katrin Weber",
           "Brot, Sauerteig und Backgeschichte. Bäckermeisterin aus Freiburg.",
           "2015-08-11 06:30", "Freiburg im Breisgau", 12088),
    Author("tanaka_vec", "田中 由紀",
           "検索エンジンとベクトルデータベースのエンジニア。",
           "2016-12-01 03:00", "東京", 8731),
)}


POSTS = (
    # --- databases -----------------------------------------------------
    Post("db_hnsw", "dbinternals", "2026-01-12 08:41",
         "A vector database is not magic: most use an HNSW graph or IVF clusters. HNSW search walks a "
         "layered graph from the top layer down, and efSearch trades recall for latency. IVF scans only "
         "the nearest clusters. #databases #vectorsearch"),
    Post("vl_reply_m", "vectorlab_ai", "2026-01-12 11:05",
         "@dbinternals One more knob worth a mention: M, the number of links per node. A higher M gives "
         "better recall on hard datasets, and costs memory and build time.",
         reply_to="db_hnsw", source=IPHONE_SOURCE),
    Post("db_duckdb", "dbinternals", "2026-02-03 14:22",
         "Why is DuckDB so fast on a laptop? Four reasons, in order of impact.\n\n"
         "1. Columnar storage: a query reads only the columns it needs, and each column compresses well.\n\n"
         "2. Vectorized execution: operators work on batches of about 2,048 values, so the CPU spends its "
         "time on data, not on interpreter overhead.\n\n"
         "3. Morsel-driven parallelism: the scan is cut into small morsels that every core pulls from a "
         "shared queue.\n\n"
         "4. No client-server round trips: the engine runs inside your process.\n\n"
         "Longer write-up with benchmarks: {link:https://example.org/blog/why-duckdb-is-fast}",
         card=Card("summary_large_image", "Why DuckDB is fast: columnar storage and vectorized execution",
                   "The four design choices that make an in-process analytical database fast on one machine.")),
    Post("db_poll", "dbinternals", "2026-02-20 18:05",
         "Poll for people who run vector search in production: which index do you use?",
         card=Poll((("HNSW", 412), ("IVF-PQ", 133), ("DiskANN", 57), ("Flat (brute force)", 98)))),
    Post("db_lsm", "dbinternals", "2026-01-20 07:55",
         "Two good reads on LSM trees, if you want to know why write-heavy databases use them:\n"
         "{link:https://example.org/papers/log-structured-merge-tree}\n"
         "{link:https://example.com/blog/compaction-strategies-explained}"),
    Post("db_sqlite_wal", "dbinternals", "2025-11-04 10:12",
         "SQLite tip: turn on WAL mode (PRAGMA journal_mode=WAL). Readers no longer block the writer, and "
         "the writer no longer blocks readers. Still only one writer at a time. "
         "{link:https://example.com/docs/sqlite/wal}",
         card=Card("summary", "Write-Ahead Logging",
                   "How the WAL journal mode works, when to use it, and its limits.")),
    Post("db_filters", "dbinternals", "2026-03-16 09:30",
         "Reading @vectorlab_ai's notes on filtered ANN search. The short version: apply the metadata "
         "filter before the search, not after. Post-filtering a top-10 result with a strict filter can "
         "leave you with 2 hits & no warning."),
    # --- retrieval and machine learning --------------------------------
    Post("vl_hybrid", "vectorlab_ai", "2026-02-11 13:40",
         "Hybrid search beats either half alone on most of our test sets. BM25 finds exact names and rare "
         "terms; dense vectors find paraphrases. Fuse both ranked lists with reciprocal rank fusion (k=60). "
         "Write-up: {link:https://example.com/blog/hybrid-search-rrf}",
         card=Card("summary_large_image", "Hybrid search with reciprocal rank fusion",
                   "BM25 and dense retrieval fused by rank, with results on five public test sets.")),
    Post("vl_recall_chart", "vectorlab_ai", "2026-01-28 16:15",
         "Recall@10 against query latency for one HNSW index on 1M vectors, as efSearch goes from 16 to "
         "512. Past efSearch=128 you pay a lot of latency for very little recall.",
         photos=(Photo("Line chart. X axis: query latency in milliseconds, from 0.2 to 3.1. Y axis: recall "
                       "at 10, from 0.81 to 0.995. The curve is flat after efSearch 128.", 1800, 1100),
                 Photo("Table with efSearch values 16, 32, 64, 128, 256 and 512, and the recall and the "
                       "median latency for each value.", 1400, 900))),
    Post("vl_chunking", "vectorlab_ai", "2026-03-02 08:10",
         "Chunking advice for retrieval, after a year of getting it wrong:\n\n"
         "- Cut on paragraphs, not on a fixed number of characters. A sentence cut in half embeds badly.\n"
         "- Keep chunks between about 100 and 300 words. Small chunks lose context; big chunks blur the "
         "vector.\n"
         "- Put the title or the heading path in front of each chunk.\n"
         "- Return one best passage per document, not five passages of the same page.\n"
         "- Measure nDCG@10 on your own queries before and after each change. #RAG"),
    Post("vl_rerank", "vectorlab_ai", "2026-03-10 12:00",
         "Cross-encoder rerankers are slow but worth it on the top 50: they read the query and the passage "
         "together, so they catch negation and word order that a bi-encoder misses. Rerank only what the "
         "first stage already found.",
         limited_replies=True),
    Post("tanaka_filter", "tanaka_vec", "2026-02-15 02:30",
         "ベクトルデータベースを選ぶときは、インデックスの種類（HNSW か IVF か）だけでなく、"
         "メタデータによる絞り込みが検索の前に行われるかどうかも確認してください。"
         "後から絞り込むと、結果の件数が足りなくなることがあります。",
         lang="ja"),
    Post("tanaka_bm25", "tanaka_vec", "2026-03-05 04:45",
         "日本語の全文検索では、単語の区切りが文章に書かれていないので、BM25 の前に形態素解析か "
         "N-gram による分割が必要です。形態素解析は辞書にない新語や製品名に弱く、N-gram は索引が"
         "大きくなります。私たちのチームでは、両方の索引を作り、ベクトル検索の結果と順位で融合して"
         "います。新語は N-gram 側が拾い、言い換えはベクトル側が拾うので、どちらか一方だけのときより"
         "取りこぼしがかなり減りました。評価には自分たちの実際の検索ログから作った質問集を使っています。",
         lang="ja"),
    Post("ml_minilm", "ml_papers_daily", "2026-01-08 06:00",
         "Paper of the day: distilling a large sentence encoder into a 6-layer student. The student keeps "
         "most of the retrieval quality at a fraction of the cost. {link:https://example.org/papers/minilm-distillation}",
         card=Card("summary", "Deep self-attention distillation for small sentence encoders",
                   "A 6-layer student trained to copy the attention of a large teacher model.")),
    Post("ml_article", "ml_papers_daily", "2026-02-25 07:00",
         article=Article(
             "Evaluating retrieval without fooling yourself",
             "Most retrieval demos look good because the author picked the queries. Here is how to build a "
             "test set from real questions, which metric to read, and what to report with it.",
             "2026-02-25 06:40",
             (("unstyled", "Most retrieval demos look good because the author picked the queries. A real test "
                           "set starts from questions that people really asked.", None),
              ("header-two", "Pick the right metric", None),
              ("unstyled", "nDCG@10 rewards a system that puts the best passages first. Recall@100 tells you "
                           "whether a reranker has anything good to work with.", None),
              ("unordered-list-item", "Report nDCG@10 for the ranking that users see.", None),
              ("unordered-list-item", "Report Recall@100 for the candidates that a reranker sees.", None),
              ("header-two", "Build the test set from real queries", None),
              ("unstyled", "Take 50 to 200 queries from your logs and judge the top results by hand. The BEIR "
                           "collection shows the file format that most tools read.",
               ("The BEIR collection", "https://example.org/datasets/beir-format")),
              ("unstyled", "Report latency with quality: the p50 and the p95 of the same run.", None)))),
    Post("ml_gif", "ml_papers_daily", "2026-03-14 21:12",
         "Me, watching the validation loss go down at last after I fixed the learning rate warmup",
         gif=Gif("A cartoon cat jumps up and down with joy.")),
    Post("ml_quant_video", "ml_papers_daily", "2026-03-18 10:00",
         "Talk recording (12 min): quantizing embedding vectors to int8 and to binary codes. Binary cuts "
         "memory 32x; rescoring the top 100 with the full vectors wins back most of the recall.",
         video=Video(731, kind="amplify", width=1920, height=1080)),
    # --- operations -----------------------------------------------------
    Post("sam_pitr_video", "sysadmin_sam", "2026-02-07 19:20",
         "Five-minute demo: point-in-time recovery in PostgreSQL. Archive the WAL, take a base backup, then "
         "restore to the second before someone ran DELETE without a WHERE clause.",
         video=Video(297, shuffled=True)),
    Post("sam_backups", "sysadmin_sam", "2026-01-22 08:00",
         "Reminder: a backup that you have never restored is not a backup. Schedule a restore test every "
         "month, time it, and write the steps down. #sysadmin #postgres",
         source=IPHONE_SOURCE),
    Post("sam_vacuum", "sysadmin_sam", "2026-03-04 15:45",
         "Autovacuum settings that fixed table bloat on our busiest PostgreSQL tables: "
         "autovacuum_vacuum_scale_factor = 0.02 on those tables only, and cost_limit raised to 2000. "
         "Dead tuples went from 40% to < 5% in a week."),
    Post("sam_quote_wal", "sysadmin_sam", "2026-01-09 17:30",
         "We moved our job queue to WAL mode after reading this. The \"database is locked\" errors went "
         "away overnight.",
         quote="db_sqlite_wal"),
    # --- cooking and bread ----------------------------------------------
    Post("bread_basic", "crumbandcrust", "2026-01-17 09:10",
         "Sourdough bread, my everyday loaf:\n500 g bread flour\n375 g water\n100 g active starter\n10 g salt\n"
         "Bulk ferment to about a 50% rise, shape, cold retard overnight, bake at 250 °C in a Dutch oven.",
         photos=(Photo("A round sourdough loaf cut in half. The crumb is open with irregular holes, and the "
                       "crust is dark brown."),)),
    Post("bread_dense", "crumbandcrust", "2026-02-01 10:30",
         "Why does your sourdough bread come out dense? A checklist from three years of bad loaves:\n\n"
         "1. The starter is not active. Feed it and use it at its peak, when it has doubled and smells "
         "sweet and sour.\n"
         "2. Bulk fermentation was too short. Watch the dough, not the clock: a 50% rise, a domed top, "
         "bubbles at the sides.\n"
         "3. Too little tension when you shape.\n"
         "4. The oven was not hot enough. Preheat the pot for 45 minutes.\n"
         "5. You cut it warm. Let the crumb set for an hour. #sourdough"),
    Post("bread_boules", "crumbandcrust", "2026-03-08 16:00",
         lang="zxx",
         photos=(Photo("Three sourdough boules on a cooling rack, each scored with one curved cut.", 1536, 2048),)),
    Post("bread_shaping", "crumbandcrust", "2026-02-26 11:45",
         "Shaping a batard in 40 seconds: pre-shape, rest 20 minutes, fold the sides in, roll it up tight, "
         "seal the seam, into the banneton seam side up.",
         video=Video(41, kind="amplify", width=720, height=1280)),
    Post("bread_quote", "crumbandcrust", "2026-02-14 08:20",
         "This is why I bake the last 20 minutes with the lid off: first the surface must dry, then the "
         "crust can brown.",
         quote="kp_maillard"),
    Post("kp_maillard", "kitchenphysics", "2026-02-12 12:30",
         "Why does bread crust brown? The Maillard reaction between amino acids and sugars speeds up above "
         "about 140 °C, and it needs a dry surface. Steam early in the bake keeps the crust thin & glossy. "
         "{link:https://example.com/science/maillard-reaction}",
         card=Card("summary_large_image", "The Maillard reaction, explained for cooks",
                   "Why browning needs heat and a dry surface, and what steam does to a crust.")),
    Post("kp_zephyrine", "kitchenphysics", "2026-03-03 18:00",
         "Tested the Zephyrine-9 probe thermometer against a lab reference in boiling water and in an ice "
         "bath: it reads 0.3 °C high at 100 °C and 0.1 °C low at 0 °C. Good enough for sugar work, where "
         "soft ball (about 115 °C) and hard crack (about 150 °C) are far apart."),
    Post("kp_chocolate", "kitchenphysics", "2026-01-25 14:00",
         "Tempering chocolate with the seed method: melt dark chocolate to 45-50 °C, stir in chopped "
         "tempered chocolate until it cools to 31-32 °C, then test a smear on a knife.",
         video=Video(184)),
    Post("kp_salt", "kitchenphysics", "2025-12-10 11:00",
         "Salt pasta water at about 1%: 10 g per litre. Seawater is about 3.5%, so \"salty as the sea\" "
         "makes pasta too salty for most people."),
    Post("brot_roggen", "brotzeit_de", "2026-02-18 05:50",
         "Roggenbrot braucht Sauerteig: Roggenmehl bildet kaum Kleber, und erst die Säure bremst die "
         "Enzyme, damit die Krume nicht klebrig wird. Mein Ansatz: Roggenvollkornmehl und Wasser 1:1, "
         "16 Stunden bei 26 °C.",
         lang="de",
         photos=(Photo("Ein dunkles Roggenbrot, in Scheiben geschnitten, auf einem Holzbrett."),)),
    Post("brot_pompeji", "brotzeit_de", "2026-03-12 07:15",
         "In Pompeji fand man verkohlte Brote im Ofen einer Bäckerei. Sie sind vor dem Backen in acht "
         "Stücke eingeschnitten, wie ein Rad. So konnte man sie leicht brechen und teilen.",
         lang="de"),
    # --- history ----------------------------------------------------------
    Post("rome_trajan", "JuliaFerrante_h", "2026-01-30 09:00",
         "The Roman Empire reached its greatest extent under Trajan in 117 AD: about 5 million km², from "
         "Britain to Mesopotamia. Hadrian, his successor, gave up the new eastern provinces within a year.",
         photos=(Photo("Map of the Roman Empire in 117 AD. The provinces are shaded red, from Britannia in "
                       "the north-west to Mesopotamia in the east.", 2000, 1300),)),
    Post("rome_crisis", "JuliaFerrante_h", "2026-02-09 10:00",
         "The crisis of the third century, in one post.\n\n"
         "From 235 to 284 AD the Roman Empire had more than twenty emperors, and most of them died by "
         "violence. Three problems came at the same time: wars on two fronts (Sasanian Persia in the east, "
         "Goths and Alemanni on the Danube and the Rhine), a debased coinage (the silver in the "
         "antoninianus fell to a few per cent), and the Plague of Cyprian.\n\n"
         "For some years the empire was in three parts: the Gallic Empire, the Palmyrene Empire, and the "
         "core around Italy. Aurelian joined them again by 274, and Diocletian's reforms ended the crisis."),
    Post("rome_roads", "JuliaFerrante_h", "2026-03-06 08:30",
         article=Article(
             "How Roman roads were built",
             "A Roman road was not one layer of stone but several: a foundation of large stones, then gravel "
             "and concrete, then the paved surface, cambered so that rain ran off into ditches at the sides.",
             "2026-03-06 08:10")),
    Post("rome_quote_ru", "JuliaFerrante_h", "2026-02-22 12:40",
         "A good summary of the Tetrarchy (in Russian). The short version: Diocletian split the command of "
         "the empire among four rulers, because one emperor could not be on every frontier at once.",
         quote="ru_tetrarchy"),
    Post("rome_colosseum", "JuliaFerrante_h", "2025-10-15 15:00",
         "The Colosseum opened in 80 AD under Titus with 100 days of games. It held about 50,000 people, "
         "and a canvas awning, the velarium, gave them shade.",
         photos=(Photo("The Colosseum in Rome at sunset, seen from the north side.", 2048, 1365),)),
    Post("ru_tetrarchy", "istoriya_rim", "2026-02-21 17:00",
         "В 293 году Диоклетиан ввёл тетрархию: империей правили два августа и два цезаря. Каждый отвечал "
         "за свою границу. После его отставки в 305 году система быстро распалась.",
         lang="ru"),
    Post("ru_aqueduct", "istoriya_rim", "2026-01-19 13:25",
         "Римские акведуки работали только на силе тяжести: средний уклон акведука Ним, частью которого "
         "был мост Пон-дю-Гар, — около 25 сантиметров на километр. Как римляне измеряли уклон: "
         "{link:https://example.org/ru/rim/akveduki}",
         lang="ru",
         card=Card("summary", "Как строили римские акведуки",
                   "Хоробат, грома и уклон в четверть метра на километр.")),
)

# Bookmark times that are not "some hours after the post": an old post can
# be bookmarked late, so bookmark order differs from post order.
BOOKMARKED_AT = {
    "rome_colosseum": "2026-03-21 20:00",
    "db_sqlite_wal": "2026-01-09 18:00",
    "kp_salt": "2026-03-19 12:30",
}

# A bookmarked post that its author deleted afterwards: X sends a tombstone.
# (key, posted, bookmarked)
TOMBSTONE = ("deleted_post", "2025-12-02 09:00", "2026-01-15 22:10")


# ---------------------------------------------------------------------------
# Deterministic identifiers
# ---------------------------------------------------------------------------


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\x1f".join(parts).encode()).digest()


def _code(length: int, *parts: str) -> str:
    """A base62 code derived from `parts`: t.co paths, media file names."""
    number = int.from_bytes(_digest(*parts), "big")
    chars = []
    for _ in range(length):
        number, rest = divmod(number, 62)
        chars.append(BASE62[rest])
    return "".join(chars)


def _small_int(low: int, high: int, *parts: str) -> int:
    return low + int.from_bytes(_digest(*parts)[:4], "big") % (high - low + 1)


def parse_time(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%d %H:%M").replace(tzinfo=timezone.utc)


def snowflake(moment: datetime, *parts: str) -> str:
    """An X-style id: milliseconds since X's epoch in the high bits, so the id
    agrees with the post time, as real ids do."""
    ms = int(moment.timestamp() * 1000) + _small_int(0, 59_999, "ms", *parts)
    low = _small_int(0, (1 << 22) - 1, "low", *parts)
    return str(((ms - SNOWFLAKE_EPOCH_MS) << 22) | low)


def tco(*parts: str) -> str:
    return "https://t.co/" + _code(10, "tco", *parts)


def x_time(moment: datetime) -> str:
    return moment.strftime(TWEET_TIME_FORMAT)


def user_id(handle: str) -> str:
    return str(_small_int(10**8, 2 * 10**9, "user", handle))


def _graphql_id(kind: str, rest_id: str) -> str:
    return base64.b64encode(f"{kind}:{rest_id}".encode()).decode()


# ---------------------------------------------------------------------------
# Text and entities
# ---------------------------------------------------------------------------


def weighted_length(text: str) -> int:
    """X's length rule: a URL counts 23, a CJK or other wide character 2."""
    total = 0
    for part in re.split(r"(https://t\.co/\w+)", text):
        if part.startswith("https://t.co/"):
            total += 23
            continue
        for ch in part:
            cp = ord(ch)
            narrow = cp <= 4351 or 8192 <= cp <= 8205 or 8208 <= cp <= 8223 or 8242 <= cp <= 8247
            total += 1 if narrow else 2
    return total


def display_url(url: str) -> str:
    """As X shows a link: no scheme, no "www.", the path cut after 15
    characters ("cnn.com/2026/08/06/afr…" in the captures)."""
    bare = url.split("://", 1)[1].removeprefix("www.")
    host, slash, path = bare.partition("/")
    path = slash + path
    return host + (path if len(path) <= 15 else path[:15] + "…")


@dataclass
class RenderedText:
    """A post's text with its t.co links in place, and the entities on it."""

    text: str
    urls: list[dict] = field(default_factory=list)
    mentions: list[dict] = field(default_factory=list)
    hashtags: list[dict] = field(default_factory=list)


def render(post: Post, *, escape: bool) -> RenderedText:
    """Put t.co addresses in place of {link:...} marks, then find the
    entities. With escape=True the text is HTML-escaped first, as in
    legacy.full_text, and the indices count the escaped characters."""
    raw = html.escape(post.text, quote=False) if escape else post.text
    out = RenderedText(text="")
    pieces: list[str] = []
    position = 0
    for match in LINK_MARK.finditer(raw):
        pieces.append(raw[position:match.start()])
        url = html.unescape(match["url"])
        short = tco(post.key, url)
        start = sum(len(p) for p in pieces)
        out.urls.append({"display_url": display_url(url), "expanded_url": url,
                         "indices": [start, start + len(short)], "url": short})
        pieces.append(short)
        position = match.end()
    pieces.append(raw[position:])
    out.text = "".join(pieces)
    for match in MENTION.finditer(out.text):
        handle = match[1]
        if handle not in AUTHORS:
            raise ValueError(f"post {post.key}: @{handle} is not one of the sample authors")
        out.mentions.append({"id_str": user_id(handle), "indices": [match.start(), match.end()],
                             "name": AUTHORS[handle].name, "screen_name": handle})
    for match in HASHTAG.finditer(out.text):
        out.hashtags.append({"indices": [match.start(), match.end()], "text": match[1]})
    return out


def cut_for_legacy(text: str, lang: str) -> str:
    """legacy.full_text of a long post: the text cut at the last word
    boundary at or before 275 weighted characters (the captures cut there).
    Japanese has no spaces between words, so it is cut at the limit."""
    cut = ""
    for ch in text:
        if weighted_length(cut + ch) > 275:
            break
        cut += ch
    if cut != text and lang not in ("ja", "zh", "ko") and " " in cut[-40:]:
        cut = cut[: cut.rstrip().rfind(" ")]
    return cut.rstrip()


def _inside(entity: dict, limit: int) -> bool:
    return entity["indices"][1] <= limit


# ---------------------------------------------------------------------------
# Users, media, cards, articles
# ---------------------------------------------------------------------------


def user_object(handle: str) -> dict:
    author = AUTHORS[handle]
    rest_id = user_id(handle)
    joined = x_time(parse_time(author.joined))
    avatar = f"https://pbs.twimg.com/profile_images/{snowflake(parse_time(author.joined), 'avatar', handle)}/" \
             f"{_code(8, 'avatar', handle)}_normal.jpg"
    tweets = _small_int(800, 40000, "tweets", handle)
    following = _small_int(80, 2000, "following", handle)
    if author.user_format == "older":
        return {
            "__typename": "User",
            "id": _graphql_id("User", rest_id),
            "rest_id": rest_id,
            "affiliates_highlighted_label": {},
            "has_graduated_access": True,
            "is_blue_verified": False,
            "profile_image_shape": "Circle",
            "legacy": {
                "can_dm": False, "can_media_tag": True, "created_at": joined,
                "default_profile": True, "default_profile_image": False,
                "description": author.bio, "entities": {"description": {"urls": []}},
                "fast_followers_count": 0, "favourites_count": _small_int(100, 90000, "likes", handle),
                "followers_count": author.followers, "friends_count": following,
                "has_custom_timelines": False, "is_translator": False,
                "listed_count": author.followers // 90, "location": author.location,
                "media_count": tweets // 9, "name": author.name,
                "normal_followers_count": author.followers, "pinned_tweet_ids_str": [],
                "possibly_sensitive": False, "profile_image_url_https": avatar,
                "profile_interstitial_type": "", "screen_name": handle,
                "statuses_count": tweets, "translator_type": "none", "verified": False,
                "want_retweets": False, "withheld_in_countries": [],
            },
        }
    return {
        "__typename": "User",
        "id": _graphql_id("User", rest_id),
        "rest_id": rest_id,
        "affiliates_highlighted_label": {},
        "avatar": {"image_url": avatar},
        "core": {"created_at": joined, "name": author.name, "screen_name": handle},
        "dm_permissions": {"can_dm": False},
        "has_graduated_access": True,
        "is_blue_verified": handle in ("dbinternals", "JuliaFerrante_h"),
        "location": {"location": author.location},
        "media_permissions": {"can_media_tag": True},
        "privacy": {"protected": False},
        "profile_bio": {"description": author.bio},
        "profile_image_shape": "Circle",
        "relationship_counts": {"followers": author.followers, "following": following},
        "tweet_counts": {"media_tweets": tweets // 9, "tweets": tweets},
        "verification": {"verified": False},
    }


def _sizes(width: int, height: int) -> dict:
    def fit(limit: int) -> dict:
        scale = min(1.0, limit / max(width, height))
        return {"h": round(height * scale), "resize": "fit", "w": round(width * scale)}
    return {"large": fit(2048), "medium": fit(1200), "small": fit(680),
            "thumb": {"h": 150, "resize": "crop", "w": 150}}


def _media_common(post: Post, tweet_id: str, media_id: str, media_key: str, kind: str, number: int,
                  short: str, indices: list[int], width: int, height: int, older: bool) -> dict:
    site = "twitter.com" if older else "x.com"
    path = "video" if kind == "video" else "photo"
    item = {
        "display_url": f"{'pic.twitter.com' if older else 'pic.x.com'}/{short.rsplit('/', 1)[1]}",
        "expanded_url": f"https://{site}/{post.author}/status/{tweet_id}/{path}/{number}",
        "ext_media_availability": {"status": "Available"},
        "id_str": media_id,
        "indices": indices,
        "media_key": media_key,
        "original_info": {"focus_rects": [], "height": height, "width": width},
        "sizes": _sizes(width, height),
        "type": kind,
        "url": short,
    }
    if not older:
        item["media_results"] = {"result": {"media_key": media_key}}
    return item


def media_items(post: Post, tweet_id: str, posted: datetime, short: str, indices: list[int]) -> list[dict]:
    older = AUTHORS[post.author].user_format == "older"
    items = []
    for number, photo in enumerate(post.photos, start=1):
        media_id = snowflake(posted - timedelta(seconds=30), "photo", post.key, str(number))
        item = _media_common(post, tweet_id, media_id, f"3_{media_id}", "photo", number, short, indices,
                             photo.width, photo.height, older)
        item["ext_alt_text"] = photo.alt
        item["features"] = {size: {"faces": []} for size in ("large", "medium", "small", "orig")}
        item["media_url_https"] = f"https://pbs.twimg.com/media/{_code(15, 'photo', post.key, str(number))}.jpg"
        items.append(dict(sorted(item.items())))
    if post.video is not None:
        video = post.video
        media_id = snowflake(posted - timedelta(minutes=2), "video", post.key)
        amplify = video.kind == "amplify"
        item = _media_common(post, tweet_id, media_id, f"{13 if amplify else 7}_{media_id}", "video", 1,
                             short, indices, video.width, video.height, older)
        folder = f"amplify_video/{media_id}" if amplify else f"ext_tw_video/{media_id}/pu"
        tag = 14 if amplify else 12
        item["additional_media_info"] = {"monetizable": False}
        item["media_url_https"] = (f"https://pbs.twimg.com/{'amplify_video_thumb' if amplify else 'ext_tw_video_thumb'}"
                                   f"/{media_id}/{'' if amplify else 'pu/'}img/{_code(16, 'thumb', post.key)}.jpg")
        portrait = video.height > video.width
        ladder = ((256000, 320), (832000, 540), (2176000, 720)) if portrait else \
                 ((256000, 270), (832000, 360), (2176000, 720))
        variants = [{"content_type": "application/x-mpegURL",
                     "url": f"https://video.twimg.com/{folder}/pl/{_code(16, 'hls', post.key)}.m3u8?tag={tag}"}]
        for bitrate, short_side in ladder:
            if portrait:
                w, h = short_side, round(short_side * video.height / video.width)
            else:
                w, h = round(short_side * video.width / video.height), short_side
            variants.append({"bitrate": bitrate, "content_type": "video/mp4",
                             "url": f"https://video.twimg.com/{folder}/vid/avc1/{w}x{h}/"
                                    f"{_code(16, 'mp4', post.key, str(bitrate))}.mp4?tag={tag}"})
        if video.shuffled:
            variants = [variants[2], variants[0], variants[3], variants[1]]
        divisor = _gcd(video.width, video.height)
        item["video_info"] = {"aspect_ratio": [video.width // divisor, video.height // divisor],
                              "duration_millis": video.duration_s * 1000 + _small_int(0, 999, "ms", post.key),
                              "variants": variants}
        items.append(dict(sorted(item.items())))
    if post.gif is not None:
        media_id = snowflake(posted - timedelta(seconds=20), "gif", post.key)
        item = _media_common(post, tweet_id, media_id, f"16_{media_id}", "animated_gif", 1, short, indices,
                             480, 270, older)
        name = _code(15, "gif", post.key)
        item["ext_alt_text"] = post.gif.alt
        item["media_url_https"] = f"https://pbs.twimg.com/tweet_video_thumb/{name}.jpg"
        item["video_info"] = {"aspect_ratio": [16, 9], "variants": [
            {"bitrate": 0, "content_type": "video/mp4", "url": f"https://video.twimg.com/tweet_video/{name}.mp4"}]}
        items.append(dict(sorted(item.items())))
    return items


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _string(key: str, value: str, scribe_key: str | None = None) -> dict:
    inner = {"string_value": value, "type": "STRING"}
    if scribe_key:
        inner = {"scribe_key": scribe_key, **inner}
    return {"key": key, "value": inner}


def _image(key: str, url: str, width: int, height: int) -> dict:
    return {"key": key, "value": {"image_value": {"height": height, "url": url, "width": width}, "type": "IMAGE"}}


def link_card(post: Post, card: Card, target: dict, posted: datetime) -> dict:
    """A summary card for the post's last link. Its binding_values name the
    target only by t.co (card_url), as X sends it."""
    image_id = snowflake(posted - timedelta(minutes=1), "card", post.key)
    image = f"https://pbs.twimg.com/card_img/{image_id}/{_code(8, 'card', post.key)}?format=jpg&name="
    domain = target["expanded_url"].split("/")[2]
    bindings = []
    if card.kind == "summary_large_image":
        bindings += [_image("photo_image_full_size_large", image + "800x419", 800, 419),
                     _image("thumbnail_image", image + "400x400", 400, 209)]
    else:
        bindings += [_image("thumbnail_image", image + "144x144", 144, 144)]
    bindings += [
        _string("description", card.description),
        _string("domain", domain),
        _image("thumbnail_image_original", image + "orig", 1200, 628),
        _string("vanity_url", domain, "vanity_url"),
        _string("title", card.title),
    ]
    if card.kind == "summary_large_image":
        bindings += [_image("summary_photo_image_original", image + "orig", 1200, 628)]
    bindings += [_string("card_url", target["url"], "card_url")]
    return {
        "rest_id": target["url"],
        "legacy": {
            "binding_values": bindings,
            "card_platform": {"platform": {"audience": {"name": "production"},
                                           "device": {"name": "Swift", "version": "12"}}},
            "name": card.kind,
            "url": target["url"],
            "user_refs_results": [],
        },
    }


def poll_card(post: Post, poll: Poll, posted: datetime) -> dict:
    """A poll: no link. Its card_url binding is "https://twitter.com", which
    no url entity of the post holds."""
    card_id = snowflake(posted - timedelta(seconds=40), "poll", post.key)
    ends = posted + timedelta(minutes=poll.duration_minutes)
    iso = "%Y-%m-%dT%H:%M:%SZ"
    bindings = []
    for number, (label, count) in enumerate(poll.choices, start=1):
        bindings += [_string(f"choice{number}_label", label), _string(f"choice{number}_count", str(count))]
    bindings += [
        _string("end_datetime_utc", ends.strftime(iso)),
        {"key": "counts_are_final", "value": {"boolean_value": True, "type": "BOOLEAN"}},
        _string("duration_minutes", str(poll.duration_minutes)),
        _string("last_updated_datetime_utc", ends.strftime(iso)),
        _string("api", "capi://passthrough/1"),
        _string("card_url", "https://twitter.com", "card_url"),
    ]
    return {
        "rest_id": f"card://{card_id}",
        "legacy": {
            "binding_values": bindings,
            "card_platform": {"platform": {"audience": {"name": "production"},
                                           "device": {"name": "Swift", "version": "12"}}},
            "name": f"poll{len(poll.choices)}choice_text_only",
            "url": f"card://{card_id}",
            "user_refs_results": [],
        },
    }


def article_result(post: Post, article: Article) -> dict:
    published = parse_time(article.published)
    article_id = snowflake(published, "article", post.key)
    cover_id = snowflake(published - timedelta(minutes=5), "cover", post.key)
    result = {
        "cover_media": {
            "id": _graphql_id("ApiMedia", cover_id),
            "media_id": cover_id,
            "media_info": {"__typename": "ApiImage", "original_img_height": 800,
                           "original_img_url": f"https://pbs.twimg.com/media/{_code(15, 'cover', post.key)}.jpg",
                           "original_img_width": 2000},
            "media_key": f"3_{cover_id}",
        },
        "id": _graphql_id("ArticleEntity", article_id),
        "lifecycle_state": {"modified_at_secs": int(published.timestamp())},
        "metadata": {"first_published_at_secs": int(published.timestamp())},
        "preview_text": article.preview,
        "rest_id": article_id,
        "title": article.title,
    }
    if article.blocks:
        # The rich shape (TweetDetail with withArticleRichContentState):
        # Draft.js blocks; entityMap is a list of {key, value}, and an
        # entityRange names its entity by the number of that key.
        blocks, entity_map = [], []
        for number, (kind, text, link) in enumerate(article.blocks):
            ranges = []
            if link is not None:
                anchor, url = link
                ranges.append({"key": len(entity_map), "length": len(anchor), "offset": text.index(anchor)})
                entity_map.append({"key": str(len(entity_map)),
                                   "value": {"data": {"url": url}, "mutability": "MUTABLE", "type": "LINK"}})
            styles = [{"length": len(text), "offset": 0, "style": "Bold"}] if kind.startswith("header") else []
            blocks.append({"data": {}, "entityRanges": ranges, "inlineStyleRanges": styles,
                           "key": _code(5, "block", post.key, str(number)).lower(), "text": text, "type": kind})
        result["content_state"] = {"blocks": blocks, "entityMap": entity_map}
        result["media_entities"] = []
    return dict(sorted(result.items()))


# ---------------------------------------------------------------------------
# Tweets
# ---------------------------------------------------------------------------

POSTS_BY_KEY = {p.key: p for p in POSTS}


def tweet_id_of(post: Post) -> str:
    return snowflake(parse_time(post.posted), "tweet", post.key)


def _article_link_text(post: Post, article: dict) -> RenderedText:
    """An article post: its text is only the t.co link to the article."""
    link = f"http://x.com/i/article/{article['rest_id']}"
    short = tco(post.key, link)
    return RenderedText(text=short, urls=[{"display_url": display_url(link), "expanded_url": link,
                                           "indices": [0, len(short)], "url": short}])


def _legacy_text(post: Post, rendered: RenderedText, is_long: bool, media: bool) -> tuple[str, int, dict]:
    """(full_text, end of the display range, entities) for legacy. A long
    post keeps only its first part here, with the entities inside it."""
    full_text = cut_for_legacy(rendered.text, post.lang) if is_long else rendered.text
    display_end = len(full_text)
    found = {name: [e for e in values if _inside(e, display_end)]
             for name, values in (("hashtags", rendered.hashtags), ("urls", rendered.urls),
                                  ("user_mentions", rendered.mentions))}
    if AUTHORS[post.author].user_format == "older":
        # The older format lists every entity kind, empty or not.
        entities = {"hashtags": found["hashtags"], "symbols": [], "timestamps": [], "urls": found["urls"],
                    "user_mentions": found["user_mentions"]}
    else:
        entities = {name: values for name, values in found.items() if values}
    if media:
        full_text += (" " if full_text else "") + tco(post.key, "media")
    return full_text, display_end, entities


def _legacy(post: Post, tweet_id: str, rendered: RenderedText, is_long: bool, bookmarked: bool) -> dict:
    posted = parse_time(post.posted)
    has_media = bool(post.photos or post.video or post.gif)
    full_text, display_end, entities = _legacy_text(post, rendered, is_long, has_media)
    legacy = {
        "bookmark_count": _small_int(1, 900, "bookmarks", post.key),
        "bookmarked": bookmarked,
        "conversation_id_str": tweet_id,
        "created_at": x_time(posted),
        "display_text_range": [0, display_end],
        "entities": entities,
        "favorite_count": _small_int(3, 5000, "likes", post.key),
        "favorited": False,
        "full_text": full_text,
        "id_str": tweet_id,
        "is_quote_status": post.quote is not None,
        "lang": "zxx" if post.article is not None else post.lang,
        "quote_count": _small_int(0, 60, "quotes", post.key),
        "reply_count": _small_int(0, 120, "replies", post.key),
        "retweet_count": _small_int(0, 700, "retweets", post.key),
        "retweeted": False,
        "user_id_str": user_id(post.author),
    }
    if has_media:
        short = tco(post.key, "media")
        indices = [len(full_text) - len(short), len(full_text)]
        media = media_items(post, tweet_id, posted, short, indices)
        entities["media"] = media
        legacy["extended_entities"] = {"media": media}
    if has_media or rendered.urls:
        legacy["possibly_sensitive"] = False
        legacy["possibly_sensitive_editable"] = True
    if post.reply_to:
        _add_reply_fields(legacy, post)
    if post.quote:
        _add_quote_fields(legacy, post)
    return dict(sorted(legacy.items()))


def _add_reply_fields(legacy: dict, post: Post) -> None:
    """A reply starts with "@handle "; X leaves that out of the display range."""
    parent = POSTS_BY_KEY[post.reply_to]
    leading = f"@{parent.author} "
    if not post.text.startswith(leading):
        raise ValueError(f"post {post.key}: a reply must start with {leading!r}")
    legacy["display_text_range"][0] = len(leading)
    legacy["conversation_id_str"] = tweet_id_of(parent)
    legacy["in_reply_to_screen_name"] = parent.author
    legacy["in_reply_to_status_id_str"] = tweet_id_of(parent)
    legacy["in_reply_to_user_id_str"] = user_id(parent.author)


def _add_quote_fields(legacy: dict, post: Post) -> None:
    quoted = POSTS_BY_KEY[post.quote]
    quoted_id = tweet_id_of(quoted)
    legacy["quoted_status_id_str"] = quoted_id
    legacy["quoted_status_permalink"] = {
        "display": display_url(f"https://x.com/{quoted.author}/status/{quoted_id}"),
        "expanded": f"https://twitter.com/{quoted.author}/status/{quoted_id}",
        "url": tco(post.key, "quote", quoted_id),
    }


def _note_tweet(post: Post, note: RenderedText) -> dict:
    return {
        "is_expandable": True,
        "note_tweet_results": {"result": {
            "entity_set": {"hashtags": note.hashtags, "symbols": [], "timestamps": [],
                           "urls": note.urls, "user_mentions": note.mentions},
            "id": _graphql_id("NoteTweet", snowflake(parse_time(post.posted), "note", post.key)),
            "media": {"inline_media": []},
            "richtext": {"richtext_tags": []},
            "text": note.text,
        }},
    }


def _with_limited_replies(tweet: dict) -> dict:
    """Only some accounts may reply: X wraps the post. The inner object has
    no __typename (as in the captures)."""
    inner = {k: v for k, v in tweet.items() if k != "__typename"}
    return {"__typename": "TweetWithVisibilityResults", "tweet": inner, "limitedActionResults": {
        "limited_actions": [{"action": "Reply", "prompt": {
            "__typename": "CtaLimitedActionPrompt", "cta_type": "SeeConversation",
            "headline": {"entities": [], "text": "Who can reply?"},
            "subtext": {"entities": [], "text": "Only some accounts can reply."}}}]}}


def tweet_object(post: Post, *, bookmarked: bool, with_quote: bool = True) -> dict:
    """The tweet_results.result of one post, as the X web client gets it."""
    posted = parse_time(post.posted)
    tweet_id = tweet_id_of(post)
    article = article_result(post, post.article) if post.article is not None else None
    if article is not None:
        rendered, note = _article_link_text(post, article), None
    else:
        rendered = render(post, escape=True)
        unescaped = render(post, escape=False)
        note = unescaped if weighted_length(unescaped.text) > 280 else None

    tweet: dict = {
        "__typename": "Tweet",
        "rest_id": tweet_id,
        "core": {"user_results": {"result": user_object(post.author)}},
        "edit_control": {"edit_tweet_ids": [tweet_id],
                         "editable_until_msecs": str(int(posted.timestamp() * 1000) + 3_600_000),
                         "edits_remaining": "5", "is_edit_eligible": True},
        "is_translatable": post.lang not in ("en", "zxx"),
        "legacy": _legacy(post, tweet_id, rendered, note is not None, bookmarked),
        "source": post.source,
        "unmention_data": {},
        "views": {"count": str(_small_int(200, 400000, "views", post.key)), "state": "EnabledWithCount"},
    }
    if AUTHORS[post.author].user_format == "current":
        tweet["grok_translated_post_with_availability"] = {"is_available": False}
    if note is not None:
        tweet["note_tweet"] = _note_tweet(post, note)
    if isinstance(post.card, Card):
        links = (note or rendered).urls
        if not links:
            raise ValueError(f"post {post.key}: a link card needs a link in the text")
        tweet["card"] = link_card(post, post.card, links[-1], posted)
    elif isinstance(post.card, Poll):
        tweet["card"] = poll_card(post, post.card, posted)
    if article is not None:
        # The captures show an article post with a card that has only a rest_id.
        tweet["card"] = {"rest_id": rendered.urls[0]["url"]}
        tweet["article"] = {"article_results": {"result": article}}
    if post.quote and with_quote:
        # `bookmarked` is the owner's state: every quoted post here is a bookmark too.
        quoted = POSTS_BY_KEY[post.quote]
        tweet["quoted_status_result"] = {"result": tweet_object(quoted, bookmarked=True, with_quote=False)}
    tweet = dict(sorted(tweet.items(), key=lambda kv: (kv[0] != "__typename", kv[0])))
    return _with_limited_replies(tweet) if post.limited_replies else tweet


def tombstone() -> dict:
    text = "This Post was deleted by the Post author. Learn more"
    start = text.index("Learn more")
    return {"__typename": "TweetTombstone", "tombstone": {"__typename": "TextTombstone", "text": {
        "entities": [{"fromIndex": start, "ref": {"type": "TimelineUrl",
                                                   "url": "https://help.x.com/rules-and-policies/notices-on-x",
                                                   "urlType": "ExternalUrl"},
                      "toIndex": start + len("Learn more")}],
        "rtl": False, "text": text}}}


# ---------------------------------------------------------------------------
# Timeline entries and pages
# ---------------------------------------------------------------------------


def bookmark_time(post: Post) -> datetime:
    if post.key in BOOKMARKED_AT:
        return parse_time(BOOKMARKED_AT[post.key])
    # Some hours to a few days after the post.
    return parse_time(post.posted) + timedelta(minutes=_small_int(20, 6 * 24 * 60, "bookmarked", post.key))


def tweet_entry(tweet_id: str, sort_index: str, result: dict) -> dict:
    return {
        "content": {
            "__typename": "TimelineTimelineItem",
            "entryType": "TimelineTimelineItem",
            "itemContent": {
                "__typename": "TimelineTweet",
                "itemType": "TimelineTweet",
                "tweetDisplayType": "Tweet",
                "tweet_results": {"result": result},
            },
        },
        "entryId": f"tweet-{tweet_id}",
        "sortIndex": sort_index,
    }


def cursor_entry(kind: str, value: str, sort_index: str) -> dict:
    return {
        "content": {"__typename": "TimelineTimelineCursor", "cursorType": kind,
                    "entryType": "TimelineTimelineCursor", "value": value},
        "entryId": f"cursor-{kind.lower()}-{sort_index}",
        "sortIndex": sort_index,
    }


def cursor_value(sort_index: int) -> str:
    """An opaque cursor, like X's: base64 of bytes that hold the position."""
    return base64.b64encode(b"\x1c\x16" + sort_index.to_bytes(8, "big") + b"\x00\x00").decode()


def bookmark_entries() -> list[dict]:
    """Every bookmark, newest bookmark first. sortIndex is a snowflake of
    the bookmark time, so it falls down the timeline."""
    timed: list[tuple[datetime, str, dict]] = []
    for post in POSTS:
        timed.append((bookmark_time(post), tweet_id_of(post), tweet_object(post, bookmarked=True)))
    key, posted, bookmarked = TOMBSTONE
    timed.append((parse_time(bookmarked), snowflake(parse_time(posted), "tweet", key), tombstone()))
    timed.sort(key=lambda item: item[0], reverse=True)
    entries = []
    for moment, tweet_id, result in timed:
        sort_index = snowflake(moment, "bookmark", tweet_id)
        entries.append(tweet_entry(tweet_id, sort_index, result))
    return entries


def bookmarks_page(entries: list[dict], top: int, bottom: int) -> dict:
    items = list(entries)
    items.append(cursor_entry("Top", cursor_value(top), str(top)))
    items.append(cursor_entry("Bottom", cursor_value(bottom), str(bottom)))
    return {"data": {"bookmark_timeline_v2": {"timeline": {
        "instructions": [{"type": "TimelineAddEntries", "entries": items}],
        "responseObjects": {"feedbackActions": []},
    }}}}


def build_pages() -> list[dict]:
    """The pages of the sample capture, in capture order. After the pages
    that hold bookmarks comes one page with cursors only: that is how X ends
    a timeline, and a full capture keeps that page too."""
    entries = bookmark_entries()
    if sum(PAGE_SIZES) != len(entries):
        raise ValueError(f"PAGE_SIZES add up to {sum(PAGE_SIZES)}, but there are {len(entries)} bookmarks")
    pages = []
    start = 0
    for size in PAGE_SIZES:
        chunk = entries[start:start + size]
        start += size
        first, last = int(chunk[0]["sortIndex"]), int(chunk[-1]["sortIndex"])
        pages.append(bookmarks_page(chunk, top=first + 1, bottom=last - 1))
    end = int(entries[-1]["sortIndex"]) - 3
    pages.append(bookmarks_page([], top=end + 1, bottom=end))
    return pages


def page_bytes(page: dict) -> bytes:
    # X sends compact JSON with non-ASCII text as UTF-8; the pages keep that.
    return json.dumps(page, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def page_name(number: int) -> str:
    return f"page-{number:04d}.json"


def main(argv: list[str] | None = None) -> int:
    pages = build_pages()
    OUTPUT_DIR.mkdir(exist_ok=True)
    for old in OUTPUT_DIR.glob("page-*.json"):
        old.unlink()
    total = 0
    for number, page in enumerate(pages, start=1):
        data = page_bytes(page)
        (OUTPUT_DIR / page_name(number)).write_bytes(data)
        total += len(data)
    print(f"wrote {len(pages)} pages, {total} bytes, to {OUTPUT_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
