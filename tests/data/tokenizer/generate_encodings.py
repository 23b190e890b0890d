import json, subprocess, sys
prompts = [
 "", " ", "  ", "a", "A", "Once upon a time", "once upon a time", "ONCE UPON A TIME",
 "The cat sat on the mat.", "Lily and Tom went to the park to play with a red ball.",
 "\"Hello!\" said the little dog. \"Can I play too?\"",
 "It's a sunny day, isn't it? Yes, it's sunny.",
 "1 2 3 4 5 6 7 8 9 10 11 12 100 2024 3.14159",
 "Mom said: no, no, no!!! ... ok?",
 "two  spaces   three    four", " leading space", "trailing space ", "\tTab\tseparated\t",
 "line one\nline two\n\nline four", "\n", "\r\n",
 "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber", "\u00fc", "\u20ac100", "\u4f60\u597d\u4e16\u754c",
 "emoji \U0001F600 \U0001F431!", "\u0394\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5", "\u041f\u0440\u0438\u0432\u0435\u0442",
 "supercalifragilisticexpialidocious", "antidisestablishmentarianism",
 "a-b_c/d\\e|f@g#h$i%j^k&l*m(n)o[p]q{r}s<t>u=v+w~x`y",
 "The quick brown fox jumps over the lazy dog. " * 8,
 "<s> </s> <unk>", "<0x41>",
 "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine.",
 "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz", "...........", "!?!?!?",
]
# Raw bytes: invalid UTF-8 (a lone continuation byte, a truncated 3-byte sequence, a stray 0xFF).
raw = [b"x\x80y", b"ab\xe2\x82", b"\xff\xfe", b"\xc3"]
data = b"".join(p.encode() + b"\0" for p in prompts) + b"".join(r + b"\0" for r in raw)
out = subprocess.run(["./drv", sys.argv[1]], input=data, capture_output=True, check=True).stdout.decode().splitlines()
cases = []
allp = [p.encode() for p in prompts] + raw
for b, line in zip(allp, out, strict=True):
    cases.append({"text_hex": b.hex(), "text": b.decode("utf-8", "replace"), "bos_ids": [int(x) for x in line.split()]})
json.dump({"source": "llama2.c run.c encode(text, bos=1, eos=0) at karpathy/llama2.c 350e04fe35433e6d2941dce5a1f53308f87058eb, tok512.bin sha256 037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312",
           "cases": cases}, sys.stdout, indent=1, ensure_ascii=True)
