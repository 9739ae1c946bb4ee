"""A CPU-bound ACP parent for the bench: raw JSON-RPC over stdio, no SDK.

`parent.py N SIZE CMD ARGS...` runs CMD (the agent, directly or behind a bridge), opens a
session, prompts for N chunks of SIZE characters, decodes every line with json.loads, and
prints one JSON line: the seconds from the prompt to its answer and the chunks received.
"""

import json
import subprocess
import sys
import time


def main():
    count, size, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out, inp = child.stdin, child.stdout
    next_id = [0]

    def send(method, params):
        next_id[0] += 1
        out.write((json.dumps({"jsonrpc": "2.0", "id": next_id[0], "method": method,
                               "params": params}) + "\n").encode())
        out.flush()
        return next_id[0]

    def answer(mid):
        for line in inp:
            msg = json.loads(line)
            if msg.get("id") == mid and "method" not in msg:
                return msg
        raise SystemExit("the agent's output ended")

    answer(send("initialize", {"protocolVersion": 1, "clientCapabilities": {}}))
    new = answer(send("session/new", {"cwd": "/tmp", "mcpServers": []}))
    sid = new["result"]["sessionId"]
    started = time.perf_counter()
    mid = send("session/prompt", {"sessionId": sid,
                                  "prompt": [{"type": "text", "text": f"{count} {size}"}]})
    chunks = 0
    for line in inp:
        msg = json.loads(line)
        if msg.get("method") == "session/update":
            if msg["params"]["update"]["sessionUpdate"] == "agent_message_chunk":
                chunks += 1
        elif msg.get("id") == mid:
            break
    secs = time.perf_counter() - started
    out.close()
    child.wait()
    print(json.dumps({"secs": secs, "chunks": chunks}))


if __name__ == "__main__":
    main()
