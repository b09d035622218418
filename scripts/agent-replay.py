#!/usr/bin/env python3
"""A live coding-agent conversation replayed over HTTP against an OpenAI-compatible server
(specdec-server or llama-server), the way an agent drives one: every turn sends the whole
conversation so far, the model's own earlier answers included, plus a scripted tool result
quoting a real source file (from Python's standard library on this machine, not this crate).

It reports the total wall time, the sum of the times to first token, and the decoding rate
after the first token, per turn and in all (JSON with --json).

    scripts/agent-replay.py http://127.0.0.1:8080 [--conversations 2] [--turns 5] [--json]

Greedy (temperature 0), streamed, stdlib only. Each turn's prompt depends on the model's
answers, so two servers compare on the same conversation only where their greedy outputs
agree; the prompt sizes are printed beside the times so that the comparison can be checked.
"""

import argparse
import inspect
import json
import sys
import time
import urllib.request

SYSTEM = """You are a coding agent working in a Python repository. Tools: read_file(path, first, last),
grep(pattern), replace(path, old, new), run_tests(pattern). The user shows you each tool's output.
Answer every turn with one sentence on what you learned from the output, then exactly one tool
call on its own line, for example:
The function lacks a type hint for its width argument.
replace("textwrap.py", "def fill(text, width=70", "def fill(text: str, width: int = 70")"""

# Real files that are not this crate's: modules of Python's standard library.
TASKS = [
    ("textwrap", "Add type hints to the public functions of textwrap.py (dedent, indent, fill)."),
    ("shlex", "The quote() function in shlex.py should accept None and return ''. Make that change."),
    ("json.decoder", "Add a docstring example to JSONDecoder.decode in json/decoder.py."),
    ("fnmatch", "Rename the parameter 'pat' to 'pattern' in fnmatch.filter and keep callers working."),
]


def source_lines(module):
    mod = __import__(module, fromlist=["_"])
    return inspect.getsource(mod).splitlines(), module.replace(".", "/") + ".py"


def tool_result(module, turn, lines_per_turn):
    lines, path = source_lines(module)
    start = (turn * lines_per_turn) % max(1, len(lines) - lines_per_turn)
    chunk = "\n".join(f"{start + i + 1:4d}  {l}" for i, l in enumerate(lines[start:start + lines_per_turn]))
    return f"Tool output: read_file({path}, {start + 1}, {start + lines_per_turn})\n```python\n{chunk}\n```"


def chat(url, model, messages, max_tokens):
    """One streamed request: (answer, seconds to first token, total seconds, completion tokens,
    cached prompt tokens if the server says, prompt tokens if the server says)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first, text, chunks, usage, timings = None, [], 0, None, None
    with urllib.request.urlopen(req, timeout=3600) as resp:
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            usage = event.get("usage") or usage
            timings = event.get("timings") or timings
            for choice in event.get("choices", []):
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece:
                    if first is None:
                        first = time.perf_counter() - start
                    text.append(piece)
                    chunks += 1
    total = time.perf_counter() - start
    tokens = (usage or {}).get("completion_tokens") or chunks
    details = (usage or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    if cached is None and timings and "cache_n" in timings:
        cached = timings["cache_n"]  # llama-server's field
    prompt = (usage or {}).get("prompt_tokens")
    if prompt is None and timings and "prompt_n" in timings and "cache_n" in timings:
        prompt = timings["prompt_n"] + timings["cache_n"]
    return "".join(text), first if first is not None else total, total, tokens, cached, prompt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url")
    ap.add_argument("--model", help="model name (default: the first that /v1/models lists)")
    ap.add_argument("--conversations", type=int, default=2)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--lines", type=int, default=45, help="source lines a tool result quotes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    url = args.url.rstrip("/")
    if args.model is None:
        with urllib.request.urlopen(url + "/v1/models", timeout=60) as resp:
            args.model = json.load(resp)["data"][0]["id"]
    turns = []
    wall_start = time.perf_counter()
    for c in range(args.conversations):
        module, task = TASKS[c % len(TASKS)]
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": task + "\n\n" + tool_result(module, 0, args.lines)}]
        for t in range(args.turns):
            answer, ttft, total, tokens, cached, prompt = chat(url, args.model, messages, args.max_tokens)
            decode = tokens / (total - ttft) if tokens > 1 and total > ttft else 0.0
            turns.append({"conversation": c, "turn": t, "prompt_tokens": prompt, "cached_tokens": cached,
                          "ttft_s": round(ttft, 3), "wall_s": round(total, 3), "completion_tokens": tokens,
                          "decode_tok_s": round(decode, 2), "answer": answer})
            if not args.json:
                print(f"conv {c} turn {t}: prompt {prompt} (cached {cached}) ttft {ttft:6.2f} s "
                      f"wall {total:6.2f} s, {tokens} tokens, {decode:5.1f} tok/s", flush=True)
            messages.append({"role": "assistant", "content": answer})
            messages.append({"role": "user", "content": tool_result(module, t + 1, args.lines)})
    wall = time.perf_counter() - wall_start
    decode_secs = sum(x["wall_s"] - x["ttft_s"] for x in turns)
    decode_tokens = sum(max(0, x["completion_tokens"] - 1) for x in turns)
    summary = {"total_wall_s": round(wall, 2), "sum_ttft_s": round(sum(x["ttft_s"] for x in turns), 2),
               "decode_tok_s": round(decode_tokens / decode_secs, 2) if decode_secs > 0 else 0.0,
               "requests": len(turns), "prompt_tokens": sum(x["prompt_tokens"] or 0 for x in turns),
               "completion_tokens": sum(x["completion_tokens"] for x in turns)}
    if args.json:
        json.dump({"summary": summary, "turns": turns}, sys.stdout, indent=1)
        print()
    else:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
