"""A CPU-bound ACP agent for the bench: raw JSON-RPC over stdio, no SDK.

A prompt whose text is `N SIZE` is answered with N `agent_message_chunk` updates of SIZE
characters each, every one built with json.dumps and written with its own write (as an agent
that flushes per message does), then `end_turn`.
"""

import json
import os
import sys


def send(out, msg):
    out.write(json.dumps(msg) + "\n")
    out.flush()


def main():
    out = sys.stdout
    sessions = 0
    for line in sys.stdin:
        msg = json.loads(line)
        method, mid = msg.get("method"), msg.get("id")
        if mid is None:
            continue
        if method == "initialize":
            result = {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}
        elif method == "session/new":
            sessions += 1
            result = {"sessionId": f"py-{os.getpid()}-{sessions}"}
        elif method == "session/prompt":
            params = msg["params"]
            sid = params["sessionId"]
            count, size = (int(x) for x in params["prompt"][0]["text"].split())
            for i in range(count):
                text = (str(i) + " " + "x" * size)[:size]
                send(out, {"jsonrpc": "2.0", "method": "session/update", "params": {
                    "sessionId": sid,
                    "update": {"sessionUpdate": "agent_message_chunk",
                               "content": {"type": "text", "text": text}}}})
            result = {"stopReason": "end_turn"}
        else:
            send(out, {"jsonrpc": "2.0", "id": mid,
                       "error": {"code": -32601, "message": "method not found"}})
            continue
        send(out, {"jsonrpc": "2.0", "id": mid, "result": result})


if __name__ == "__main__":
    main()
