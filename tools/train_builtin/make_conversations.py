#!/usr/bin/env python3
"""Generates the built-in model's training conversations as Chat Completions requests.

Reads the public-domain corpus (corpus.jsonl from extract_corpus.py) and writes JSON lines
{"request": {...}, "completion": "..."}: `request` is what a client would send (rendered later by
`gptoss harmony-render --jsonl`, so the prompt format is exactly the server's), `completion` is
the harmony text the model must learn to sample after `<|start|>assistant` (analysis, then final,
or analysis then a function call). Standard library only; deterministic from --seed.
"""
import argparse
import json
import random
import re

SYSTEM_PROMPTS = [None, None, "You are a helpful assistant.", "You are a concise assistant.",
                  "Answer briefly and politely.", "You are a friendly assistant. Keep answers short."]
EFFORTS = [None, "low", "medium", "high"]

CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Oslo", "Cairo", "Lima", "Sydney",
          "Toronto", "Chicago", "Boston", "Dublin", "Vienna", "Prague", "Lisbon", "Athens", "Seoul",
          "Nairobi", "Denver", "Austin", "Seattle", "Mumbai", "Delhi", "Moscow", "Warsaw", "Zurich"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "clear", "stormy"]
NAMES = ["Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Irene", "Jack"]
TOPICS = ["the meeting", "the report", "lunch", "the trip", "the budget", "the party", "the plan"]


def tool(name, description, props, required):
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props, "required": required}}}


TOOLS = {
    "get_weather": tool("get_weather", "Get the current weather in a city",
                        {"location": {"type": "string", "description": "The city name"},
                         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                        ["location"]),
    "get_time": tool("get_time", "Get the current local time in a city",
                     {"city": {"type": "string"}}, ["city"]),
    "add_numbers": tool("add_numbers", "Add two numbers",
                        {"a": {"type": "number"}, "b": {"type": "number"}}, ["a", "b"]),
    "lookup_word": tool("lookup_word", "Look up the meaning of an English word",
                        {"word": {"type": "string"}}, ["word"]),
    "send_email": tool("send_email", "Send a short email",
                       {"to": {"type": "string"}, "subject": {"type": "string"}},
                       ["to", "subject"]),
}


def first_sentence(text, limit=240):
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    s = m.group(1) if m else text
    return s if len(s) <= limit else None


def request(rng, messages, tools=None):
    r = {"model": "builtin", "messages": []}
    sp = rng.choice(SYSTEM_PROMPTS)
    if sp:
        r["messages"].append({"role": rng.choice(["system", "developer"]), "content": sp})
    r["messages"] += messages
    e = rng.choice(EFFORTS)
    if e:
        r["reasoning_effort"] = e
    if tools:
        r["tools"] = tools
    return r


def answer(analysis, final):
    return (f"<|channel|>analysis<|message|>{analysis}<|end|>"
            f"<|start|>assistant<|channel|>final<|message|>{final}<|return|>")


def call(analysis, name, args):
    # The form our renderer writes for an earlier assistant tool call (chat_format.cpp), so a
    # sampled call and a replayed one look the same.
    return (f"<|channel|>analysis<|message|>{analysis}<|end|>"
            f"<|start|>assistant to=functions.{name}<|channel|>commentary <|constrain|>json"
            f"<|message|>{json.dumps(args)}<|call|>")


class Gen:
    def __init__(self, rng, definitions, verses):
        self.rng = rng
        self.defs = definitions  # [(word, definition sentence)]
        self.verses = verses      # [(reference, verse)]
        self.keyword_verses = {}
        for ref, v in verses:
            for w in set(re.findall(r"[a-z]{5,}", v.lower())):
                self.keyword_verses.setdefault(w, []).append((ref, v))
        self.keywords = sorted(k for k, v in self.keyword_verses.items() if 3 <= len(v) <= 400)

    def other_tools(self, exclude):
        names = [n for n in TOOLS if n != exclude]
        return [TOOLS[n] for n in self.rng.sample(names, self.rng.randint(0, 2))]

    def define(self):
        r = self.rng
        word, d = r.choice(self.defs)
        q = r.choice([f"What is {word}?", f"Define {word}.", f"What does the word {word} mean?",
                      f"Give me a definition of {word}.", f"{word}: what is it?",
                      f"Tell me what {word} means."])
        a = r.choice([f"The user asks for the meaning of \"{word}\". I will give a short definition.",
                      f"Define {word}. A witty one-sentence definition will do.",
                      f"They want to know what {word} means. Answer in one sentence."])
        final = r.choice(["", f"{word.capitalize()}: ", f"Here is a definition. {word.capitalize()}: "]) + d
        tools = self.other_tools("lookup_word") if r.random() < 0.3 else None
        return request(r, [{"role": "user", "content": q}], tools), answer(a, final)

    def verse(self):
        r = self.rng
        k = r.choice(self.keywords)
        ref, v = r.choice(self.keyword_verses[k])
        q = r.choice([f"Quote a verse about {k}.", f"Give me a line that mentions {k}.",
                      f"Tell me an old saying about {k}.", f"Find a verse with the word {k}."])
        a = r.choice([f"The user wants a verse that mentions {k}. {ref} has one.",
                      f"A line about {k}: {ref} fits."])
        final = r.choice([f"{ref}: {v}", f"From {ref}: \"{v}\"", f"{v} ({ref})"])
        return request(r, [{"role": "user", "content": q}]), answer(a, final)

    def small_talk(self):
        r = self.rng
        name = r.choice(NAMES)
        pairs = [
            ("Hello!", "The user greets me. Greet back and offer help.", "Hello! How can I help you today?"),
            ("Hi", "A greeting. Reply politely.", "Hi! What can I do for you?"),
            ("How are you?", "The user asks how I am. Answer kindly.", "I am doing well, thank you. How can I help?"),
            ("Who are you?", "The user asks who I am. I am a small built-in model.",
             "I am a tiny toy language model built into gptoss. I can chat a little and call tools."),
            ("What can you do?", "Explain my abilities briefly.",
             "I can answer simple questions, define words, quote old verses, and call functions when you offer them."),
            (f"My name is {name}.", f"The user is called {name}. Greet them by name.", f"Nice to meet you, {name}!"),
            ("Thank you!", "The user thanks me. Reply politely.", "You are welcome!"),
            ("Goodbye.", "The user is leaving. Say goodbye.", "Goodbye! Have a nice day."),
            ("Tell me a joke.", "A short joke is wanted.", "Why did the scarecrow win an award? Because he was outstanding in his field."),
            ("Say something in one word.", "One word only.", "Hello."),
        ]
        q, a, f = r.choice(pairs)
        return request(r, [{"role": "user", "content": q}]), answer(a, f)

    def arithmetic(self):
        r = self.rng
        x, y = r.randint(0, 20), r.randint(0, 20)
        op = r.choice(["plus", "minus", "times"])
        v = x + y if op == "plus" else x - y if op == "minus" else x * y
        sym = {"plus": "+", "minus": "-", "times": "*"}[op]
        q = r.choice([f"What is {x} {op} {y}?", f"Compute {x} {sym} {y}.", f"{x} {sym} {y} = ?"])
        return request(r, [{"role": "user", "content": q}]), answer(f"{x} {sym} {y} = {v}.", f"{x} {sym} {y} = {v}.")

    # Tool use: the call, then (a second sample) the answer after the tool result.
    def tool_case(self):
        r = self.rng
        kind = r.choice(["get_weather", "get_weather", "get_time", "add_numbers", "lookup_word", "send_email"])
        if kind == "get_weather":
            c = r.choice(CITIES)
            q = r.choice([f"What is the weather in {c}?", f"How is the weather in {c} today?",
                          f"Is it raining in {c}?", f"Weather for {c}, please."])
            args = {"location": c}
            if r.random() < 0.3:
                args["unit"] = r.choice(["celsius", "fahrenheit"])
            t = r.randint(-5, 35)
            cond = r.choice(CONDITIONS)
            result = {"temperature": t, "condition": cond}
            final = r.choice([f"It is {t} degrees and {cond} in {c}.", f"The weather in {c} is {cond}, {t} degrees."])
            a1 = f"The user asks about the weather in {c}. I should call get_weather."
            a2 = f"The tool says {t} degrees and {cond}. Report it."
        elif kind == "get_time":
            c = r.choice(CITIES)
            q = r.choice([f"What time is it in {c}?", f"Tell me the time in {c}.", f"Current time in {c}?"])
            args = {"city": c}
            hh, mm = r.randint(0, 23), r.randint(0, 59)
            result = {"time": f"{hh:02d}:{mm:02d}"}
            final = r.choice([f"It is {hh:02d}:{mm:02d} in {c}.", f"The local time in {c} is {hh:02d}:{mm:02d}."])
            a1 = f"The user wants the time in {c}. Call get_time."
            a2 = f"The tool returned {hh:02d}:{mm:02d}. Tell the user."
        elif kind == "add_numbers":
            x, y = r.randint(0, 999), r.randint(0, 999)
            q = r.choice([f"Use the tool to add {x} and {y}.", f"What is {x} + {y}? Use add_numbers.",
                          f"Please add {x} and {y}."])
            args = {"a": x, "b": y}
            result = {"sum": x + y}
            final = r.choice([f"{x} + {y} = {x + y}.", f"The sum is {x + y}."])
            a1 = f"I need to add {x} and {y}. Call add_numbers."
            a2 = f"The sum is {x + y}."
        elif kind == "lookup_word":
            word, d = r.choice(self.defs)
            q = r.choice([f"Look up the word {word}.", f"What does {word} mean? Use the dictionary.",
                          f"Find the meaning of {word}."])
            args = {"word": word}
            result = {"definition": d}
            final = d
            a1 = f"The user wants the meaning of {word}. Call lookup_word."
            a2 = "The dictionary answered. Quote it."
        else:
            who, topic = r.choice(NAMES), r.choice(TOPICS)
            q = r.choice([f"Send an email to {who} about {topic}.", f"Email {who}: subject {topic}.",
                          f"Please write to {who} about {topic}."])
            args = {"to": who, "subject": topic}
            result = {"status": "sent"}
            final = r.choice([f"Done. I sent the email to {who} about {topic}.", f"The email to {who} was sent."])
            a1 = f"The user wants to email {who} about {topic}. Call send_email."
            a2 = "The email was sent. Confirm."
        tools = [TOOLS[kind]] + self.other_tools(kind)
        r.shuffle(tools)
        user = [{"role": "user", "content": q}]
        first = (request(r, user, tools), call(a1, kind, args))
        call_id = f"call_{r.randint(0, 10**8)}"
        history = user + [
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": call_id, "type": "function",
                             "function": {"name": kind, "arguments": json.dumps(args)}}]},
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)}]
        second = (request(r, history, tools), answer(a2, final))
        return [first, second]

    def multi_turn(self):
        r = self.rng
        req1, comp1 = r.choice([self.define, self.small_talk, self.arithmetic])()
        final1 = comp1.split("<|channel|>final<|message|>")[1].replace("<|return|>", "")
        msgs = [m for m in req1["messages"] if m["role"] == "user"]
        msgs.append({"role": "assistant", "content": final1})
        req2, comp2 = r.choice([self.define, self.small_talk, self.verse])()
        msgs += [m for m in req2["messages"] if m["role"] == "user"]
        return request(r, msgs), comp2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    defs, verses = [], []
    for line in open(args.corpus):
        u = json.loads(line)
        if u["kind"] == "definition":
            s = first_sentence(u["text"])
            if s and 3 <= len(u["word"]) <= 20 and u["word"].replace(" ", "").isalpha():
                defs.append((u["word"].lower(), s))
        elif u["kind"] == "verse" and len(u["text"]) <= 200:
            verses.append((u["ref"], u["text"]))
    rng = random.Random(args.seed)
    g = Gen(rng, defs, verses)
    makers = [(g.define, 3), (g.verse, 2), (g.small_talk, 1), (g.arithmetic, 1), (g.tool_case, 4),
              (g.multi_turn, 1)]
    pool = [m for m, w in makers for _ in range(w)]
    n = 0
    with open(args.out, "w") as out:
        while n < args.count:
            got = rng.choice(pool)()
            for req, comp in (got if isinstance(got, list) else [got]):
                out.write(json.dumps({"request": req, "completion": comp}) + "\n")
                n += 1


if __name__ == "__main__":
    main()
