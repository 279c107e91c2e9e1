"""Not run by the tests: compares, item by item, the loglikelihoods a Pagewarden router gives
the multiple-choice task of `lm_eval_mc.py` with llama-server's on the same model.

llama-server cannot be scored by lm-evaluation-harness itself: its `/v1/completions` ignores
`echo` (it returns the generated token's logprobs only), so the harness finds no prompt
logprobs. Here llama-server is teacher-forced instead: for each continuation token, a
`/completion` of the prefix before it with `n_probs` large enough to hold that token.

    python3 lm_eval_vs_llama_server.py ROUTER_URL API_KEY LLAMA_SERVER_URL

Prints each item's loglikelihoods (ours, llama-server's), each side's accuracy and the worst gap.
"""

import json
import sys
import urllib.request

import router_http  # beside this script

base, key, llama = sys.argv[1], sys.argv[2], sys.argv[3]
source = open(__file__.replace("lm_eval_vs_llama_server.py", "lm_eval_mc.py")).read()
ITEMS = eval(source[source.index("ITEMS = [") + 8 : source.index("]\n\ndata") + 1])


def ours(path, body):
    return router_http.post(base, key, path, body)


def theirs(path, body):
    req = urllib.request.Request(
        llama + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def teacher_forced(prefix, token):
    for n_probs in (400, 1 << 20):
        q = theirs(
            "/completion",
            {"prompt": prefix, "n_predict": 1, "n_probs": n_probs, "temperature": 0,
             "cache_prompt": False},
        )
        top = q["completion_probabilities"][0]["top_logprobs"]
        lp = next((t["logprob"] for t in top if t["id"] == token), None)
        if lp is not None:
            return lp
    raise SystemExit(f"token {token} is not among llama-server's {len(top)} top logprobs")


worst, right = 0.0, {"pagewarden": 0, "llama-server": 0}
for item in ITEMS:
    tok = lambda text: ours("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
    ctx = tok(item["question"])
    a, b = [], []
    for choice in item["choices"]:
        whole = tok(item["question"] + choice)
        r = ours("/v1/completions", {"prompt": whole, "echo": True, "logprobs": 1, "max_tokens": 0})
        a.append(sum(r["choices"][0]["logprobs"]["token_logprobs"][len(ctx):]))
        b.append(sum(teacher_forced(whole[:j], whole[j]) for j in range(len(ctx), len(whole))))
    worst = max(worst, max(abs(x - y) for x, y in zip(a, b)))
    right["pagewarden"] += a.index(max(a)) == item["answer"]
    right["llama-server"] += b.index(max(b)) == item["answer"]
    print(item["question"], [round(x, 4) for x in a], [round(y, 4) for y in b])
print("accuracy", {k: v / len(ITEMS) for k, v in right.items()}, "worst gap", round(worst, 4))
