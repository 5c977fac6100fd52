#!/usr/bin/env python3
"""Writes corpus.jsonl (one {"text": ...} per line) for the tokenizer tests.

Expected ids come from the reference tokenizer, run once by hand:
  ../../tools/o200k-oracle/o200k-oracle < corpus.jsonl > corpus.ids.jsonl   (from tests/data/tokenizer)
(the tests never run the oracle). Standard library only; deterministic (fixed seed)."""
import json, random, os

here = os.path.dirname(os.path.abspath(__file__))
T = []

# English prose, casing, contractions.
T += [
    "Hello, world! This is a simple English sentence.",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX! the Quick bRoWn fOx?",
    "I'm sure you're right, but they'll say we've done what he'd've wanted; it's John's.",
    "DON'T SHOUT. I'M NOT. YOU'RE. WE'VE. THEY'LL. HE'D. IT'S. She'S. We'Re 'll 'd 's 'm 't",
    "'s 't 're 've 'm 'll 'd and 'S 'T 'RE 'VE 'M 'LL 'D alone; x's y'all o'clock rock'n'roll",
    "don’t (curly apostrophe) and don`t and don''t and 'tis 'twas",
    "In 1492, Columbus sailed the ocean blue. Mr. Smith-Jones paid $3,400.50 (approx.) on 2024-06-01.",
    "e-mail: someone@example.com, URL: https://example.org/a/b?c=d&e=f#g, path /usr/local/bin/",
    "A" * 300,
    "abc" * 200,
    "Supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    "CamelCaseIdentifier snake_case_identifier SCREAMING_SNAKE kebab-case-words XMLHttpRequest",
    "ſtreet itſ 'ſ KELVIN: 5\u212a 'K 'Ǉ ǅungla ǈ ǋ",  # case folding of (?i:'s ...) and titlecase
]
# Code.
T += [
    "#include <stdio.h>\nint main(void) {\n    printf(\"hello\\n\");\n    return 0;\n}\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\nprint([fib(i) for i in range(10)])\n",
    "for (size_t i = 0; i < n; ++i) { a[i] += b[i] * c[i]; } // vectorized?\n\t\tx <<= 2; y >>= 3; z ||= w;",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null, "b": true, "c": -1.5e10}}',
    "<html><body><div class=\"x\">Text &amp; more &lt;tags&gt;</div></body></html>",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%o''brien%';",
    "fn main() -> Result<(), Box<dyn Error>> { let v: Vec<u8> = vec![0xFF; 16]; Ok(()) }",
    "    \tindented with mixed\ttabs and spaces    \n\t\n        \n",
    "/* comment */ // line comment\n# shell comment\n-- sql comment\n<!-- html -->",
    "a+b-c*d/e%f^g&h|i~j!k?l:m;n,o.p<q>r=s@t#u$v_w`x'y\"z\\",
    "!!!???...,,,;;;:::---___===+++***&&&|||~~~```'''\"\"\"",
    "./././/..//  /// \\\\ \\n \\t",
]
# CJK, Arabic, other scripts, combining marks.
T += [
    "你好，世界！这是一个测试句子。我们今天去公园散步吧。",
    "日本語のテキストです。カタカナとひらがなと漢字が混ざっています。東京都渋谷区",
    "한국어 텍스트입니다. 안녕하세요! 반갑습니다.",
    "مرحبا بالعالم! هذه جملة باللغة العربية. السَّلَامُ عَلَيْكُمْ",
    "שלום עולם! זה משפט בעברית.",
    "नमस्ते दुनिया! यह हिंदी में एक वाक्य है। क्षत्रिय",
    "สวัสดีชาวโลก นี่คือประโยคภาษาไทย",
    "Привет, мир! Это предложение на русском языке. ЁЖИК ёжик",
    "Γειά σου Κόσμε! Αυτή είναι μια πρόταση. ΣΊΣΥΦΟΣ",
    "Ünïcödé àccénts: café naïve résumé façade Ångström Øresund Straße ŒUVRE",
    "e\u0301 a\u0300\u0301\u0302\u0303 o\u0308\u0304 n\u0303 (combining) vs é à ö ñ (precomposed)",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
    "\u0301\u0302 leading combining marks \u0300",
    "ＦＵＬＬＷＩＤＴＨ　ｔｅｘｔ　１２３　！？",
    "Mixed 中文 and English and العربية and 日本語 in one line.",
]
# Emoji.
T += [
    "Emoji: 😀😃😄😁 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇺🇸🇯🇵🇫🇷 ❤️ ✨ 🤖 🧑🏿‍🚀",
    "💖💖💖 🔥🔥 😂😂😂😂 🙏",
    "text😀text 123😀456 😀 😀  😀   😀",
    "\u200d\u200b\ufeff zero-width joiner, space and BOM \u2060",
]
# Digits.
T += [
    "1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890",
    "3.14159265358979323846 -42 +7 1e-10 0x1F 0b1010 1,000,000 1_000_000",
    "٠١٢٣٤٥٦٧٨٩ (Arabic-Indic) ०१२३४५६७८९ (Devanagari) 一二三 ½ ² ³ Ⅻ ①②③",
    "99999999999999999999999999999999999999999999999999",
    "phone: +1 (555) 123-4567; date 2025-07-28T12:34:56Z; v1.2.3",
]
# CR/LF and whitespace.
T += [
    "line1\nline2\r\nline3\rline4\n\nline5\r\n\r\nline6",
    "\n", "\r\n", "\r", "\n\n\n\n", "\r\n\r\n\r\n", " ", "  ", "     ", "\t", "\t\t\t",
    " \n ", "  \n  ", "   \n\n   x", "x   ", "   x", "x   \n", "a \r\n b", "a\n \nb",
    "trailing spaces    ", "    leading spaces", "multiple     internal      spaces",
    "nbsp:\u00a0\u00a0x ideographic:\u3000\u3000y en\u2002em\u2003thin\u2009 nel\u0085ls\u2028ps\u2029",
    "tabs\tand\tnewlines\n\tmixed \t \n \t", "\v\f vertical tab and form feed \x0b\x0c",
    " " * 100 + "end", "\n" * 50, "x" + " " * 33 + "\n" * 3 + " " * 7,
    "?\n\n!\r\n/\n", "...\n///\r\n", "a/\nb/\r\n",
]
# Special tokens and near misses.
T += [
    "<|start|>system<|message|>You are ChatGPT.<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant",
    "<|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>",
    "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"location\":\"SF\"}<|call|>",
    "<|startoftext|><|endoftext|><|endofprompt|>",
    "<|reserved_200018|>",
    "text<|end|>text <|end|> text\n<|end|>\n",
    "<|end| <end|> <|end> |end|> <|END|> <| end |> <|notaspecial|> <|<|end|>|> <|reserved_199997|> <|reserved_201088|>",
    "<|", "|>", "<||>", "<|<|", "<|end|><|end|><|end|>",
]
specials = {}
for i in range(200013, 201088):
    specials[f"<|reserved_{i}|>"] = i
specials.update({"<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|reserved_200000|>": 200000,
                 "<|reserved_200001|>": 200001, "<|return|>": 200002, "<|constrain|>": 200003,
                 "<|reserved_200004|>": 200004, "<|channel|>": 200005, "<|start|>": 200006,
                 "<|end|>": 200007, "<|message|>": 200008, "<|reserved_200009|>": 200009,
                 "<|reserved_200010|>": 200010, "<|reserved_200011|>": 200011, "<|call|>": 200012,
                 "<|endofprompt|>": 200018})
# One name an id (the oracle's table also maps the alias <|reserved_200018|> to 200018).
names = [n for n in sorted(specials, key=lambda k: specials[k]) if n != "<|reserved_200018|>"]
T.append("alias <|reserved_200018|> = <|endofprompt|>")  # decodes to <|endofprompt|>
for k in range(0, len(names), 100):  # every special token, 100 a line, with text between
    T.append(" x".join(names[k:k + 100]))

# Random strings over several alphabets (fixed seed).
rng = random.Random(20261129)
pools = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n\t'.,;:!?-_/\\\"()[]{}<>|@#$%^&*+=~`",
    "aeiou AEIOU 's 't 're 've 'm 'll 'd 123 \r\n  ",
    "你好世界日本語한국어ひらがなカタカナ。、！？ 0123",
    "مرحبابالعالمשלוםнмрΓειάé\u0301\u0300\u0308 ",
    "😀👍🏽👨‍👩‍🔥✨🇺🇸 \u200d\ufe0f",
    " \t\n\r\u00a0\u3000\u2003xyz12",
]
for _ in range(120):
    pool = rng.choice(pools) if rng.random() < 0.7 else "".join(pools)
    n = rng.randint(1, 80)
    T.append("".join(rng.choice(pool) for _ in range(n)))
for _ in range(60):  # random code points from the BMP and beyond (no surrogates)
    s = []
    for _ in range(rng.randint(1, 40)):
        r = rng.random()
        if r < 0.4:
            cp = rng.randint(0x20, 0x7E)
        elif r < 0.8:
            cp = rng.randint(0xA0, 0x2FFF)
        elif r < 0.95:
            cp = rng.randint(0x3000, 0xD7FF)
        else:
            cp = rng.randint(0x1F300, 0x1FAFF)
        s.append(chr(cp))
    T.append("".join(s))

# A longer English passage.
para = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
        "age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the "
        "season of Light, it was the season of Darkness, it was the spring of hope, it was the winter "
        "of despair, we had everything before us, we had nothing before us.\n\n")
T.append(para * 8)

# Long pieces (no break for the pre-tokenizer): the O(n log n) merge path.
rng2 = random.Random(7)
T.append("".join(rng2.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3000)))
T.append("".join(rng2.choice("etaoinshrdlu") for _ in range(1500)) + "'ll")
T.append("".join(rng2.choice("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年") for _ in range(800)))
T.append("".join(rng2.choice("!@#$%^&*()-=+[]{};:,.<>/?|~") for _ in range(1200)) + "\r\n//")
T.append("".join(rng2.choice("كتابمدرسةعلم") for _ in range(900)))
T.append("ab" * 2000)
T.append("\u00e9" * 700 + "e\u0301" * 300)

# Control characters and the edges of \\s (Unicode White_Space).
T.append("a\x1c\x1d\x1e\x1fb \x00 \x01\x7f\x85 x\u180e y\u200b z\u2060 w\ufeff v\u00ad")
T.append("\x1c \x1c\n \u0085\u0085 \u2028\u2029\u202f\u205f\u1680 \u3000\n\u00a0 end")
T.append("\x0b\x0c\r\n \x0b x \x0c y\r")

with open(os.path.join(here, "corpus.jsonl"), "w", encoding="utf-8") as f:
    for t in T:
        f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
print(len(T), "lines")
