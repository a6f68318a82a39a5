#!/usr/bin/env python3
"""gen_template_fixtures.py — reference renders for spill's chat-template interpreter.

Runs the REAL transformers rendering path (transformers.utils.chat_template_utils:
_compile_jinja_template = jinja2 ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks,
loopcontrols, AssistantTracker) + tojson/raise_exception/strftime_now/namespace/dict, and
render_jinja_template, which also aliases reasoning fields) with strftime_now pinned to NOW
in UTC, and writes:

  tests/data/tmpl/chat.json      real model templates x conversations -> exact output or error
  tests/data/tmpl/features.json  small templates exercising each Jinja feature of formats.md §6
  tests/data/tmpl/dos.json       adversarial templates that must fail cleanly (hand-specified:
                                 jinja2 itself would hang on some of them, so they are not run)

Every result is one of {"expect": text} | {"raise": message} (the template called
raise_exception) | {"error": exception class} (any other failure; the C side must fail too,
its message is not compared).

Template sources (tests/data/tmpl/src/ and GGUF metadata):
  - SmolLM2-135M-Instruct: tokenizer.chat_template of the local GGUF ($SPILL_HOME/models/...).
  - gemma-3-270m GGUF carries no chat template; google-gemma-3-it.jinja is the official Gemma 3
    instruct template as copied verbatim in a public repository.
  - meta-llama-Llama-3.2/3.3, Qwen-Qwen3-0.6B, microsoft-Phi-3.5-mini, mistralai-Mistral-Nemo,
    google-gemma-2-2b-it, NousResearch-Hermes-3 (tool_use), DeepSeek-R1-Distill-Qwen, IBM Granite 3.3:
    llama.cpp's models/templates/ copies of the Hugging Face templates.
  - Qwen-Qwen2.5-Instruct.recreated.jinja: written from memory ("source": "recreated").
  - builtin:NAME: spill's built-in templates, src/model/templates/NAME.jinja (sources in its README.md).

Usage: python3 tools/gen_template_fixtures.py   (from the repo root; deterministic)
"""
import copy
import json
import os
import sys
from datetime import datetime, timezone

import jinja2
from transformers.utils import chat_template_utils as ctu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tmpl")
SRC = os.path.join(OUT, "src")
BUILTIN = "src/model/templates"
NOW = 1721980800  # 2024-07-26 08:00:00 UTC; the C test sets TZ=UTC and passes the same clock
FORMAT_VERSION = 1


def pinned_strftime(fmt):
    return datetime.fromtimestamp(NOW, tz=timezone.utc).strftime(fmt)


def compiled(src):
    t = ctu._compile_jinja_template(src)
    t.environment.globals["strftime_now"] = pinned_strftime
    return t


def outcome(fn):
    try:
        return {"expect": fn()}
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:  # raise_exception() raises the base class
            return {"raise": str(e)}
        return {"error": type(e).__name__}
    except Exception as e:  # TypeError, OverflowError, … from inside the template
        return {"error": type(e).__name__}


# ---------------------------------------------------------------- real templates


def gguf_template(rel):
    import gguf

    home = os.environ.get("SPILL_HOME", os.path.expanduser("~/.streamweights"))
    r = gguf.GGUFReader(os.path.join(home, "models", rel))
    f = r.fields["tokenizer.chat_template"]
    return bytes(f.parts[f.data[0]]).decode("utf-8")


def real_templates():
    out = [{
        "name": "SmolLM2-135M-Instruct",
        "source": "gguf tokenizer.chat_template of SmolLM2-135M-Instruct.Q4_1.gguf",
        "template": gguf_template("smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"),
        "extra": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
    }]
    sources = {
        "google-gemma-3-it": ("official Gemma 3 instruct template, copied verbatim from a public repository "
                              "(the local gemma-3-270m GGUF has no chat template)",
                              {"bos_token": "<bos>", "eos_token": "<eos>"}),
        "google-gemma-2-2b-it": ("llama.cpp models/templates copy of the HF template",
                                 {"bos_token": "<bos>", "eos_token": "<eos>"}),
        "meta-llama-Llama-3.3-70B-Instruct": ("llama.cpp models/templates copy of the HF template",
                                              {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
        "meta-llama-Llama-3.2-3B-Instruct": ("llama.cpp models/templates copy of the HF template",
                                             {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
        "Qwen-Qwen3-0.6B": ("llama.cpp models/templates copy of the HF template",
                            {"bos_token": None, "eos_token": "<|im_end|>"}),
        "Qwen-Qwen2.5-Instruct.recreated": ("recreated", {"bos_token": None, "eos_token": "<|im_end|>"}),
        "microsoft-Phi-3.5-mini-instruct": ("llama.cpp models/templates copy of the HF template",
                                            {"bos_token": "<s>", "eos_token": "<|endoftext|>"}),
        "mistralai-Mistral-Nemo-Instruct-2407": ("llama.cpp models/templates copy of the HF template",
                                                 {"bos_token": "<s>", "eos_token": "</s>"}),
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("llama.cpp models/templates copy of the HF template",
                                                        {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}),
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("llama.cpp models/templates copy of the HF template",
                                                     {"bos_token": "<｜begin▁of▁sentence｜>",
                                                      "eos_token": "<｜end▁of▁sentence｜>"}),
        "ibm-granite-granite-3.3-2B-Instruct": ("llama.cpp models/templates copy of the HF template",
                                                {"bos_token": "<|end_of_text|>", "eos_token": "<|end_of_text|>"}),
    }
    for name, (source, extra) in sources.items():
        with open(os.path.join(SRC, name + ".jinja"), encoding="utf-8", newline="") as f:
            out.append({"name": name, "source": source, "template": f.read(), "extra": extra})
    # spill's built-in templates (src/model/templates/, embedded in the binary): test_template.c also checks
    # that the embedded text is byte-identical to the "template" recorded here
    for name in sorted(os.listdir(BUILTIN)):
        if name.endswith(".jinja"):
            with open(os.path.join(BUILTIN, name), encoding="utf-8", newline="") as f:
                out.append({"name": "builtin:" + name[:-6], "source": "src/model/templates/" + name +
                            " (its README.md names the upstream)", "template": f.read(),
                            "extra": {"bos_token": "<bos>", "eos_token": "<eos>"}})
    return out


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                       "required": ["a", "b"]},
        "return": {"type": "number"},
    },
}

TYPES_TOOL = {
    "type": "function",
    "function": {
        "name": "typed",
        "description": "Exercise every JSON-schema type.  ",
        "parameters": {
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}, "description": " list of tags "},
                "count": {"type": "integer", "description": "how many"},
                "ratio": {"type": "number", "description": "a float"},
                "flag": {"type": "boolean", "description": "yes/no"},
                "either": {"type": ["string", "number"], "description": "union"},
                "table": {"type": "object", "additionalProperties": {"type": "integer"}, "description": "map"},
                "blob": {"type": "object", "description": "free-form"},
                "anything": {"description": "no type"},
            },
            "required": ["tags"],
        },
        "return": {"type": "string", "description": "A summary."},
    },
}


def U(c):
    return {"role": "user", "content": c}


def A(c):
    return {"role": "assistant", "content": c}


def S(c):
    return {"role": "system", "content": c}


def tool_call(name, args, cid="call12345"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def conversations():
    """≥40 conversations covering the shapes chat requests take."""
    c = []

    def add(cid, messages, tools=None, extra=None, agp=True):
        c.append({"id": cid, "messages": messages, "tools": tools, "extra": extra or {},
                  "add_generation_prompt": agp})

    add("user", [U("Hello!")])
    add("user_no_gen", [U("Hello!")], agp=False)
    add("system_user", [S("You are terse."), U("What is 2+2?")])
    add("system_user_no_gen", [S("You are terse."), U("What is 2+2?")], agp=False)
    add("two_turns", [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke.")])
    add("two_turns_system", [S("Be kind."), U("Hi"), A("Hello!"), U("Bye")])
    add("ends_assistant", [U("Hi"), A("Hello!")], agp=False)
    add("ends_assistant_gen", [U("Hi"), A("Hello!")])
    long = []
    for i in range(10):
        long += [U(f"question {i}?"), A(f"answer {i}.")]
    add("ten_turns", long + [U("last question")])
    add("unicode", [U("Grüße aus Zürich — ¿qué tal? 日本語のテキスト 🤖🎉 עברית")])
    add("unicode_system", [S("Réponds en français, s'il te plaît."), U("Ça va ? 你好")])
    add("empty_user", [U("")])
    add("empty_system", [S(""), U("hi")])
    add("empty_assistant", [U("a"), A(""), U("b")])
    add("whitespace", [U("   padded with spaces and newlines \n\n"), A("\n  reply  \n"), U("\tx\t")])
    add("newlines_inside", [U("line one\nline two\r\nline three")])
    add("jinja_lookalike", [U("{{ not a tag }} {% if %} {# no #}")])
    add("quotes_backslashes", [U("He said \"hi\" and 'bye' \\ C:\\path\\n")])
    add("control_chars", [U("tab\there bell\x07 nul-free \x1b[0m")])
    add("long_content", [U("word " * 600)])
    add("system_only", [S("Only a system prompt.")])
    add("assistant_first", [A("I speak first."), U("ok")])
    add("double_user", [U("one"), U("two")])
    add("double_assistant", [U("one"), A("two"), A("three")])
    add("system_middle", [U("a"), S("late system"), U("b")])
    add("parts_text", [{"role": "user", "content": [{"type": "text", "text": "Describe this."}]}])
    add("parts_image_text", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is it? "}]}])
    add("parts_system", [{"role": "system", "content": [{"type": "text", "text": "Sys in parts."}]}, U("hi")])
    add("parts_multi", [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                        A("ok"), {"role": "user", "content": [{"type": "text", "text": "c"}]}])
    add("tools_only_listed", [U("What's the weather in Paris?")], tools=[WEATHER_TOOL])
    add("tools_system", [S("Use tools."), U("Weather in Zürich?")], tools=[WEATHER_TOOL, CALC_TOOL])
    add("tools_all_types", [U("use typed")], tools=[TYPES_TOOL, CALC_TOOL])
    tc = [U("Weather in Paris?"),
          {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", {"city": "Paris", "unit": "celsius"})]},
          {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
          ]
    add("tool_roundtrip", tc, tools=[WEATHER_TOOL])
    add("tool_roundtrip_answer", tc + [A("It is 21.5°C and clear in Paris."), U("Thanks!")], tools=[WEATHER_TOOL])
    add("tool_call_no_tools", tc)
    add("tool_call_string_args", [U("add 1 and 2"),
                                  {"role": "assistant", "content": None,
                                   "tool_calls": [tool_call("add", "{\"a\": 1, \"b\": 2}")]},
                                  {"role": "tool", "tool_call_id": "call12345", "content": "3"}], tools=[CALC_TOOL])
    add("two_tool_calls", [U("two cities"),
                           {"role": "assistant", "content": "Checking both.",
                            "tool_calls": [tool_call("get_weather", {"city": "Oslo"}, "callAAAAA"),
                                           tool_call("get_weather", {"city": "Rome", "unit": "fahrenheit"}, "callBBBBB")]},
                           {"role": "tool", "tool_call_id": "callAAAAA", "content": "cold"},
                           {"role": "tool", "tool_call_id": "callBBBBB", "content": "warm"}], tools=[WEATHER_TOOL])
    add("tool_content_mapping", [U("x"), {"role": "tool", "tool_call_id": "call12345",
                                          "content": {"result": [1, 2.5, True, None, "ü"]}}])
    add("tool_args_nested", [U("nested"),
                              {"role": "assistant", "content": "",
                               "tool_calls": [tool_call("get_weather", {"city": "Zürich", "opts": {"days": 3, "hourly": False,
                                                                                                   "ratio": 0.1, "tags": ["a", "b"]}})]},
                              {"role": "tool", "tool_call_id": "call12345", "content": "ok"}], tools=[WEATHER_TOOL])
    add("bad_tool_call_id", [U("x"), {"role": "assistant", "content": "",
                                      "tool_calls": [tool_call("add", {"a": 1, "b": 2}, "short")]}], tools=[CALC_TOOL])
    add("reasoning_content", [U("Think about it."), {"role": "assistant", "content": "42", "reasoning_content": "6*7"},
                              U("And again?")])
    add("reasoning_last", [U("q1"), A("a1"), U("q2"), {"role": "assistant", "content": "final", "reasoning_content": "hmm"}],
        agp=False)
    add("think_in_content", [U("q"), A("<think>\nreasoning here\n</think>\n\nvisible answer"), U("next")])
    add("thinking_alias", [U("q"), {"role": "assistant", "content": "ans", "thinking": "via thinking"}, U("more")])
    add("enable_thinking_false", [U("Quick answer please.")], extra={"enable_thinking": False})
    add("enable_thinking_true", [U("Think hard.")], extra={"enable_thinking": True})
    add("date_string", [U("What's the date?")], extra={"date_string": "01 Jan 2030"})
    add("tools_in_system", [U("weather?")], tools=[WEATHER_TOOL], extra={"tools_in_user_message": False})
    add("builtin_tools", [U("search it")], tools=[WEATHER_TOOL],
        extra={"builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"]})
    add("empty_messages", [])
    add("custom_tokens", [U("hi")], extra={"bos_token": "[BOS]", "eos_token": "[EOS]"})
    return c


def render_chat(tmpl, conv):
    compiled(tmpl["template"])  # pins strftime_now on the cached environment
    extra = {k: v for k, v in tmpl["extra"].items() if v is not None}
    extra.update(conv["extra"])

    def go():
        rendered, _ = ctu.render_jinja_template(
            conversations=[copy.deepcopy(conv["messages"])], tools=copy.deepcopy(conv["tools"]),
            chat_template=tmpl["template"], add_generation_prompt=conv["add_generation_prompt"], **extra)
        return rendered[0]

    return outcome(go)


# ---------------------------------------------------------------- feature templates

CTX = {
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "Hi there"},
                 {"role": "assistant", "content": "Hello", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
                 {"role": "user", "content": "Bye"}],
    "d": {"b": 2, "a": 1, "c": {"n": [1, 2, 3]}},
    "l": [3, 1, 2],
    "s": "  Hello, World  ",
    "u": "Zürich 日本 🤖",
    "n": None, "t": True, "f": False, "i": 7, "x": 2.5, "neg": -3, "zero": 0,
    "words": ["apple", "Banana", "cherry"],
    "people": [{"name": "Ann", "age": 31, "admin": True}, {"name": "bob", "age": 25, "admin": False},
               {"name": "Cid", "age": 40}],
    "empty": [], "emptyd": {}, "emptys": "",
    "nested": [[1, 2], [3, 4]],
    "big": 9007199254740993,
}

FEATURES = [
    # whitespace control, trim_blocks, lstrip_blocks, comments, trailing newline
    ("plain", "hello world"),
    ("trailing_newline_dropped", "a\n"),
    ("two_trailing_newlines", "a\n\n"),
    ("crlf_normalised", "a\r\nb\rc\n"),
    ("trim_blocks", "{% if t %}\nyes\n{% endif %}\nafter"),
    ("lstrip_blocks", "line\n    {% if t %}\n    indented\n    {% endif %}\nend"),
    ("lstrip_not_vars", "  {{ i }}\n  x"),
    ("lstrip_plus", "  {%+ if t %}x{% endif %}"),
    ("trim_plus", "{% if t +%}\nx{% endif %}"),
    ("minus_both", "a   {{- i -}}   b"),
    ("minus_block", "a \n {%- if t -%} \n b \n {%- endif -%} \n c"),
    ("comment", "a{# comment #}b"),
    ("comment_minus", "a  {#- c -#}  b"),
    ("comment_lstrip", "x\n   {# c #}\ny"),
    ("comment_trim", "{# c #}\nz"),
    ("raw", "{% raw %}{{ not evaluated }}{% endraw %}"),
    ("mid_line_block", "a {% if t %}b{% endif %} c"),
    ("tab_lstrip", "\t{% if t %}x{% endif %}"),
    ("first_line_lstrip", "   {% if t %}x{% endif %}"),
    ("nested_braces", "{{ {'a': {'b': 1}} }}"),
    # if / elif / else / for
    ("if_elif_else", "{% for v in [0, 1, 2] %}{% if v == 0 %}zero{% elif v == 1 %}one{% else %}many{% endif %};{% endfor %}"),
    ("for_else", "{% for v in empty %}x{% else %}none{% endfor %}"),
    ("for_else_nonempty", "{% for v in l %}{{ v }}{% else %}none{% endfor %}"),
    ("loop_vars", "{% for v in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}|{% endfor %}"),
    ("loop_prev_next", "{% for v in l %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}"),
    ("loop_cycle", "{% for v in l %}{{ loop.cycle('a', 'b') }}{% endfor %}"),
    ("loop_filter", "{% for v in l if v > 1 %}{{ v }}{{ loop.index }}{{ loop.last }},{% endfor %}"),
    ("loop_unpack_items", "{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}"),
    ("loop_unpack_method", "{% for k, v in d.items() if k != 'c' %}{{ k }}{{ v }}{% endfor %}"),
    ("loop_dict_keys", "{% for k in d %}{{ k }}{% endfor %}"),
    ("loop_string", "{% for ch in 'héllo' %}[{{ ch }}]{% endfor %}"),
    ("loop_nested", "{% for a in nested %}{% for b in a %}{{ loop.index }}{{ b }}{% endfor %}/{{ loop.index }}{% endfor %}"),
    ("loop_break", "{% for v in [1, 2, 3, 4] %}{% if v == 3 %}{% break %}{% endif %}{{ v }}{% endfor %}"),
    ("loop_continue", "{% for v in [1, 2, 3, 4] %}{% if v is even %}{% continue %}{% endif %}{{ v }}{% endfor %}"),
    ("loop_scope", "{% set a = 0 %}{% for v in [1, 2] %}{{ a }}{% set a = v %}{{ a }}{% endfor %}{{ a }}"),
    ("loop_scope_first", "{% for v in [1, 2] %}{% if loop.first %}{% set b = 5 %}{% endif %}{{ b }}{% endfor %}"),
    ("loop_tuple_iter", "{% for v in 1, 2 %}{{ v }}{% endfor %}"),
    ("loop_undefined", "{% for v in nothing %}x{% endfor %}ok"),
    ("loop_over_none", "{% for v in n %}x{% endfor %}"),
    ("loop_unpack_mismatch", "{% for a, b in l %}{% endfor %}"),
    # set / namespace / macro
    ("set_basic", "{% set a = 'x' ~ i %}{{ a }}"),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}"),
    ("set_shadow_ctx", "{% set messages = messages[1:] %}{{ messages|length }}"),
    ("set_block", "{% set blk %}inner {{ i }}{% endset %}[{{ blk }}]"),
    ("set_block_filter", "{% set blk | upper %}inner{% endset %}{{ blk }}"),
    ("namespace", "{% set ns = namespace(c=0, s='') %}{% for v in l %}{% set ns.c = ns.c + v %}{% set ns.s = ns.s ~ v %}{% endfor %}{{ ns.c }} {{ ns.s }}"),
    ("namespace_empty", "{% set ns = namespace() %}{% set ns.index = 0 %}{% set ns.index = ns.index + 1 %}{{ ns.index }}"),
    ("namespace_dict_arg", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}"),
    ("namespace_underscore", "{% set ns = namespace() %}{% set ns._x = 1 %}"),
    ("set_attr_non_ns", "{% set d.x = 1 %}"),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', punct='?') }}"),
    ("macro_recursive_ok", "{% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k * fact(k - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}"),
    ("macro_missing_arg", "{% macro m(a, b) %}[{{ a }}|{{ b }}]{% endmacro %}{{ m(1) }}"),
    ("generation_tag", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}"),
    # expressions and precedence
    ("arith", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }}"),
    ("pow_left_assoc", "{{ 2 ** 3 ** 2 }}"),
    ("unary_minus_pow", "{{ -2 ** 2 }}"),
    ("unary_minus_filter", "{{ -1|abs }} {{ -x|abs }}"),
    ("float_arith", "{{ 0.1 + 0.2 }} {{ 1.5 * 2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1e20 }} {{ 1e-5 }} {{ 1 / 3 }} {{ 2.0 }} {{ 1e16 }} {{ 123456789.123 }}"),
    ("bool_arith", "{{ t + 1 }} {{ f * 3 }} {{ t == 1 }}"),
    ("concat_tilde", "{{ 'a' ~ 1 ~ n ~ t ~ x ~ l }}"),
    ("string_plus", "{{ 'a' + 'b' }}"),
    ("string_plus_int", "{{ 'a' + 1 }}"),
    ("string_mul", "{{ 'ab' * 3 }}{{ [1] * 2 }}"),
    ("list_plus", "{{ l + [4] }}"),
    ("comparisons", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 1 != 2 }} {{ [1, 2] < [1, 3] }}"),
    ("chained_compare", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }}"),
    ("compare_mixed", "{{ 1 < 'a' }}"),
    ("in_ops", "{{ 'ell' in 'hello' }} {{ 2 in l }} {{ 'a' in d }} {{ 'z' not in d }} {{ 'tool_calls' in messages[2] }}"),
    ("in_none", "{{ 'a' in n }}"),
    ("and_or_values", "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' and 1 }} {{ n or empty or 'last' }}"),
    ("not_precedence", "{{ not 1 == 2 }} {{ not t and f }} {{ not (t and f) }}"),
    ("cond_expr", "{{ 'y' if t else 'n' }} {{ 'y' if f else 'n' }} [{{ 'y' if f }}]"),
    ("cond_nested", "{{ 'a' if f else 'b' if f else 'c' }}"),
    ("dict_eq", "{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ messages[1] == {'content': 'Hi there', 'role': 'user'} }}"),
    ("tuple_list_eq", "{{ (1, 2) == [1, 2] }} {{ (1, 2) == (1, 2) }}"),
    ("literals", "{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}, (1,), ()] }}"),
    ("adjacent_strings", "{{ 'a' \"b\" 'c' }}"),
    ("escapes", "{{ 'tab\\there\\nnew \\u00e9 \\x41 \\\\ \\' \\q' }}"),
    ("int_literals", "{{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_000 }} {{ 1.5e3 }}"),
    ("big_int", "{{ big }} {{ big + 1 }}"),
    ("division_by_zero", "{{ 1 // 0 }}"),
    # printing of values (Python str/repr)
    ("print_values", "{{ n }} {{ t }} {{ f }} {{ i }} {{ x }} {{ neg }} {{ l }} {{ d }} {{ words }} {{ nested }} {{ emptyd }}"),
    ("print_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'back\\\\slash', 'nl\\n', 'é', '\\x07', '\\u00a0'] }}"),
    ("print_tuple", "{{ (1,) }} {{ (1, 'a') }} {{ d|items|list }}"),
    ("print_undefined", "[{{ nothing }}]"),
    ("print_float_forms", "{{ 1.0 }} {{ 100.0 }} {{ 1e15 }} {{ 1e16 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }} {{ 3.14159 }}"),
    # attribute / subscript / slices
    ("attr_and_item", "{{ messages[1].role }} {{ messages[1]['content'] }} {{ d.c.n[1] }} {{ d['c']['n'][-1] }} {{ l.0 }}"),
    ("negative_index", "{{ l[-1] }} {{ messages[-1].content }} {{ 'abc'[-1] }} {{ u[0] }}"),
    ("slices", "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ u[1:4] }} {{ l[5:] }} {{ 'abc'[:-1] }}"),
    ("slice_step_neg", "{{ [1, 2, 3, 4, 5][4:1:-2] }} {{ 'abcdef'[-2::-2] }}"),
    ("missing_attr_prints_empty", "[{{ d.zzz }}][{{ messages[1].nope }}][{{ l[10] }}][{{ n.attr }}]"),
    ("undefined_attr_error", "{{ nothing.attr }}"),
    ("missing_attr_chain_error", "{{ d.zzz.yyy }}"),
    ("dict_method_attrs", "{{ d.keys()|list }} {{ d.values()|list }} {{ d.get('a') }} {{ d.get('q', 'dflt') }} {{ d.get('q') }}"),
    # string methods
    ("str_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.upper() }}|{{ s.lower() }}|{{ 'x-y-z'.split('-') }}|{{ 'a b  c '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}"),
    ("str_methods2", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'aXbX'.replace('X', '-') }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'xxhixx'.strip('x') }} {{ '\\n\\nabc\\n'.strip('\\n') }}"),
    ("str_methods3", "{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.count('l') }} {{ ', '.join(['a', 'b']) }} {{ '123'.isdigit() }} {{ 'abc'.isalpha() }} {{ 'Abc'.islower() }} {{ '{} and {}'.format('x', 2) }} {{ '{a}'.format(a=1) }}"),
    ("str_split_think", "{% set c = '<think>\\nr\\n</think>\\n\\nans' %}{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}"),
    ("str_unicode_methods", "{{ u.upper() }} {{ u|length }} {{ u.split(' ') }} {{ 'ÉCOLE'.lower() }}"),
    ("str_splitlines", "{{ 'a\\nb\\r\\nc'.splitlines() }}"),
    # filters
    ("filter_trim", "[{{ s|trim }}] [{{ '\\u3000x\\n'|trim }}] [{{ 'xxaxx'|trim('x') }}]"),
    ("filter_length", "{{ l|length }} {{ d|length }} {{ u|length }} {{ emptys|length }} {{ nothing|length }} {{ l|count }}"),
    ("filter_length_int", "{{ i|length }}"),
    ("filter_tojson", "{{ d|tojson }} {{ l|tojson }} {{ u|tojson }} {{ n|tojson }} {{ t|tojson }} {{ x|tojson }} {{ 'a\"b\\\\c\\n\\t\\x01'|tojson }}"),
    ("filter_tojson_indent", "{{ d|tojson(indent=2) }}\n{{ people|tojson(indent=4) }}\n{{ empty|tojson(indent=2) }}{{ emptyd|tojson(indent=2) }}"),
    ("filter_tojson_sort", "{{ d|tojson(sort_keys=true) }}"),
    ("filter_tojson_floats", "{{ [1.0, 0.5, 1e20, 1e-7, 123.456]|tojson }}"),
    ("filter_tojson_undefined", "{{ nothing|tojson }}"),
    ("filter_join", "{{ l|join }} {{ l|join(', ') }} {{ people|join('/', attribute='name') }} {{ 'abc'|join('-') }}"),
    ("filter_list", "{{ 'ab'|list }} {{ d|list }} {{ (1, 2)|list }} {{ nothing|list }}"),
    ("filter_selectattr", "{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ people|selectattr('admin')|map(attribute='name')|list }} {{ people|rejectattr('admin')|map(attribute='name')|join(',') }}"),
    ("filter_select", "{{ [0, 1, 2, 3]|select|list }} {{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3]|reject('equalto', 2)|list }} {{ ['a', 'b']|reject('in', ['a'])|list }}"),
    ("filter_select_gt", "{{ l|select('gt', 1)|list }} {{ l|select('>', 1)|list }}"),
    ("filter_map", "{{ words|map('upper')|join(',') }} {{ people|map(attribute='age')|sum }} {{ people|map(attribute='admin', default='?')|list }}"),
    ("filter_items", "{{ d|items|list }} {{ nothing|items|list }}"),
    ("filter_items_bad", "{{ l|items|list }}"),
    ("filter_string", "{{ 3|string }}{{ n|string }}{{ l|string }}{{ nothing|string }}"),
    ("filter_default", "{{ nothing|default('dflt') }} {{ n|default('dflt') }} {{ emptys|default('dflt', true) }} {{ i|d(0) }} [{{ nothing|default }}]"),
    ("filter_case", "{{ 'hello World'|upper }} {{ 'Hello'|lower }} {{ 'hello world'|title }} {{ 'hELLO'|capitalize }}"),
    ("filter_first_last", "{{ l|first }} {{ l|last }} {{ 'abc'|first }} {{ 'abc'|last }} [{{ empty|first }}]"),
    ("filter_int_float", "{{ '42'|int }} {{ ' 12 '|int }} {{ '3.7'|int }} {{ 'x'|int }} {{ 'x'|int(-1) }} {{ 3.9|int }} {{ '0x1A'|int(0, 16) }} {{ 3|float }} {{ '2.5'|float }} {{ 'q'|float }}"),
    ("filter_abs", "{{ neg|abs }} {{ -2.5|abs }}"),
    ("filter_replace", "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }}"),
    ("filter_indent", "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x\\n'|indent(3) }}"),
    ("filter_dictsort", "{{ d|dictsort }} {{ {'b': 1, 'A': 2, 'c': 0}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }} {{ {'b': 1, 'a': 2}|dictsort(reverse=true) }}"),
    ("filter_sort", "{{ l|sort }} {{ words|sort }} {{ words|sort(case_sensitive=true) }} {{ l|sort(reverse=true) }} {{ people|sort(attribute='age')|map(attribute='name')|join }}"),
    ("filter_unique_minmax_sum", "{{ [1, 2, 1, 3]|unique|list }} {{ ['a', 'A', 'b']|unique|list }} {{ l|min }} {{ l|max }} {{ l|sum }} {{ words|max }}"),
    ("filter_reverse", "{{ 'abc'|reverse }} {{ l|reverse|list }}"),
    ("filter_round", "{{ 2.5|round }} {{ 3.5|round }} {{ 1.25|round(1) }} {{ 2.7|round(0, 'floor') }} {{ 2.1|round(0, 'ceil') }}"),
    ("filter_escape_safe", "{{ '<a href=\"x\">&</a>'|e }} {{ 'x'|safe }}"),
    ("filter_chain", "{{ messages|map(attribute='role')|unique|join('+')|upper }}"),
    ("unknown_filter", "{{ l|nosuchfilter }}"),
    ("unknown_test", "{{ l is nosuchtest }}"),
    ("unknown_tag", "{% nosuchtag %}"),
    # tests
    ("tests_types", "{{ n is none }} {{ s is string }} {{ d is mapping }} {{ l is iterable }} {{ s is iterable }} {{ i is iterable }} {{ l is sequence }} {{ i is number }} {{ x is number }} {{ t is number }} {{ i is integer }} {{ t is integer }} {{ x is float }} {{ t is boolean }} {{ i is boolean }}"),
    ("tests_values", "{{ t is true }} {{ 1 is true }} {{ f is false }} {{ 0 is false }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 2 is in l }} {{ 'a' is eq 'a' }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} {{ 3 is ge 3 }}"),
    ("tests_defined", "{{ nothing is defined }} {{ nothing is undefined }} {{ i is defined }} {{ d.zz is defined }} {{ messages[9] is defined }} {{ n is defined }}"),
    ("tests_not", "{{ i is not none }} {{ s is not string }} {{ nothing is not defined }}"),
    ("tests_undefined_types", "{{ nothing is iterable }} {{ nothing is mapping }} {{ nothing is none }} {{ nothing is string }} {{ nothing is sequence }}"),
    ("tests_case", "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aBc' is lower }}"),
    ("test_callable", "{{ range is callable }} {{ i is callable }}"),
    ("test_sameas", "{{ n is sameas none }} {{ t is sameas true }} {{ 1 is sameas true }}"),
    # undefined semantics
    ("undefined_eq", "{{ nothing == none }} {{ nothing != 1 }} {{ nothing == other_nothing }} {{ not nothing }}"),
    ("undefined_concat", "[{{ nothing ~ 'a' }}]"),
    ("undefined_add_error", "{{ nothing + 1 }}"),
    ("undefined_in", "{{ 'a' in nothing }} {{ nothing in l }}"),
    ("undefined_call", "{{ nothing() }}"),
    ("undefined_item_error", "{{ nothing[0] }}"),
    ("undefined_int_error", "{{ nothing|int }}"),
    ("undefined_compare_error", "{{ nothing < 1 }}"),
    ("list_index_undefined_attr_error", "{{ empty[0].role }}"),
    ("undefined_filters_empty", "[{{ nothing|trim }}{{ nothing|upper }}{{ nothing|join }}{{ nothing|first }}]"),
    # globals
    ("range", "{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }}"),
    ("range_loop", "{% for k in range(3) %}{{ k }}{% endfor %}"),
    ("range_too_big", "{{ range(100001)|length }}"),
    ("range_max_ok", "{{ range(100000)|length }}"),
    ("raise_exception", "{{ raise_exception('custom failure: ' ~ i) }}"),
    ("raise_in_branch", "{% if i > 5 %}{{ raise_exception('too big') }}{% endif %}never"),
    ("strftime_now", "{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d %H:%M:%S') }} {{ strftime_now('%A %B %j') }}"),
    ("dict_global", "{{ dict(a=1, b='x') }} {{ dict(a=1)|tojson }}"),
    ("call_non_callable", "{{ i() }}"),
    ("undefined_global", "{{ no_such_function() }}"),
    # jinja2 quirks found by differential testing
    ("generator_truthy", "{% if empty|select('odd') %}yes{% else %}no{% endif %} {{ messages|selectattr('role', 'equalto', 'x') is sequence }}"),
    ("generator_length_error", "{{ l|select('odd')|length }}"),
    ("generator_to_list", "{{ l|select('odd')|list|length }} {{ (l|reject('odd')|list)[0] }}"),
    ("select_falsy_input", "{{ n|select|list }} {{ 0|map('upper')|list }} {{ ''|selectattr('x')|list }}"),
    ("callable_undefined", "{{ nothing is callable }} {{ d.zz is callable }}"),
    ("sharp_s_case", "{{ 'straße'|upper }} {{ 'ß'.title() }} {{ 'ßa'|capitalize }} {{ 'aß'|title }} {{ 'ß' is lower }}"),
    ("odd_even_float", "{{ 0.5 is odd }} {{ 3.0 is odd }} {{ 4.0 is even }} {{ 7.5 is divisibleby 2.5 }}"),
    ("unhashable_in_dict", "{{ [1] in d }}"),
    ("comment_at_eof", "abc{#"),
    ("raw_at_eof", "abc{% raw %}"),
    ("round_int", "{{ 3|round }} {{ 3|round(1) }} {{ t|round }} {{ 3|round(0, 'floor') }}"),
    ("replace_non_string", "{{ 12321|replace(2, 'x') }}"),
    ("indent_non_string", "{{ 10|indent }}"),
    ("test_case_non_string", "{{ 7 is upper }} {{ [1] is lower }} {{ 'AB1' is upper }}"),
    ("slice_non_sequence", "{{ i[1:] }}"),
    ("scope_loop_before_set", "{% for v in [1] %}[{{ i }}]{% endfor %}{% set i = 5 %}{{ i }}"),
    ("scope_macro_before_set", "{% macro m() %}[{{ i }}]{% endmacro %}{{ m() }}{% set i = 5 %}{{ m() }}"),
    ("scope_branch_store", "{% for v in [1] %}[{{ i }}]{% endfor %}{% if f %}{% set i = 5 %}{% endif %}"),
    ("scope_all_branches", "{% for v in [1] %}[{{ i }}]{% endfor %}{% if f %}{% set i = 5 %}{% elif t %}{% set i = 6 %}{% else %}{% set i = 7 %}{% endif %}"),
    ("scope_if_else_store", "{% for v in [1] %}[{{ i }}]{% endfor %}{% if f %}{% set i = 5 %}{% else %}{% set i = 6 %}{% endif %}"),
    ("scope_load_first", "{% set y = i %}{% for v in [1] %}[{{ i }}]{% endfor %}{% set i = 5 %}"),
    ("scope_iter_load", "{% for v in [i] %}[{{ v }}]{% endfor %}{% set i = 5 %}"),
    ("scope_macro_later", "{% for v in [1] %}[{{ i is defined }}]{% endfor %}{% macro i() %}{% endmacro %}"),
    ("scope_generation_before_set", "{% generation %}[{{ i }}]{% endgeneration %}{% set i = 5 %}"),
    ("int_bases", "{{ '42'|int(0, 116) }} {{ 'ff'|int(0, 16) }} {{ '0x1A'|int(0, 16) }} {{ '101'|int(0, 2) }} {{ '1_000'|int }}"),
    ("repr_undefined_in_list", "{{ [1, nothing, d.zz] }}"),
    # syntax errors
    ("syntax_unclosed_if", "{% if t %}x"),
    ("syntax_unclosed_var", "{{ i "),
    ("syntax_bad_expr", "{{ 1 + }}"),
    ("syntax_unclosed_comment", "{# x"),
    ("syntax_unbalanced", "{{ (1 }}"),
    ("syntax_break_outside", "{% break %}"),
    ("syntax_endfor_mismatch", "{% for v in l %}{% endif %}"),
    ("syntax_bad_string", "{{ 'abc }}"),
    ("syntax_stray_endif", "{% endif %}"),
]


def features():
    out = []
    for name, tmpl in FEATURES:
        r = outcome(lambda: compiled(tmpl).render(**copy.deepcopy(CTX)))
        out.append({"name": name, "template": tmpl, **r})
    return out


# ---------------------------------------------------------------- DoS set (hand-specified: must error)

DOS = [
    ("range_1e9", "{% for a in range(1000000000) %}x{% endfor %}"),
    ("nested_ranges_3", "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}{% endfor %}{% endfor %}{% endfor %}"),
    ("nested_ranges_4", "{% for a in range(99999) %}{% for b in range(99999) %}{% for c in range(99999) %}{% for d in range(99999) %}x{% endfor %}{% endfor %}{% endfor %}{% endfor %}"),
    ("self_recursive_macro", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
    ("mutual_recursive_macro", "{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}"),
    ("parens_10k", "{{ " + "(" * 10000 + "1" + ")" * 10000 + " }}"),
    ("brackets_10k", "{{ " + "[" * 10000 + "]" * 10000 + " }}"),
    ("unary_10k", "{{ " + "-" * 10000 + "1 }}"),
    ("not_10k", "{{ " + "not " * 10000 + "1 }}"),
    ("nested_if_2k", "{% if 1 %}" * 2000 + "x" + "{% endif %}" * 2000),
    ("plus_chain_20k", "{{ 1" + " + 1" * 20000 + " }}"),
    ("string_doubling", "{% set ns = namespace(s='x') %}{% for a in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}"),
    ("list_doubling", "{% set ns = namespace(l=[1]) %}{% for a in range(100) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}"),
    ("output_flood", "{% for a in range(100000) %}{% for b in range(100000) %}0123456789abcdef{% endfor %}{% endfor %}"),
    ("string_repeat_huge", "{{ 'x' * 1000000000 }}"),
    ("nested_list_100k", "{% set ns = namespace(x=[]) %}{% for a in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}"),
    ("nested_dict_100k", "{% set ns = namespace(x={}) %}{% for a in range(100000) %}{% set ns.x = {'k': ns.x} %}{% endfor %}{{ ns.x == ns.x }}"),
    ("namespace_self_cycle", "{% set ns = namespace() %}{% set ns.me = ns %}{{ raise_exception('cycle kept: ' ~ (ns.me is defined)) }}"),
]


def main():
    templates = real_templates()
    convs = conversations()
    for t in templates:
        t["results"] = [render_chat(t, c) for c in convs]
        counts = {}
        for r in t["results"]:
            k = next(iter(r))
            counts[k] = counts.get(k, 0) + 1
        print(f"{t['name']}: {counts}", file=sys.stderr)
    chat = {"format": "spill-tmpl-chat", "version": FORMAT_VERSION, "now": NOW, "tz": "UTC",
            "jinja2": jinja2.__version__, "conversations": convs, "templates": templates}
    feats = {"format": "spill-tmpl-features", "version": FORMAT_VERSION, "now": NOW, "tz": "UTC",
             "jinja2": jinja2.__version__, "context": CTX, "cases": features()}
    dos = {"format": "spill-tmpl-dos", "version": FORMAT_VERSION,
           "cases": [{"name": n, "template": t} for n, t in DOS]}
    for fname, obj in (("chat.json", chat), ("features.json", feats), ("dos.json", dos)):
        with open(os.path.join(OUT, fname), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
            f.write("\n")
    print(f"wrote {len(templates)} templates x {len(convs)} conversations, {len(feats['cases'])} features, "
          f"{len(DOS)} dos cases", file=sys.stderr)


if __name__ == "__main__":
    main()
