#!/usr/bin/env python3
"""Replays a trace of requests on llama.cpp, for side-by-side numbers with
`spec_bench --workload` (never a dependency of the crate).

The prompts come rendered by the crate's own chat template:
  spec_bench --target T --workload benches/workloads/agent.jsonl --dump-prompts DIR
writes DIR/NNN.txt (the prompt text) and DIR/NNN.n (its max_tokens).

Modes (greedy unless --temperature; 2 threads):
  server URL   each request in order to a running llama-server's /completion (plain, or
               started with --spec-type ngram-mod: its n-gram pool lasts from request to
               request); the decode rate is the server's own `timings`.
  lookup BIN   `llama-lookup` once a request, its dynamic n-gram cache (-lcd) carried in a
               file from one request to the next; the decode rate is what it prints.

Prints per-request tok/s and the whole trace's tokens over decode seconds; --json adds one line.
Usage: scripts/peer-trace.py DIR server http://127.0.0.1:8092
       scripts/peer-trace.py DIR lookup $bin/llama-lookup --model T [--draft-max 8]
"""
import argparse, glob, json, os, re, subprocess, sys, tempfile, urllib.request


def requests(folder):
    for path in sorted(glob.glob(os.path.join(folder, "*.txt"))):
        with open(path) as f:
            text = f.read()
        with open(path[:-4] + ".n") as f:
            yield os.path.basename(path)[:-4], text, int(f.read())


def via_server(url, text, n, temperature, seed):
    body = {"prompt": text, "n_predict": n, "temperature": temperature, "seed": seed, "cache_prompt": True}
    req = urllib.request.Request(url.rstrip("/") + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        t = json.load(r)["timings"]
    return t["predicted_n"], t["predicted_ms"] / 1e3, t.get("draft_n", 0), t.get("draft_n_accepted", 0)


def via_lookup(binary, model, cache, text, n, temperature, seed, draft_max):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    cmd = [binary, "-m", model, "-f", f.name, "-n", str(n), "-t", "2", "-tb", "2", "-c", "4096", "-b", "4096",
           "--temp", str(temperature), "--seed", str(seed), "--spec-draft-n-max", str(draft_max), "-lcd", cache]
    out = subprocess.run(cmd, capture_output=True, text=True)
    os.unlink(f.name)
    log = out.stdout + out.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    if out.returncode != 0 or not m:
        sys.exit(f"llama-lookup failed ({out.returncode}):\n{log[-3000:]}")
    drafted = int(re.search(r"n_drafted\s*=\s*(\d+)", log).group(1))
    accepted = int(re.search(r"n_accept\s*=\s*(\d+)", log).group(1))
    return int(m.group(1)), float(m.group(2)), drafted, accepted


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("mode", choices=["server", "lookup"])
    ap.add_argument("where", help="the server's URL, or the llama-lookup binary")
    ap.add_argument("--model", help="the target file (lookup)")
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cache = os.path.join(tempfile.mkdtemp(), "dynamic.lcd")  # llama-lookup creates it
    tokens = secs = drafted = accepted = 0
    rates = []
    for name, text, n in requests(a.folder):
        if a.mode == "server":
            got = via_server(a.where, text, n, a.temperature, a.seed)
        else:
            got = via_lookup(a.where, a.model, cache, text, n, a.temperature, a.seed, a.draft_max)
        tokens += got[0]; secs += got[1]; drafted += got[2]; accepted += got[3]
        rates.append(got[0] / max(got[1], 1e-9))
        print(f"{name}: {got[0]} tokens, {rates[-1]:.1f} tok/s, drafted {got[2]}, accepted {got[3]}", flush=True)
    if os.path.exists(cache):
        os.unlink(cache)
    alpha = accepted / drafted if drafted else float("nan")
    print(f"whole trace: {tokens} tokens, {tokens / secs:.1f} tok/s, acceptance {alpha:.3f}")
    if a.json:
        print(json.dumps({"mode": a.mode, "tok_s": tokens / secs, "tokens": tokens, "acceptance": alpha, "per_request_tok_s": rates}))


if __name__ == "__main__":
    main()
