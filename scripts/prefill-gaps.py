#!/usr/bin/env python3
"""How a long prompt joining affects a stream already running: one request streams a long
answer; once it runs, a second request sends a prompt of about --prompt-tokens tokens (real
source text from Python's standard library). Prints the running stream's median gap between
two chunks before the long prompt came, the longest gap while it was prefilled, and the long
prompt's time to first token.

    scripts/prefill-gaps.py http://127.0.0.1:8080 [--prompt-tokens 4000] [--json]

Stdlib only; greedy; works against any OpenAI-compatible server.
"""

import argparse
import inspect
import json
import statistics
import threading
import time
import urllib.request


def post(url, body, stream):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=3600)


def model_name(url):
    with urllib.request.urlopen(url + "/v1/models", timeout=60) as resp:
        return json.load(resp)["data"][0]["id"]


def long_text(tokens):
    import difflib, json as j, textwrap, shlex, fnmatch, argparse as a
    text = "".join(inspect.getsource(m) for m in (difflib, j.decoder, textwrap, shlex, fnmatch, a))
    return text[: tokens * 3]  # about 3 characters a token for Python source


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url")
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--warm-chunks", type=int, default=15, help="chunks of the running stream before the long prompt")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    url = args.url.rstrip("/")
    model = model_name(url)
    times, joined = [], {}

    def long_request():
        body = {"model": model, "max_tokens": 1, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": "Summarize this code:\n" + long_text(args.prompt_tokens)}]}
        start = time.perf_counter()
        joined["sent"] = start
        with post(url, body, True) as resp:
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if line.startswith("data:") and '"content"' in line and "first" not in joined:
                    if json.loads(line[5:])["choices"][0]["delta"].get("content"):
                        joined["first"] = time.perf_counter()
        joined["done"] = time.perf_counter()

    body = {"model": model, "max_tokens": 3000, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Count from 1 to 1000, one number a line."}]}
    thread = None
    with post(url, body, True) as resp:
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            event = json.loads(line[5:])
            if any((c.get("delta") or {}).get("content") for c in event.get("choices", [])):
                times.append(time.perf_counter())
            if len(times) == args.warm_chunks and thread is None:
                thread = threading.Thread(target=long_request)
                thread.start()
            if thread is not None and "done" in joined and len(times) > args.warm_chunks + 20:
                break
    if thread is not None:
        thread.join()
    gaps = [b - a for a, b in zip(times, times[1:])]
    before = gaps[: args.warm_chunks - 1]
    sent, first = joined.get("sent", 0), joined.get("first", joined.get("done", 0))
    during = [b - a for a, b in zip(times, times[1:]) if b > sent and a < first]
    out = {"median_gap_s": round(statistics.median(before), 4) if before else None,
           "longest_gap_during_prefill_s": round(max(during), 4) if during else None,
           "median_gap_during_prefill_s": round(statistics.median(during), 4) if during else None,
           "chunks_during_prefill": len(during),
           "long_prompt_ttft_s": round(first - sent, 3)}
    if out["median_gap_s"] and out["longest_gap_during_prefill_s"]:
        out["ratio"] = round(out["longest_gap_during_prefill_s"] / out["median_gap_s"], 2)
    print(json.dumps(out) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
