"""lm-evaluation-harness (`local-completions`, the server's own tokenizer through `/tokenize`)
scores a small multiple-choice task against a Pagewarden router, the way people evaluate a
served model.

Run by tests/tests/openai_sdk.rs:  python3 lm_eval_mc.py BASE_URL API_KEY MODEL WORKDIR
Writes the task (a local JSON file and its YAML) into WORKDIR, runs the harness offline, and
checks every item's per-choice loglikelihood against the sum of the continuation's token
logprobs that the server's own `echo` + `logprobs` scoring gives for that context. Prints one
JSON line: accuracy and every item's loglikelihoods.
"""

import json
import os
import sys
import router_http  # beside this script

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

base, key, model, work = sys.argv[1:5]
# local-completions sends this key with its requests (the remote tokenizer takes `auth_token`).
os.environ["OPENAI_API_KEY"] = key

ITEMS = [
    {"question": "The capital of France is", "choices": [" Paris", " Berlin", " Madrid"], "answer": 0},
    {"question": "Two plus two equals", "choices": [" seven", " four", " nine"], "answer": 1},
    {"question": "The color of the clear daytime sky is", "choices": [" green", " purple", " blue"], "answer": 2},
    {"question": "Water freezes at a temperature of zero degrees", "choices": [" Celsius", " pages", " volts"], "answer": 0},
    {"question": "A cat is a kind of", "choices": [" animal", " mineral", " planet"], "answer": 0},
    {"question": "The opposite of hot is", "choices": [" loud", " cold", " tall"], "answer": 1},
    {"question": "The largest ocean on Earth is the", "choices": [" Pacific", " Sahara", " Amazon"], "answer": 0},
    {"question": "One week has seven", "choices": [" apples", " days", " rivers"], "answer": 1},
]

data = os.path.join(work, "items.json")
with open(data, "w") as f:
    json.dump(ITEMS, f)
with open(os.path.join(work, "pw_mc.yaml"), "w") as f:
    f.write(
        f"""task: pw_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""
    )

import lm_eval  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

results = lm_eval.simple_evaluate(
    model="local-completions",
    model_args={
        "base_url": base + "/v1/completions",
        "model": model,
        "tokenizer_backend": "remote",
        "auth_token": key,
        "num_concurrent": 1,
        # Several prompts per request: a batch, each prompt its own choice.
        "batch_size": 4,
        "max_retries": 1,
    },
    tasks=["pw_mc"],
    task_manager=TaskManager(include_path=work),
    log_samples=True,
    num_fewshot=0,
)
acc = results["results"]["pw_mc"]["acc,none"]
samples = sorted(results["samples"]["pw_mc"], key=lambda s: s["doc_id"])


def post(path, body):
    return router_http.post(base, key, path, body)


# The same loglikelihoods from the server directly: the continuation's tokens' logprobs in an
# echo of context + continuation.
per_item = []
worst = 0.0
for s, item in zip(samples, ITEMS):
    got = [float(r[0][0]) for r in s["resps"]]
    want = []
    ctx = post("/tokenize", {"prompt": item["question"], "add_special_tokens": False})["tokens"]
    for choice in item["choices"]:
        whole = post("/tokenize", {"prompt": item["question"] + choice, "add_special_tokens": False})["tokens"]
        r = post(
            "/v1/completions",
            {"model": model, "prompt": whole, "echo": True, "logprobs": 1, "max_tokens": 0},
        )
        lps = r["choices"][0]["logprobs"]["token_logprobs"]
        want.append(sum(lps[len(ctx):]))
    worst = max(worst, max(abs(a - b) for a, b in zip(got, want)))
    per_item.append({"doc": s["doc_id"], "loglikelihoods": got})
print(json.dumps({"acc": acc, "worst_gap": worst, "items": per_item}), flush=True)
if worst > 0.01:
    sys.exit(f"lm-eval's loglikelihoods differ from the server's own scoring by {worst}")
