"""Generate the small English data that ships with lit-embed under ``lit_embed/data/sample/``.

A seeded probabilistic grammar writes paragraphs about a few topics; every word comes from the
lists below, written for this project. The text has enough structure (agreement, topic words that
co-occur, fixed phrases) for a tiny masked language model to show a falling loss in a minute.

* ``corpus.txt``: the pre-training corpus of the demo (one paragraph per line).
* ``topics/{train,validation,test}.tsv``: the demo's fine-tuning task ``topics`` (columns ``text``,
  ``label``): two sentences about the labelled topic, and in half of the examples a third sentence
  about another topic placed anywhere, so a model must weigh the topic words rather than spot one.

    python tools/make_sample_corpus.py            # rewrites the shipped files
    python tools/make_sample_corpus.py --check    # exits 1 if a shipped file is stale
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

TOPICS = {
    "garden": {
        "nouns": ["garden", "tomato", "rose", "seed", "soil", "leaf", "root", "gardener", "bee", "flower"],
        "verbs": ["grows", "needs", "waters", "plants", "feeds", "covers", "shades", "protects"],
        "adjs": ["green", "wet", "sunny", "small", "wild", "healthy", "young", "fragrant"],
        "places": ["in the garden", "near the fence", "under the old tree", "by the greenhouse"],
    },
    "kitchen": {
        "nouns": ["cook", "soup", "bread", "oven", "knife", "onion", "recipe", "pan", "kettle", "spoon"],
        "verbs": ["heats", "cuts", "bakes", "stirs", "tastes", "serves", "boils", "mixes"],
        "adjs": ["hot", "fresh", "salty", "sweet", "crisp", "warm", "thick", "spicy"],
        "places": ["in the kitchen", "on the stove", "at the table", "beside the sink"],
    },
    "sea": {
        "nouns": ["sailor", "ship", "wave", "harbour", "whale", "storm", "anchor", "island", "net", "gull"],
        "verbs": ["crosses", "follows", "reaches", "pulls", "watches", "leaves", "circles", "lifts"],
        "adjs": ["blue", "rough", "deep", "calm", "cold", "salty", "distant", "grey"],
        "places": ["at sea", "near the harbour", "off the coast", "beyond the reef"],
    },
    "school": {
        "nouns": ["teacher", "student", "lesson", "book", "question", "answer", "class", "pencil", "map", "test"],
        "verbs": ["reads", "writes", "explains", "answers", "studies", "draws", "repeats", "checks"],
        "adjs": ["clever", "quiet", "long", "difficult", "simple", "curious", "careful", "new"],
        "places": ["in the classroom", "at the library", "after the bell", "during the lesson"],
    },
    "city": {
        "nouns": ["driver", "bus", "street", "bridge", "market", "tower", "train", "crowd", "light", "station"],
        "verbs": ["stops", "passes", "waits", "crosses", "carries", "opens", "closes", "fills"],
        "adjs": ["busy", "noisy", "tall", "bright", "crowded", "narrow", "late", "early"],
        "places": ["in the city", "at the station", "near the market", "across the bridge"],
    },
    "forest": {
        "nouns": ["fox", "owl", "deer", "path", "pine", "river", "hunter", "wolf", "moss", "trail"],
        "verbs": ["hides", "hunts", "finds", "crosses", "hears", "follows", "climbs", "rests"],
        "adjs": ["dark", "silent", "ancient", "thick", "cold", "hidden", "tall", "quick"],
        "places": ["in the forest", "by the river", "along the trail", "under the pines"],
    },
}
TIMES = ["every morning", "at night", "in the spring", "after the rain", "before noon", "all summer", "today"]
LINKS = ["then", "later", "soon", "meanwhile", "afterwards"]
DETS = ["the", "a", "every", "one", "that"]


def plural(noun: str) -> str:
    if noun.endswith(("s", "sh", "ch")):
        return noun + "es"
    if noun.endswith("f"):
        return noun[:-1] + "ves"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def base_verb(verb: str) -> str:
    if verb.endswith(("shes", "ches", "sses", "xes")):
        return verb[:-2]
    if verb.endswith("ies"):
        return verb[:-3] + "y"
    return verb[:-1]


def sentence(rng: random.Random, words: dict[str, list[str]]) -> str:
    subject, obj = rng.sample(words["nouns"], 2)
    verb = rng.choice(words["verbs"])
    adj = rng.choice(words["adjs"])
    form = rng.randrange(6)
    if form == 0:
        text = f"{rng.choice(DETS)} {adj} {subject} {verb} the {obj} {rng.choice(words['places'])}"
    elif form == 1:
        text = f"the {plural(subject)} {base_verb(verb)} {rng.choice(['the', 'some', 'many'])} {plural(obj)} {rng.choice(TIMES)}"
    elif form == 2:
        text = f"{rng.choice(TIMES)} , the {subject} {verb} a {adj} {obj}"
    elif form == 3:
        text = f"the {obj} is {adj} because the {subject} {verb} it {rng.choice(words['places'])}"
    elif form == 4:
        text = f"{rng.choice(LINKS)} the {subject} {verb} the {obj} and the {obj} becomes {adj}"
    else:
        text = f"does the {subject} {base_verb(verb)} the {adj} {obj} {rng.choice(words['places'])} ?"
    end = "" if text.endswith("?") else " ."
    return (text + end).capitalize()


def corpus(seed: int = 13, paragraphs: int = 3000) -> str:
    rng = random.Random(seed)
    names = sorted(TOPICS)
    lines = []
    for _ in range(paragraphs):
        words = TOPICS[rng.choice(names)]
        lines.append(" ".join(sentence(rng, words) for _ in range(rng.randint(3, 6))))
    return "\n".join(lines) + "\n"


TOPIC_SPLITS = {"train": 1200, "validation": 300, "test": 300}


def topic_examples(rng: random.Random, count: int) -> str:
    """``text<TAB>label`` lines under a header; the label is the topic of the majority of sentences."""
    names = sorted(TOPICS)
    lines = ["text\tlabel"]
    for _ in range(count):
        topic = rng.choice(names)
        sentences = [sentence(rng, TOPICS[topic]) for _ in range(2)]
        if rng.random() < 0.5:
            other = rng.choice([n for n in names if n != topic])
            sentences.insert(rng.randrange(3), sentence(rng, TOPICS[other]))
        lines.append(f"{' '.join(sentences)}\t{topic}")
    return "\n".join(lines) + "\n"


def sample_files(seed: int = 13) -> dict[str, str]:
    """Relative path -> content of every shipped sample file."""
    files = {"corpus.txt": corpus(seed)}
    rng = random.Random(seed + 1)
    for split, count in TOPIC_SPLITS.items():
        files[f"topics/{split}.tsv"] = topic_examples(rng, count)
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a shipped file differs")
    parser.add_argument("--out", default=str(Path(__file__).parents[1] / "lit_embed/data/sample"), help="folder")
    args = parser.parse_args()
    out = Path(args.out)
    files = sample_files()
    if args.check:
        stale = [name for name, text in files.items() if not (out / name).is_file() or (out / name).read_text() != text]
        for name in stale:
            print(f"stale: {out / name}", file=sys.stderr)
        return 1 if stale else 0
    for name, text in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path} ({len(text):,} characters, {text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
