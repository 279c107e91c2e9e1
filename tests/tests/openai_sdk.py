"""Drives a Pagewarden router with the official `openai` Python SDK, as an application would.

Then LangChain's `bind_tools` over the same API. Run by tests/tests/openai_sdk.rs against the suite on the real model:
    python3 openai_sdk.py BASE_URL API_KEY MODEL
Prints one JSON line of what it saw; exits non-zero (with the reason) when a check fails.
"""

import json
import sys
import router_http  # beside this script

from openai import OpenAI

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)
seen = {}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The local time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
]
ASK = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
NAMES = {t["function"]["name"] for t in TOOLS}


def check(ok, what):
    if not ok:
        print(json.dumps(seen), flush=True)
        sys.exit(f"check failed: {what}")


def valid_call(name, arguments, only=None):
    """A call of one of TOOLS whose arguments parse and hold the required string."""
    check(name in NAMES, f"called an unknown function {name!r}")
    if only is not None:
        check(name == only, f"called {name!r}, not the forced {only!r}")
    args = json.loads(arguments)
    check(isinstance(args.get("city"), str), f"arguments {arguments!r} lack a string city")
    return args


def streamed(**kw):
    """A streamed chat: its content, its calls (accumulated by index) and its finish reason."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = tc.id or call["id"]
            if tc.function is not None:
                call["name"] += tc.function.name or ""
                call["arguments"] += tc.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


# A named function, not streamed: exactly that call, arguments valid under its schema.
named = {"type": "function", "function": {"name": "get_weather"}}
r = client.chat.completions.create(
    model=model, messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=60, temperature=0
)
choice = r.choices[0]
check(
    choice.finish_reason == "tool_calls",
    f"named: finish {choice.finish_reason}, content {choice.message.content!r}",
)
calls = choice.message.tool_calls
check(calls and len(calls) == 1, f"named: calls {calls}")
args = valid_call(calls[0].function.name, calls[0].function.arguments, only="get_weather")
check(calls[0].id.startswith("call_"), f"named: id {calls[0].id}")
seen["named"] = {"name": calls[0].function.name, "arguments": args}
first_call = calls[0]

# A named function, streamed.
content, scalls, finish = streamed(
    model=model, messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=60, temperature=0
)
check(finish == "tool_calls" and len(scalls) == 1, f"named stream: {finish} {scalls}")
valid_call(scalls[0]["name"], scalls[0]["arguments"], only="get_weather")
check(json.loads(scalls[0]["arguments"]) == args, "named: streamed and whole calls differ")
seen["named_stream"] = scalls[0]["name"]

# Required, not streamed and streamed: at least one call of some tool.
r = client.chat.completions.create(
    model=model, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0
)
choice = r.choices[0]
check(
    choice.finish_reason == "tool_calls",
    f"required: finish {choice.finish_reason}, content {choice.message.content!r}",
)
check(choice.message.tool_calls, "required: no calls")
for c in choice.message.tool_calls:
    valid_call(c.function.name, c.function.arguments)
seen["required"] = [c.function.name for c in choice.message.tool_calls]
content, scalls, finish = streamed(
    model=model, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0
)
check(finish == "tool_calls" and scalls, f"required stream: {finish} {scalls}")
for c in scalls:
    valid_call(c["name"], c["arguments"])
seen["required_stream"] = [c["name"] for c in scalls]

# Auto: the model decides; either answer is well formed (calls parse, or text is text).
r = client.chat.completions.create(
    model=model, messages=ASK, tools=TOOLS, max_tokens=60, temperature=0
)
choice = r.choices[0]
if choice.message.tool_calls:
    check(choice.finish_reason == "tool_calls", f"auto: finish {choice.finish_reason}")
    for c in choice.message.tool_calls:
        valid_call(c.function.name, c.function.arguments)
else:
    check(choice.finish_reason in ("stop", "length"), f"auto: finish {choice.finish_reason}")
    check(isinstance(choice.message.content, str), "auto: no content")
seen["auto"] = {
    "finish": choice.finish_reason,
    "calls": [c.function.name for c in choice.message.tool_calls or []],
}
content, scalls, finish = streamed(
    model=model, messages=ASK, tools=TOOLS, max_tokens=60, temperature=0
)
check(
    (finish == "tool_calls") == bool(scalls),
    f"auto stream: finish {finish} with {len(scalls)} calls",
)
check(
    (content or None) == (choice.message.content or None) and len(scalls) == len(choice.message.tool_calls or []),
    "auto: streamed and whole answers differ",
)
seen["auto_stream"] = finish

# The round trip: the call and its result go back; the model answers in text or calls again.
conversation = ASK + [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": first_call.id,
                "type": "function",
                "function": {
                    "name": first_call.function.name,
                    "arguments": first_call.function.arguments,
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": first_call.id, "content": json.dumps({"temperature_c": 18})},
]
r = client.chat.completions.create(
    model=model, messages=conversation, tools=TOOLS, tool_choice="none", max_tokens=30, temperature=0
)
choice = r.choices[0]
check(choice.finish_reason in ("stop", "length"), f"round trip: finish {choice.finish_reason}")
check(choice.message.content and not choice.message.tool_calls, "round trip: no text answer")
seen["round_trip"] = choice.message.content


# logit_bias forcing a token: +100 on one id makes it every sampled token.
def post(path, body):
    return router_http.post(base, key, path, body)


forced = post("/tokenize", {"prompt": " banana"})["tokens"][-1]
word = post("/detokenize", {"tokens": [forced]})["prompt"]
r = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=3, temperature=0,
    logit_bias={str(forced): 100},
)
check(r.choices[0].text == word * 3, f"logit_bias: {r.choices[0].text!r}, not {word * 3!r}")
seen["logit_bias"] = r.choices[0].text

# Scoring as lm-evaluation-harness does: echo + logprobs + max_tokens 0 gives the prompt back
# with each of its tokens' logprobs (the first null), equal to a generation's over each prefix.
text = "The capital of France is Paris, and the capital of Italy is Rome"
ids = post("/tokenize", {"prompt": text})["tokens"]
r = client.completions.create(
    model=model, prompt=text, echo=True, logprobs=3, max_tokens=0, temperature=0
)
choice = r.choices[0]
check(choice.text == text, f"echo: text {choice.text!r}")
check(choice.finish_reason == "length", f"echo: finish {choice.finish_reason}")
lp = choice.logprobs
check(len(lp.tokens) == len(ids), f"echo: {len(lp.tokens)} tokens for {len(ids)} prompt ids")
check(lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, "echo: first token scored")
check(r.usage.completion_tokens == 0, f"echo: usage {r.usage}")
worst = 0.0
for i in (1, len(ids) // 2, len(ids) - 1):
    g = client.completions.create(
        model=model, prompt=ids[:i], max_tokens=1, temperature=0, logprobs=3
    )
    want = g.choices[0].logprobs.top_logprobs[0]
    got = lp.top_logprobs[i]
    check(set(want) == set(got), f"echo: position {i} top tokens {got} vs {want}")
    worst = max(worst, max(abs(want[k] - got[k]) for k in want))
    if g.choices[0].logprobs.tokens[0] == lp.tokens[i]:
        worst = max(worst, abs(g.choices[0].logprobs.token_logprobs[0] - lp.token_logprobs[i]))
check(worst < 0.01, f"echo: prompt logprobs differ from a generation's by {worst}")
r = client.completions.create(
    model=model, prompt=text, echo=True, max_tokens=2, temperature=0
)
check(r.choices[0].text.startswith(text) and len(r.choices[0].text) > len(text), "echo: no completion")
seen["echo"] = {"tokens": len(lp.tokens), "worst_logprob_gap": worst}

# Fields that carry nothing for generation are accepted.
r = client.chat.completions.create(
    model=model, messages=ASK, max_tokens=4, metadata={"app": "sdk-test"}, store=False,
    user="sdk-user", service_tier="auto",
)
check(r.choices[0].finish_reason in ("stop", "length"), "metadata: no answer")
seen["metadata"] = "accepted"

# LangChain's bind_tools over the same API: a forced call comes back as a parsed tool call.
from langchain_core.messages import HumanMessage, ToolMessage  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

llm = ChatOpenAI(
    model=model, base_url=base + "/v1", api_key=key, temperature=0, max_tokens=60, max_retries=0
)
bound = llm.bind_tools(TOOLS, tool_choice="get_weather")
msg = bound.invoke([HumanMessage("What is the weather in Paris?")])
check(len(msg.tool_calls) == 1, f"langchain: tool_calls {msg.tool_calls}")
lc_call = msg.tool_calls[0]
check(lc_call["name"] == "get_weather", f"langchain: called {lc_call['name']}")
check(isinstance(lc_call["args"].get("city"), str), f"langchain: args {lc_call['args']}")
answer = llm.bind_tools(TOOLS, tool_choice="none").invoke(
    [
        HumanMessage("What is the weather in Paris?"),
        msg,
        ToolMessage(json.dumps({"temperature_c": 18}), tool_call_id=lc_call["id"]),
    ]
)
check(isinstance(answer.content, str) and answer.content, "langchain: no answer after the tool")
seen["langchain"] = {"call": lc_call["args"], "answer": answer.content}

print(json.dumps(seen), flush=True)
