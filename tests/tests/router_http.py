"""The router's JSON endpoints as the test scripts beside this file call them (standard
library only): `post(base, key, path, body)` returns the decoded JSON answer."""

import json
import urllib.request


def post(base, key, path, body, timeout=120):
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.load(resp)
