#!/usr/bin/env python3
"""Writes benches/workloads/agent.jsonl: eight sessions of a coding agent at work on real code
the crate does not contain (functions of crates in the local cargo registry: strsim, fnv,
heck, itoa, scopeguard), five requests each, every request carrying the session's earlier
turns: a system prompt with tool definitions, the task, tool results with the file's code,
the agent's earlier tool calls and edits. And benches/workloads/chat.jsonl, the control set:
the chat prompts of benches/prompts/chat.txt, one request each, where nothing repeats.

Usage: scripts/make-agent-workload.py [CARGO_REGISTRY_SRC]  (default: the first folder under
~/.cargo/registry/src). The output depends only on those crate versions' sources."""
import glob, json, os, sys

root = sys.argv[1] if len(sys.argv) > 1 else sorted(glob.glob(os.path.expanduser("~/.cargo/registry/src/*/")))[0]
here = os.path.dirname(os.path.abspath(__file__))
out_dir = os.path.join(here, "..", "benches", "workloads")

SYSTEM = """You are a coding agent working in a Rust repository. You can call these tools:
- read_file(path): returns the file's contents.
- edit_file(path, old, new): replaces the text `old` with `new` in the file.
- run_tests(filter): runs `cargo test` with the filter and returns its output.
Call a tool by writing, on its own lines:
<tool_call>
{"name": "<tool>", "arguments": {...}}
</tool_call>
Call one tool at a time and wait for its result. Keep explanations short."""

SESSIONS = [
    ("strsim-0.11.1/src/lib.rs", "pub fn hamming(", "hamming"),
    ("strsim-0.11.1/src/lib.rs", "pub fn jaro(", "jaro"),
    ("strsim-0.11.1/src/lib.rs", "pub fn levenshtein(", "levenshtein"),
    ("strsim-0.11.1/src/lib.rs", "pub fn osa_distance(", "osa_distance"),
    ("fnv-1.0.7/lib.rs", "fn write(&mut self", "write"),
    ("heck-0.5.0/src/lib.rs", "fn transform<", "transform"),
    ("itoa-1.0.19/src/lib.rs", "pub fn format<", "format"),
    ("scopeguard-1.2.0/src/lib.rs", "pub fn guard<", "guard"),
]


def function(path, start):
    """The function starting at the first line containing `start`, through its closing brace."""
    lines = open(os.path.join(root, path)).read().splitlines()
    i = next(n for n, l in enumerate(lines) if start in l)
    depth, body = 0, []
    for line in lines[i:]:
        body.append(line)
        depth += line.count("{") - line.count("}")
        if depth == 0 and "{" in "".join(body):
            break
    return "\n".join(body)


def call(name, **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def session(path, start, name):
    file = "src/" + os.path.basename(path)
    code = function(path, start)
    doc = f"/// `{name}`: see the crate documentation for what it computes and its edge cases."
    indent = code[: len(code) - len(code.lstrip())]
    documented = f"{indent}{doc}\n{code}"
    task = f"Add a doc comment to `{name}` in {file} that explains its arguments and its result, then run the tests."
    turns = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    steps = [
        ("assistant", call("read_file", path=file)),
        ("tool", f"{file} (the function `{name}`):\n{code}"),
        ("assistant", "I will add the doc comment above the function.\n" + call("edit_file", path=file, old=code, new=documented)),
        ("tool", "Edit applied."),
        ("assistant", call("run_tests", filter=name)),
        ("tool", f"running 6 tests\ntest tests::{name}_empty ... ok\ntest tests::{name}_same ... ok\ntest tests::{name}_diff ... ok\n\ntest result: ok. 6 passed; 0 failed"),
        ("assistant", f"Done: `{name}` in {file} now has a doc comment, and its tests pass."),
        ("user", f"Now add a unit test for `{name}` with two inputs of your choice to the tests module of {file}."),
    ]
    requests = [list(turns)]
    for n, (role, content) in enumerate(steps):
        turns.append({"role": role, "content": content})
        # A request wherever the agent is to speak next: after each tool result and each user turn.
        if role in ("tool", "user") and n + 1 < len(steps) and steps[n + 1][0] == "assistant" or n == len(steps) - 1:
            requests.append(list(turns))
    return [{"session": name, "messages": r, "max_tokens": 96} for r in requests]


with open(os.path.join(out_dir, "agent.jsonl"), "w") as f:
    for s in SESSIONS:
        for r in session(*s):
            f.write(json.dumps(r) + "\n")
with open(os.path.join(out_dir, "chat.jsonl"), "w") as f:
    for n, line in enumerate(open(os.path.join(here, "..", "benches", "prompts", "chat.txt"))):
        if line.strip():
            msg = line.strip().replace("\\n", "\n")
            f.write(json.dumps({"session": f"chat{n}", "messages": [{"role": "user", "content": msg}], "max_tokens": 96}) + "\n")
