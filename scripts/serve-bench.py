#!/usr/bin/env python3
"""Aggregate throughput of an OpenAI-compatible server at several concurrencies: specdec-server
or llama.cpp's llama-server, the same prompts and settings. Standard library only.

    scripts/serve-bench.py --base http://127.0.0.1:8080 --concurrency 1,2,4,8 --requests 2

Each of C clients sends `--requests` streamed chat requests one after another (prompts from
`--prompts`, in turn); a row reports the tokens of all requests over the wall time, the mean
time to first token, the mean per-request tokens per second, and the same after the first token
(decoding alone, prefill left out). `--json` adds one JSON line a row."""
import argparse
import json
import threading
import time
import urllib.request


def one(base, model, prompt, max_tokens, temperature):
    """One streamed request: (completion tokens, seconds to first token, seconds in all)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": temperature, "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    start = time.perf_counter()
    first, chunks, usage = None, 0, None
    with urllib.request.urlopen(req, timeout=600) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            v = json.loads(line[6:])
            if v.get("usage"):
                usage = v["usage"]
            for c in v.get("choices", []):
                if c.get("delta", {}).get("content"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter() - start
    tokens = usage["completion_tokens"] if usage else chunks
    return tokens, first or 0.0, time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default="")
    ap.add_argument("--prompts", default="benches/prompts/code.txt")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--label", default="server")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    prompts = [l.strip() for l in open(a.prompts) if l.strip()]
    one(a.base, a.model, prompts[0], 8, a.temperature)  # warm-up
    print(f"{'label':<28} {'clients':>7} {'tokens':>7} {'secs':>7} {'tok/s':>8} {'ttft s':>7} {'tok/s/req':>9} {'decode/req':>10}")
    for c in [int(x) for x in a.concurrency.split(",")]:
        results, lock = [], threading.Lock()

        def client(i):
            for r in range(a.requests):
                out = one(a.base, a.model, prompts[(i + r * c) % len(prompts)], a.max_tokens, a.temperature)
                with lock:
                    results.append(out)

        start = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(c)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        secs = time.perf_counter() - start
        tokens = sum(r[0] for r in results)
        ttft = sum(r[1] for r in results) / len(results)
        per_req = sum(r[0] / r[2] for r in results) / len(results)
        decode = sum((r[0] - 1) / max(r[2] - r[1], 1e-9) for r in results) / len(results)
        print(f"{a.label:<28} {c:>7} {tokens:>7} {secs:>7.1f} {tokens / secs:>8.1f} {ttft:>7.2f} {per_req:>9.1f} {decode:>10.1f}")
        if a.json:
            print(json.dumps({"label": a.label, "clients": c, "tokens": tokens, "secs": secs,
                              "tok_s": tokens / secs, "ttft_s": ttft, "tok_s_per_request": per_req,
                              "decode_tok_s_per_request": decode}))


if __name__ == "__main__":
    main()
