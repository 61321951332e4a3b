"""The line protocol of stowage's Python peers (bench/lib/python_peer.h).

Each request is one JSON object on stdin; `serve` calls handlers[request["op"]](request)
and writes what it returns as one JSON line on stdout. A handler's exception becomes an
answer {"error": "..."}, so the benchmark names it; stdin's end ends the script.
"""

import json
import sys
import traceback


def serve(handlers):
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            op = request.get("op")
            if op not in handlers:
                raise ValueError(f"unknown op {op!r}; this peer knows {sorted(handlers)}")
            answer = handlers[op](request)
        except Exception as error:  # the benchmark reports it, naming the script
            traceback.print_exc(file=sys.stderr)
            answer = {"error": f"{type(error).__name__}: {error}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
