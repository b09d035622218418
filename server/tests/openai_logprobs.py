"""Log-probabilities through the official `openai` client: a speculative server and a plain
one (`--drafter plain`) return the same tokens and the same values, whole and streamed, for
chat (`logprobs`, `top_logprobs`) and completions (`logprobs: N`), raw and processed, greedy
and seeded. Usage:
    python3 openai_logprobs.py SPECULATIVE_URL PLAIN_URL MODEL
Exits non-zero (an assertion) on anything unexpected."""
import sys

import openai

spec_url, plain_url, model = sys.argv[1], sys.argv[2], sys.argv[3]
spec, plain = (openai.OpenAI(base_url=f"{u}/v1", api_key="unused", max_retries=0, timeout=300)
               for u in (spec_url, plain_url))
messages = [{"role": "user", "content": "List three uses of a paperclip."}]


def chat_entries(client, stream, **kw):
    """The text and (token, logprob, [(token, logprob)]) of every token of a chat answer."""
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=24, logprobs=True,
                                       stream=stream, **kw)
    chunks = list(r) if stream else [r]
    text, entries = "", []
    for c in chunks:
        for choice in c.choices:
            part = choice.delta.content if stream else choice.message.content
            text += part or ""
            if choice.logprobs is not None:
                for e in choice.logprobs.content:
                    assert bytes(e.bytes).decode("utf-8", "replace") == e.token or "\ufffd" in e.token, e
                    entries.append((e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]))
    return text, entries


def completion_entries(client, stream, **kw):
    r = client.completions.create(model=model, prompt="The three primary colors are", max_tokens=16, logprobs=3,
                                  stream=stream, **kw)
    chunks = list(r) if stream else [r]
    text, entries = "", []
    for c in chunks:
        for choice in c.choices:
            text += choice.text
            if choice.logprobs is not None:
                lp = choice.logprobs
                entries += list(zip(lp.tokens, lp.token_logprobs, [sorted(t.items()) for t in lp.top_logprobs]))
    return text, entries


cases = [
    ("chat, greedy, raw, top 5", chat_entries, dict(temperature=0, top_logprobs=5)),
    ("chat, greedy, processed, penalty", chat_entries,
     dict(temperature=0, top_logprobs=3, frequency_penalty=0.5, extra_body={"logprobs_mode": "processed"})),
    ("chat, seeded 0.8, processed", chat_entries,
     dict(temperature=0.8, seed=7, top_logprobs=2, extra_body={"logprobs_mode": "processed"})),
    ("completion, greedy, raw", completion_entries, dict(temperature=0)),
]
for what, run, kw in cases:
    answers = {}
    for name, client in (("speculative", spec), ("plain", plain)):
        for stream in (False, True):
            answers[(name, stream)] = run(client, stream, **kw)
    (text, entries) = answers[("plain", False)]
    assert entries and "".join(e[0] for e in entries) == text, (what, text, entries[:3])
    for key, got in answers.items():
        assert got == (text, entries), (what, key, got[1][:4], entries[:4])
    top = entries[0][2]
    assert all(a[1] >= b[1] for a, b in zip(top, top[1:])) or run is completion_entries, (what, top)
    print(f"{what}: {len(entries)} tokens, the same values 4 ways; first {entries[0][0]!r} {entries[0][1]:.4f}")

try:
    spec.chat.completions.create(model=model, messages=messages, max_tokens=4, logprobs=True, top_logprobs=21)
    raise AssertionError("21 alternatives were accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "top_logprobs", e.body
print("openai logprobs: all checks passed")
