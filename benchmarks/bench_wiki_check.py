"""`kb wiki check` on a large generated wiki with planted faults.

    .venv/bin/python benchmarks/bench_wiki_check.py [--sources 150] [--entities 260] [--concepts 190]
        [--keep DIR] [--support-pairs 120]

It writes a wiki of generated pages (sources with their parsed files,
entities, concepts, topic pages) that passes every check, then plants
faults at known places: duplicate pages (a plural or other spelling of a
name, an alias, a reworded definition), broken links, pages missing from
index.md, claims whose cited paragraph says something else, and claims that
contradict a claim on another page. It runs the real CLI
(`kb wiki check PATH --json`) twice in a new KB_HOME: cold (the vector
cache is empty) and warm (the second run). It prints the time of each run,
the planted faults that the check missed, and the findings that no planted
fault explains (false findings). --support-pairs N also measures the support
threshold on N real SciFact claims (../shared). Figures go into
benchmarks/wiki_check.md with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WORDS = """harbor lantern copper meadow signal ledger orchard glacier compass falcon quarry beacon timber canyon
marble thistle ember garnet saddle prairie anchor willow cobalt tundra raven basalt juniper citadel bramble
sextant mosaic pylon dune cinder fjord heron kiln lattice mantle nectar obelisk pewter quill rampart sorrel
trellis umber vellum wharf yarrow zephyr alder bellows cairn dapple estuary ferrule gantry hollow ingot jetty
kestrel loom mallet nettle oxbow pannier quiver rivet spindle tallow urchin valve warren yoke azure bracken
cistern drover easel flint grotto hamlet isthmus jasper knoll lichen mortar nimbus osprey parapet""".split()
FIELDS = ["shipping", "astronomy", "textiles", "printing", "mining", "brewing", "cartography", "metallurgy",
          "horology", "glassmaking", "forestry", "beekeeping", "masonry", "weaving", "navigation", "pottery",
          "tanning", "milling", "distilling", "rope making", "bookbinding", "dyeing", "surveying", "fishing"]
CATEGORIES = ["a guild", "a workshop", "a trading house", "a society", "an academy", "a foundry", "a press",
              "a cooperative", "a laboratory", "an observatory", "a school", "a company"]
METHODS = ["a technique", "a method", "a measure", "a practice", "a rule", "a process", "a standard", "a tool"]
PURPOSES = ["to keep records of cargo", "to date old timber", "to test the purity of metal", "to grade wool",
            "to chart coastlines", "to time the tides", "to store grain", "to set type faster", "to cool a furnace",
            "to tan hides evenly", "to split slate", "to weigh coins", "to clean wool", "to dye linen blue",
            "to splice ropes", "to fire glaze", "to find north at night", "to drain a mine", "to age spirits",
            "to bind ledgers", "to mark boundaries", "to count fish stocks", "to pump bellows", "to polish lenses"]
VERBS = [("built", "constructed"), ("sold", "traded"), ("tested", "examined"), ("repaired", "mended"),
         ("designed", "drew up"), ("bought", "purchased"), ("shipped", "sent"), ("stored", "kept"),
         ("measured", "gauged"), ("painted", "coloured")]
SYNONYMS = {"large": "big", "small": "little", "new": "fresh", "old": "aged", "near": "close to"}
ADJECTIVES = list(SYNONYMS)


class Plan:
    """The wiki as text, and the faults planted in it."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.files: dict[str, str] = {}  # path relative to the wiki root -> text
        self.index: list[str] = []  # link targets that index.md lists
        self.planted: dict[str, set] = {"duplicates": set(), "dangling_links": set(), "index_mismatch": set(),
                                        "unsupported": set(), "contradiction_candidates": set()}
        self.source_paragraphs: dict[str, list[str]] = {}
        self.pages: dict[str, dict] = {}  # target -> {"name", "kind", "lines", "definition", "related"}

    def fact(self, name: str) -> tuple[str, str]:
        """(the sentence of a source, a claim that rewords it)."""
        verb, other_verb = self.rng.choice(VERBS)
        words = self.rng.sample(WORDS, 3)
        adjective = self.rng.choice(ADJECTIVES)
        year = self.rng.randint(1700, 1990)
        sentence = f"{name} {verb} a {adjective} {words[0]} {words[1]} near the {words[2]} in {year}."
        reworded = f"In {year}, {name} {other_verb} a {SYNONYMS[adjective]} {words[0]} {words[1]} by the {words[2]}."
        return sentence, reworded


def make_wiki(sources: int, entities: int, concepts: int, seed: int = 31) -> Plan:
    plan = Plan(seed)
    rng = plan.rng
    slugs = [f"source-{n:03d}" for n in range(sources)]
    for slug in slugs:
        plan.source_paragraphs[slug] = []
    names = set()

    def new_name(kind: str) -> str:
        while True:
            first, second = rng.sample(WORDS, 2)
            name = f"{first.title()} {second.title()}" if kind == "entity" else f"{first}-{second}"
            if name.lower() not in names:
                names.add(name.lower())
                return name

    def add_page(kind: str, name: str, definition: str, aliases: list[str] | None = None) -> str:
        folder = "entities" if kind == "entity" else "concepts"
        target = f"{folder}/{name}"
        lines = []
        slug = rng.choice(slugs)
        plan.source_paragraphs[slug].append(definition)
        lines.append(f"{definition} [[sources/{slug}#para{len(plan.source_paragraphs[slug])}]]")
        for _ in range(7):
            slug = rng.choice(slugs)
            sentence, reworded = plan.fact(name)
            plan.source_paragraphs[slug].append(sentence + " " + rng.choice(FILLERS))
            claim = reworded if rng.random() < 0.15 else sentence
            lines.append(f"- {claim} [[sources/{slug}#para{len(plan.source_paragraphs[slug])}]]")
        plan.pages[target] = {"name": name, "kind": kind, "lines": lines, "definition": definition,
                              "aliases": aliases or [], "related": [], "slug": slug}
        plan.index.append(target)
        return target

    for _ in range(entities):
        name = new_name("entity")
        add_page("entity", name, f"{name} was {rng.choice(CATEGORIES)} of {rng.choice(FIELDS)} in "
                                 f"{rng.choice(WORDS).title()}ton, set up in {rng.randint(1600, 1950)} "
                                 f"{rng.choice(PURPOSES)}, and its sign showed a {' and a '.join(rng.sample(WORDS, 2))}.")
    for _ in range(concepts):
        name = new_name("concept")
        add_page("concept", name, f"The {name.replace('-', ' ')} is {rng.choice(METHODS)} of {rng.choice(FIELDS)} "
                                  f"{rng.choice(PURPOSES)}, first written down in {rng.randint(1600, 1950)} by "
                                  f"{' '.join(w.title() for w in rng.sample(WORDS, 2))} with a {rng.choice(WORDS)}.")
    targets = list(plan.pages)
    for n, target in enumerate(targets):  # a ring and two more links: no page is an orphan
        ring = targets[(n + 1) % len(targets)]
        plan.pages[target]["related"] = [ring] + rng.sample([t for t in targets if t not in (target, ring)], 2)
    plant_faults(plan, slugs, targets)
    write_pages(plan, slugs)
    return plan


FILLERS = ["The record says little more.", "Later accounts agree on this point.", "A letter of the time names it.",
           "The archive keeps the original note.", "Few other sources mention it."]
# Pairs of definitions of one subject, worded apart (not the pairs of tests/data).
REWORDED = [
    ("Tide timing is a method in navigation to predict high and low water in a harbour.",
     "Tidal prediction is a navigation technique that forecasts when the water in a port is high or low."),
    ("Type casting is a process in printing to make metal letters for a press.",
     "Letter founding is a printing process that casts metal type for the printing press."),
    ("Wool grading is a practice in textiles to sort fleece by the fineness of its fibre.",
     "Fleece classing is a textile practice that sorts wool according to how fine the fibres are."),
]


def plant_faults(plan: Plan, slugs: list[str], targets: list[str]) -> None:
    rng = plan.rng
    chosen = rng.sample(targets, 60)
    # Duplicates by name: a plural, another case and hyphens, an alias.
    for target in chosen[:4]:
        page = plan.pages[target]
        if page["kind"] == "concept":
            twin = f"concepts/{page['name']}s"
        else:
            twin = f"entities/{page['name'].upper()}"
        add_twin(plan, twin, page, slugs, aliases=[])
        plan.planted["duplicates"].add(frozenset({target, twin}))
    for n, target in enumerate(chosen[4:8]):
        page = plan.pages[target]
        folder = "entities" if page["kind"] == "entity" else "concepts"
        twin = f"{folder}/Other name {n}"
        add_twin(plan, twin, page, slugs, aliases=[page["name"]])
        plan.planted["duplicates"].add(frozenset({target, twin}))
    # Duplicates by definition: two pages, two names, one subject.
    for n, (first, second) in enumerate(REWORDED):
        pair = []
        for k, definition in enumerate((first, second)):
            target = f"concepts/reworded-{n}-{k}"
            slug = rng.choice(slugs)
            plan.source_paragraphs[slug].append(definition)
            lines = [f"{definition} [[sources/{slug}#para{len(plan.source_paragraphs[slug])}]]"]
            for _ in range(7):
                slug = rng.choice(slugs)
                sentence, _ = plan.fact(f"The reworded {n}{k}")
                plan.source_paragraphs[slug].append(sentence)
                lines.append(f"- {sentence} [[sources/{slug}#para{len(plan.source_paragraphs[slug])}]]")
            plan.pages[target] = {"name": f"reworded-{n}-{k}", "kind": "concept", "lines": lines,
                                  "definition": definition, "aliases": [], "related": rng.sample(targets, 3)}
            plan.index.append(target)
            plan.pages[rng.choice(targets)]["related"].append(target)
            pair.append(target)
        plan.planted["duplicates"].add(frozenset(pair))
    # Broken links.
    for n, target in enumerate(chosen[8:23]):
        plan.pages[target]["related"].append(f"entities/Nobody {n}")
        plan.planted["dangling_links"].add((page_rel(target), f"entities/Nobody {n}"))
    # Pages missing from index.md.
    for target in chosen[23:38]:
        plan.index.remove(target)
        plan.planted["index_mismatch"].add(page_rel(target))
    # Claims that their cited paragraph does not hold: the citation points
    # at a paragraph about another page.
    for target in chosen[38:53]:
        page = plan.pages[target]
        sentence, _ = plan.fact(page["name"])
        other = rng.choice(slugs)
        page["lines"].append(f"- {sentence} [[sources/{other}#para1]]")
        page["unsupported_line"] = len(page["lines"]) - 1
    # Contradictions: another page states a fact of the page with another year.
    for target in chosen[53:58]:
        page = plan.pages[target]
        fact_line = next(line for line in page["lines"][1:] if " in 1" in line and not line.startswith("- In "))
        claim = fact_line[2:fact_line.index(" [[")]
        year = claim.rsplit(" in ", 1)[1].rstrip(".")
        changed = claim.replace(page["name"], f"[[{target}]]", 1).replace(f" in {year}.", f" in {int(year) + 7}.")
        slug = rng.choice(slugs)
        plan.source_paragraphs[slug].append(plain(changed))
        host = rng.choice([t for t in targets if t not in chosen])
        plan.pages[host]["lines"].append(f"- {changed} [[sources/{slug}#para{len(plan.source_paragraphs[slug])}]]")
        plan.planted["contradiction_candidates"].add(frozenset({page_rel(target), page_rel(host)}))


def plain(text: str) -> str:
    import re
    return re.sub(r"\[\[(?:[^\]|]*/)?([^\]|]+)\]\]", r"\1", text)


def add_twin(plan: Plan, twin: str, page: dict, slugs: list[str], aliases: list[str]) -> None:
    rng = plan.rng
    name = twin.split("/", 1)[1]
    lines = []
    for _ in range(8):
        slug = rng.choice(slugs)
        sentence, _ = plan.fact(page["name"])
        plan.source_paragraphs[slug].append(sentence)
        lines.append(f"- {sentence} [[sources/{slug}#para{len(plan.source_paragraphs[slug])}]]")
    lines[0] = lines[0][2:]
    plan.pages[twin] = {"name": name, "kind": page["kind"], "lines": lines, "definition": "", "aliases": aliases,
                        "related": plan.rng.sample(list(plan.pages), 3)}
    plan.index.append(twin)
    plan.pages[plan.rng.choice(list(plan.pages))]["related"].append(twin)


def page_rel(target: str) -> str:
    return f"wiki/{target}.md"


def write_pages(plan: Plan, slugs: list[str]) -> None:
    for target, page in plan.pages.items():
        kind = page["kind"]
        kind_line = "kind: organization\n" if kind == "entity" else ""
        lines = [f"---\ntype: {kind}\nname: {json.dumps(page['name'])}\n{kind_line}aliases: {json.dumps(page['aliases'])}"
                 f"\nsources: [{', '.join(slugs[:2])}]\nupdated: 2026-11-20\n---", f"# {page['name']}", "",
                 page["lines"][0], "", "## Facts", *page["lines"][1:], "", "## Related",
                 *(f"- [[{t}]]" for t in page["related"])]
        text = "\n".join(lines) + "\n"
        plan.files[page_rel(target)] = text
        if "unsupported_line" in page:
            claim = page["lines"][page["unsupported_line"]]
            line_no = text.splitlines().index(claim) + 1
            plan.planted["unsupported"].add((page_rel(target), line_no))
    for slug in slugs:
        paragraphs = plan.source_paragraphs[slug] or ["This source has no facts yet."]
        plan.files[f"raw/parsed/web/{slug}.md"] = f"---\ntitle: {slug}\n---\n" + "\n\n".join(paragraphs) + "\n"
        mentioned = [t for t, p in plan.pages.items() if p.get("slug") == slug][:3] or plan.rng.sample(list(plan.pages), 2)
        body = [f"---\ntype: source\ntitle: \"{slug}\"\nsource_id: \"{slug}\"\nsource_type: web\n"
                f"raw: raw/parsed/web/{slug}.md\ningested: 2026-11-20\n---", f"# {slug}", "", "## Summary",
                "A generated source for the benchmark.", "It holds facts of several pages.",
                "Each paragraph is one fact.", "", "## Key points",
                *(f"- {plain(p).split('.')[0]}. [[sources/{slug}#para{i + 1}]]" for i, p in enumerate(paragraphs[:4])),
                "", "## Mentions", *(f"- [[{t}]]" for t in mentioned), f"- [[sources/{slugs[0]}]]"]
        plan.files[f"wiki/sources/{slug}.md"] = "\n".join(body) + "\n"
        plan.index.append(f"sources/{slug}")
    for n in range(10):
        topic = f"syntheses/topics/topic-{n}"
        links = plan.rng.sample(list(plan.pages), 4)
        plan.files[page_rel(topic)] = (
            f"---\ntype: synthesis\nkind: topic\nperiod: topic-{n}\nsources: []\ncreated: 2026-11-20\n---\n"
            f"# Topic {n}\n\n## Related\n" + "\n".join(f"- [[{t}]]" for t in links) + "\n")
        plan.index.append(topic)
    plan.files["index.md"] = "# Index\n\n" + "\n".join(f"- [[{t}]]" for t in plan.index) + "\n"


def write_files(plan: Plan, root: Path) -> None:
    for rel, text in plan.files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


def score(plan: Plan, findings: dict[str, list[dict]]) -> tuple[list, list]:
    """(planted faults that no finding names, findings that no planted fault explains)."""
    found: dict[str, set] = {kind: set() for kind in plan.planted}
    false = []
    for kind, items in findings.items():
        for item in items:
            key = finding_key(kind, item)
            if kind in plan.planted and key in plan.planted[kind]:
                found[kind].add(key)
            else:
                false.append((kind, item))
    missed = [(kind, key) for kind, keys in plan.planted.items() for key in keys if key not in found[kind]]
    return missed, false


def finding_key(kind: str, item: dict):
    if kind == "duplicates":
        return frozenset({item["page"][5:-3], item["other"][5:-3]})
    if kind == "dangling_links":
        return (item["page"], item["link"])
    if kind == "index_mismatch":
        return item["page"]
    if kind == "unsupported":
        return (item["page"], item["line"])
    if kind == "contradiction_candidates":
        return frozenset({item["page"], item["other"]})
    return (kind, json.dumps(item, sort_keys=True))


def run_check(root: Path, home: Path) -> tuple[float, float, dict]:
    """(wall seconds, CPU seconds of the process, the findings)."""
    import resource

    env = {**os.environ, "KB_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).parent / "kb"), "wiki", "check", str(root), "--json"],
                          capture_output=True, text=True, env=env, cwd=REPO)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if proc.returncode not in (0, 1):
        raise SystemExit(f"kb wiki check failed: {proc.stderr[-2000:]}")
    return seconds, cpu, json.loads(proc.stdout)


def measure_support(claims_wanted: int) -> None:
    """The support threshold on real pairs: SciFact claims against the
    sentences of their evidence abstract (held) and of the abstract that
    shares the most words among 400 others (not held)."""
    from kb.wiki.coherence import SUPPORT_COSINE, _pieces, content_words, local_embed

    folder = REPO.parent / "shared" / "eval" / "scifact"
    corpus = {row["_id"]: row["text"] for row in map(json.loads, open(folder / "corpus.jsonl"))}
    claims = {row["_id"]: row["text"] for row in map(json.loads, open(folder / "queries.train.jsonl"))}
    evidence: dict[str, list[str]] = {}
    for line in list(open(folder / "qrels.train.tsv"))[1:]:
        query, doc, _ = line.split("\t")
        evidence.setdefault(query, []).append(doc)
    chooser, docs, embed = random.Random(7), list(corpus), local_embed()
    held, near = [], []
    for query in sorted(evidence)[:claims_wanted]:
        words = content_words(claims[query])
        others = [d for d in chooser.sample(docs, 400) if d not in evidence[query]]
        nearest = max(others, key=lambda d: len(words & content_words(corpus[d])))
        for doc, out in ((evidence[query][0], held), (nearest, near)):
            vectors = embed([claims[query]] + _pieces(corpus[doc]))
            out.append(float((vectors[1:] @ vectors[0]).max()))
    print(f"support on {len(held)} SciFact claims (threshold now {SUPPORT_COSINE}):")
    for threshold in (0.40, 0.45, 0.50, 0.55, 0.60, 0.65):
        kept = sum(c >= threshold for c in held)
        taken = sum(c >= threshold for c in near)
        print(f"  {threshold:.2f}: evidence held {kept}/{len(held)}, nearest other abstract held {taken}/{len(near)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", type=int, default=150)
    parser.add_argument("--entities", type=int, default=260)
    parser.add_argument("--concepts", type=int, default=190)
    parser.add_argument("--keep", help="write the wiki here and keep it")
    parser.add_argument("--support-pairs", type=int, default=0, help="also measure the support threshold")
    args = parser.parse_args()
    if args.support_pairs:
        measure_support(args.support_pairs)
    plan = make_wiki(args.sources, args.entities, args.concepts)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep) if args.keep else Path(tmp) / "wiki"
        write_files(plan, root)
        pages = sum(1 for rel in plan.files if rel.startswith("wiki/"))
        planted = sum(len(v) for v in plan.planted.values())
        print(f"wiki: {pages} pages, {planted} planted faults "
              f"({', '.join(f'{k} {len(v)}' for k, v in plan.planted.items())})")
        home = Path(tmp) / "kb_home"
        for label in ("cold", "warm"):
            load = os.getloadavg()[0]
            seconds, cpu, findings = run_check(root, home)
            missed, false = score(plan, findings)
            total = sum(len(v) for v in findings.values())
            print(f"{label}: {seconds:.1f} s wall, {cpu:.1f} s CPU (load {load:.1f} at the start), {total} findings, "
                  f"missed {len(missed)} of {planted}, false {len(false)} ({100 * len(false) / max(total, 1):.1f} %)")
        for kind, key in missed:
            print(f"  missed {kind}: {sorted(key) if isinstance(key, frozenset) else key}")
        from collections import Counter
        print("  false by kind:", dict(Counter(kind for kind, _ in false)))
        for kind, item in false[:25]:
            print(f"  false {kind}: {json.dumps(item)[:300]}")


if __name__ == "__main__":
    main()
