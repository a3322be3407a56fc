"""A multi-turn search environment over a small local corpus (corpus.jsonl, shipped here): the model
searches with `<search>query</search>`, reads the top documents, and answers with
`<answer>...</answer>`; the reward is exact match with the label (case, spaces and a final period
ignored). The facts are invented, so the model cannot know them: it has to search.

    --environment-path search_env.SearchEnv     (with PYTHONPATH=examples/search_env)

    python examples/search_env/search_env.py --out DIR    # DIR/train.jsonl, DIR/eval.jsonl (questions)
    python examples/search_env/search_env.py --corpus     # rewrite corpus.jsonl (deterministic)
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import random
import re
from collections import Counter
from pathlib import Path

from lean_rl.rollout.environment import Observation, StepResult
from lean_rl.rollout.rewards import exact_match

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus.jsonl"
TOP_K = 2
SYSTEM = ("Answer the question using the encyclopedia. To search it, write <search>your query</search> and "
          "stop; the results come back in the next message. When you know the answer, write "
          "<answer>the answer</answer>.")
_TAG = re.compile(r"<(search|answer)>(.*?)(?:</\1>|$)", re.S)
_WORD = re.compile(r"[a-z0-9]+")


class SearchEnv:
    def __init__(self, cfg, sample):
        self.label = str(sample.label)
        self.searches = 0

    async def reset(self, sample):
        return None

    async def step(self, action: str) -> StepResult:
        tags = _TAG.findall(action)
        if not tags:  # neither a search nor an answer: the episode ends unrewarded (no hint to loop on)
            return StepResult(None, 0.0, True, {"action": "none"})
        kind, text = tags[-1]
        if kind == "answer":
            correct = exact_match(text.strip(), self.label)
            return StepResult(None, 1.0 if correct else 0.0, True, {"action": "answer", "answer": text.strip()[:200]})
        self.searches += 1
        docs = search(text)
        results = "\n".join(f"[{i + 1}] {d}" for i, d in enumerate(docs)) or "no results"
        return StepResult(Observation(text=f"<result>\n{results}\n</result>"), None, False,
                          {"action": "search", "query": text.strip()[:200]})


def search(query: str, k: int = TOP_K) -> list[str]:
    """The k documents sharing the most query words, words weighted by inverse document frequency."""
    docs, idf = _index()
    words = set(_WORD.findall(query.lower()))
    scored = [(sum(idf[w] for w in words & doc_words), i) for i, (doc_words, _) in enumerate(docs)]
    return [docs[i][1] for score, i in sorted(scored, key=lambda x: (-x[0], x[1]))[:k] if score > 0]


@functools.lru_cache(maxsize=1)
def _index():
    texts = [json.loads(line)["text"] for line in CORPUS.read_text().splitlines() if line.strip()]
    docs = [(set(_WORD.findall(t.lower())), t) for t in texts]
    df = Counter(w for words, _ in docs for w in words)
    return docs, {w: math.log(len(docs) / n) for w, n in df.items()}


# ---------------------------------------------------------------- data
def _name(rng: random.Random, syllables: int) -> str:
    parts = ["ka", "lo", "mir", "zen", "tha", "qu", "vor", "eli", "dra", "sun", "bel", "or", "ix", "na", "ru"]
    return "".join(rng.choice(parts) for _ in range(syllables)).capitalize()


def _facts(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    facts, used = [], set()
    while len(facts) < 40:
        country, capital, river = _name(rng, 3) + "land", _name(rng, 2), _name(rng, 2)
        if {country, capital, river} & used:
            continue
        used |= {country, capital, river}
        facts.append({"country": country, "capital": capital, "river": river, "founded": str(rng.randint(900, 1900))})
    return facts


def write_corpus(path: Path = CORPUS) -> None:
    lines = []
    for f in _facts():
        lines.append({"text": f"{f['country']} is a country whose capital is {f['capital']}."})
        lines.append({"text": f"The longest river of {f['country']} is the {f['river']}; "
                              f"{f['country']} was founded in {f['founded']}."})
    path.write_text("".join(json.dumps(row) + "\n" for row in lines))


def write_questions(out: Path) -> None:
    rows = []
    for f in _facts():
        for question, _, answer in _questions(f):
            rows.append({"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                         "label": answer})
    random.Random(1).shuffle(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:100]))
    (out / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[100:]))


def _questions(fact: dict) -> list[tuple[str, str, str]]:
    """(question, the search that finds it, answer) for each fact of a country."""
    country = fact["country"]
    return [(f"What is the capital of {country}?", f"capital of {country}", fact["capital"]),
            (f"What is the longest river of {country}?", f"longest river of {country}", fact["river"]),
            (f"In which year was {country} founded?", f"{country} founded", fact["founded"])]


def write_traces(out: Path, n: int = 96, seed: int = 7) -> None:
    """Whole episodes (search, results, answer) for the supervised warm start (--loss-type sft_loss),
    about countries of another invented world (seed 7) than the corpus's: the model learns to search and
    to read the answer off the results, not the corpus's facts. The results are rendered as SearchEnv
    renders them (the first TOP_K documents that share words with the query, here the country's two)."""
    rows = []
    for fact in _facts(seed):
        country = fact["country"]
        docs = [f"{country} is a country whose capital is {fact['capital']}.",
                f"The longest river of {country} is the {fact['river']}; {country} was founded in {fact['founded']}."]
        for question, query, answer in _questions(fact):
            first = docs if "capital" in query else docs[::-1]  # the document that answers ranks first
            results = "\n".join(f"[{i + 1}] {d}" for i, d in enumerate(first[:TOP_K]))
            rows.append({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question},
                                      {"role": "assistant", "content": f"<search>{query}</search>"},
                                      {"role": "user", "content": f"<result>\n{results}\n</result>"},
                                      {"role": "assistant", "content": f"<answer>{answer}</answer>"}],
                         "label": answer})
    random.Random(2).shuffle(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:n]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the questions here")
    parser.add_argument("--corpus", action="store_true", help="rewrite corpus.jsonl")
    args = parser.parse_args()
    if args.corpus:
        write_corpus()
        print(f"wrote {CORPUS}")
    if args.out:
        write_questions(args.out)
        write_traces(args.out)
        print(f"wrote {args.out}/train.jsonl, eval.jsonl and traces.jsonl")
