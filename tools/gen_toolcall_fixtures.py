#!/usr/bin/env python3
"""gen_toolcall_fixtures.py — reference data for spill's function calling (tests/test_toolcall.c).

Writes tests/data/toolcall/fixtures.json:

  "renders": OpenAI-shaped chat requests with tools, tool_choice, assistant tool_calls (content null,
             arguments as JSON text) and tool messages, rendered by transformers on real templates the way
             vLLM hands an OpenAI request to transformers (spill's prompt_template_messages +
             toolcall_rendered_tools must produce the same context):
               - tool_choice "none" -> no tools; a named function -> that tool alone; else every tool;
               - content lists of text parts -> one string, the parts joined with "\\n";
               - a tool call's "arguments" JSON text -> the object (json.loads), as transformers' docs ask;
               - a null content -> "" (vLLM's parser turns it into an empty list of parts).
             Rendered with transformers.utils.chat_template_utils.render_jinja_template (what
             apply_chat_template(messages, tools=...) runs), strftime_now pinned as in
             gen_template_fixtures.py.  Each result: {"expect": text} | {"raise": msg} | {"error": class}.
  "parses":  what each template writes for an assistant turn that makes calls (the convention the model was
             trained on): the render of [user, assistant(tool_calls)] minus the render of [user] with the
             generation prompt, minus the turn's end marker; spill's parser must get the calls back.

Templates: the tool-capable ones of tests/data/tmpl/src (see gen_template_fixtures.py for their sources)
plus SmolLM2's (no tool section: tools are ignored by it).

Usage: .venv/bin/python tools/gen_toolcall_fixtures.py   (from the repo root; deterministic)
"""
import copy
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_template_fixtures as gtf  # noqa: E402
from transformers.utils import chat_template_utils as ctu  # noqa: E402

OUT = os.path.join(gtf.ROOT, "tests", "data", "toolcall")
FORMAT_VERSION = 1

# template name -> (call convention spill must detect, end-of-turn text the assistant turn closes with)
TEMPLATES = {
    "SmolLM2-135M-Instruct": ("none", None),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("hermes", "<|im_end|>"),
    "Qwen-Qwen2.5-Instruct.recreated": ("hermes", "<|im_end|>"),
    "Qwen-Qwen3-0.6B": ("hermes", "<|im_end|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("llama3", "<|eot_id|>"),
    "meta-llama-Llama-3.3-70B-Instruct": ("llama3", "<|eot_id|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("mistral", "</s>"),
    "ibm-granite-granite-3.3-2B-Instruct": ("none", None),
}

WEATHER = gtf.WEATHER_TOOL
CALC = {"type": "function", "function": {k: v for k, v in gtf.CALC_TOOL["function"].items() if k != "return"}}


def U(c):
    return {"role": "user", "content": c}


def call(name, args, cid):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def requests():
    r = []

    def add(rid, messages, tools=None, tool_choice=None):
        r.append({"id": rid, "messages": messages, "tools": tools, "tool_choice": tool_choice})

    q = [U("What's the weather in Paris?")]
    add("auto", q, [WEATHER, CALC])
    add("choice_auto", q, [WEATHER, CALC], "auto")
    add("choice_none", q, [WEATHER, CALC], "none")
    add("choice_required", q, [WEATHER, CALC], "required")
    add("choice_named", q, [WEATHER, CALC], {"type": "function", "function": {"name": "add"}})
    hist = [U("Weather in Paris?"),
            {"role": "assistant", "content": None,
             "tool_calls": [call("get_weather", {"city": "Paris", "unit": "celsius"}, "call12345")]},
            {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21.5}"}]
    add("history_null_content", hist, [WEATHER])
    add("history_answered", hist + [{"role": "assistant", "content": "21.5 degrees."}, U("And Rome?")], [WEATHER])
    add("history_two_calls", [U("Oslo and Rome?"),
                              {"role": "assistant", "content": None,
                               "tool_calls": [call("get_weather", {"city": "Oslo"}, "callAAAAA"),
                                              call("get_weather", {"city": "Rome"}, "callBBBBB")]},
                              {"role": "tool", "tool_call_id": "callAAAAA", "content": "cold"},
                              {"role": "tool", "tool_call_id": "callBBBBB", "content": "warm"}], [WEATHER])
    add("parts", [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                  {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "in Bern?"}]}],
        [WEATHER])
    add("parts_no_tools", [{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                                        {"type": "text", "text": "there"}]}])
    return r


def as_template_sees(req):
    """The OpenAI request -> (messages, tools) as vLLM gives them to transformers."""
    msgs = copy.deepcopy(req["messages"])
    for m in msgs:
        if m.get("content") is None:  # vLLM: a null content (an assistant turn of calls) is the empty text
            m["content"] = ""
        if isinstance(m.get("content"), list):
            m["content"] = "\n".join(p.get("text", p.get("refusal", "")) for p in m["content"])
        for tc in m.get("tool_calls") or []:
            a = tc["function"]["arguments"]
            if isinstance(a, str):
                try:
                    v = json.loads(a)
                except ValueError:
                    v = a
                if isinstance(v, dict):
                    tc["function"]["arguments"] = v
    tools, choice = req["tools"], req["tool_choice"]
    if choice == "none":
        tools = None
    elif isinstance(choice, dict):
        tools = [t for t in tools if t["function"]["name"] == choice["function"]["name"]]
    return msgs, copy.deepcopy(tools)


def render(tmpl, messages, tools, agp):
    gtf.compiled(tmpl["template"])  # pins strftime_now on the cached environment
    extra = {k: v for k, v in tmpl["extra"].items() if v is not None}
    rendered, _ = ctu.render_jinja_template(conversations=[messages], tools=tools, chat_template=tmpl["template"],
                                            add_generation_prompt=agp, **extra)
    return rendered[0]


def parse_cases(tmpl, end):
    """Assistant turns that make calls, as the template writes them."""
    cases = []
    shapes = [
        ("one_call", None, [call("get_weather", {"city": "Zürich", "unit": "celsius"}, "call12345")]),
        ("nested_args", None, [call("get_weather", {"city": "Oslo", "opts": {"days": [1, 2], "hourly": False}},
                                    "call12345")]),
        ("two_calls", None, [call("get_weather", {"city": "Oslo"}, "callAAAAA"),
                             call("add", {"a": 1, "b": 2.5}, "callBBBBB")]),
        ("content_and_call", "Let me check.", [call("add", {"a": 2, "b": 3}, "call12345")]),
    ]
    head = [U("question")]
    for cid, content, calls in shapes:
        asst = {"role": "assistant", "content": content, "tool_calls": calls}
        msgs, tools = as_template_sees({"messages": head + [asst], "tools": [WEATHER, CALC], "tool_choice": None})
        try:
            full = render(tmpl, msgs, tools, False)
            prompt = render(tmpl, msgs[:-1], tools, True)
        except Exception:  # the template refuses the shape (Llama 3: one call at a time; content with calls)
            continue
        if not full.startswith(prompt):
            continue
        text = full[len(prompt):].rstrip()
        if end and text.endswith(end):
            text = text[:-len(end)]
        cases.append({"template": tmpl["name"], "id": cid, "text": text,
                      "calls": [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
                                for c in calls],
                      "content": content})
    return cases


def main():
    templates = [t for t in gtf.real_templates() if t["name"] in TEMPLATES]
    assert len(templates) == len(TEMPLATES), "a template is missing"
    out = {"format": "spill-toolcall-fixtures", "version": FORMAT_VERSION, "now": gtf.NOW, "tz": "UTC",
           "templates": [], "renders": [], "parses": []}
    for t in templates:
        style, end = TEMPLATES[t["name"]]
        out["templates"].append({"name": t["name"], "style": style, "template": t["template"], "extra": t["extra"]})
        for req in requests():
            msgs, tools = as_template_sees(req)
            res = gtf.outcome(lambda: render(t, msgs, tools, True))
            out["renders"].append({"template": t["name"], "id": req["id"], "request": req, **res})
        if style != "none":
            out["parses"] += parse_cases(t, end)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "fixtures.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(out['renders'])} renders, {len(out['parses'])} parse cases")


if __name__ == "__main__":
    main()
