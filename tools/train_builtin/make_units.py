#!/usr/bin/env python3
"""Turns the corpus and the rendered conversations into units.jsonl and the text lines to tokenize.

    make_units.py CORPUS CONVERSATIONS PROMPTS OUTDIR
CORPUS: extract_corpus.py's output; CONVERSATIONS: make_conversations.py's; PROMPTS: one JSON
string a line, `gptoss harmony-render --jsonl` of the conversations' requests. Writes
OUTDIR/units.jsonl and OUTDIR/texts.jsonl (one JSON string a line, for `gptoss tokenize`).
Plain text units: Devil's Dictionary entries ("WORD, n. ...") and passages of 4 consecutive
verses, so the model also learns the English itself. Standard library only.
"""
import json
import sys


def main():
    corpus, convs, prompts, out = sys.argv[1:5]
    units, texts = [], []
    verses = []
    for line in open(corpus):
        u = json.loads(line)
        if u["kind"] == "definition":
            t = f"{u['word'].upper()}: {u['text']}"
            units.append({"kind": "text"}); texts.append(t)
        else:
            verses.append(u)
    for i in range(0, len(verses), 4):
        t = " ".join(f"{v['ref']} {v['text']}" for v in verses[i:i + 4])
        units.append({"kind": "text"}); texts.append(t)
    prompt_lines = open(prompts).read().splitlines()
    conv_lines = open(convs).read().splitlines()
    assert len(prompt_lines) == len(conv_lines), "one rendered prompt per conversation"
    for p, c in zip(prompt_lines, conv_lines):
        units.append({"kind": "chat"})
        texts.append(json.loads(p)); texts.append(json.loads(c)["completion"])
    with open(f"{out}/units.jsonl", "w") as f:
        for u in units:
            f.write(json.dumps(u) + "\n")
    with open(f"{out}/texts.jsonl", "w") as f:
        for t in texts:
            f.write(json.dumps(t) + "\n")
    print(f"make_units: {len(units)} units, {len(texts)} texts", file=sys.stderr)


if __name__ == "__main__":
    main()
