#!/usr/bin/env python3
"""make_corpus.py — writes the `spill check` corpus: bad/*.jsonl (one rule broken
each), good/*.jsonl, and expected.tsv (file → exact first error sentence, or the
OK summary).  The sentences below were written by hand from the rules in
src/request.c / src/check.c before the checker was run on these files; the C
test (tests/test_check.c) compares them byte for byte.

expected.tsv columns (tab-separated):
  bad:  bad/<name>  <code>  <line>  <sentence>          (line 0 = not tied to a line)
  good: good/<name> OK      <rows>  <kind name>  <model or "-">
Run from the repo root: python3 tests/data/check/make_corpus.py
"""
import json, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
M = "smollm2:135m"


def dump(o):
    return json.dumps(o, ensure_ascii=False, separators=(",", ":"))


def body(**kw):
    b = {"model": M, "messages": [{"role": "user", "content": "What is 2+2?"}]}
    for k, v in kw.items():
        if v is DEL:
            b.pop(k, None)
        else:
            b[k] = v
    return b


DEL = object()


def batch(cid="req-1", b=None, url="/v1/chat/completions", **top):
    o = {"custom_id": cid, "method": "POST", "url": url, "body": b if b is not None else body()}
    if url is DEL:
        del o["url"]
    for k, v in top.items():
        if v is DEL:
            o.pop(k, None)
        else:
            o[k] = v
    return dump(o)


def cbody(**kw):
    b = {"model": M, "prompt": "Once upon a time"}
    b.update(kw)
    return b


OK1 = batch("req-0")
bad = []   # (name, lines or raw bytes, code, line, sentence-after-"name line N: ")


def case(name, lines, code, line, msg):
    bad.append((name, lines, code, line, msg))


# --- file-level: JSON and encoding ---
case("json_truncated", [OK1, '{"custom_id":"req-1","method":"POST"'], "invalid_json_line", 2,
     "the line is not valid JSON ('}' expected near end of file, column 36); each line must be one complete JSON object.")
case("json_trailing", [OK1 + " x"], "invalid_json_line", 1,
     "the line is not valid JSON (end of file expected near 'x', column %d); each line must be one complete JSON object." % (len(OK1) + 2))
case("json_array", ["[1,2]"], "invalid_json_line", 1,
     "the line is a JSON array, but each line must be one JSON object (one request).")
case("json_bom", [b"\xef\xbb\xbf" + OK1.encode()], "invalid_json_line", 1,
     "the line starts with a UTF-8 byte-order mark, which is not valid JSON; save the file as UTF-8 without BOM.")
case("json_bad_utf8", [OK1, b'{"custom_id":"r\xff"}'], "invalid_json_line", 2,
     "byte 16 of the line is not valid UTF-8; save the file as UTF-8.")
case("json_dup_key", ['{"custom_id":"a","custom_id":"b","method":"POST"}'], "invalid_json_line", 1,
     'the key "custom_id" appears twice in one JSON object (column 28); remove one of them.')
case("json_nul_escape", [batch("a\\u0000b").replace("a\\\\u0000b", "a\\u0000b")], "invalid_json_line", 1,
     "a string holds \\u0000 (a NUL character, column 23), which spill does not accept; remove it.")
case("neither_format", ['{"prompt":"hi"}'], "invalid_request", 1,
     "the line is neither an OpenAI batch request (custom_id, method, url, body) nor a chat line (messages); see `spill check` in the docs for the formats.")
case("both_formats", [dump({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body(),
                            "messages": [{"role": "user", "content": "x"}]})], "invalid_request", 1,
     "the line has both top-level messages and a batch body; put messages inside body (batch line) or drop custom_id/method/url/body (fine-tuning line).")
# --- batch header ---
case("custom_id_missing", [OK1, batch(custom_id=DEL)], "invalid_request", 2,
     "custom_id is missing; every batch line needs a unique custom_id string.")
case("custom_id_number", [batch(7)], "invalid_request", 1, "custom_id is 7, but it must be a string.")
case("custom_id_empty", [batch("")], "invalid_request", 1,
     "custom_id is empty; give every line a unique, non-empty custom_id.")
case("custom_id_duplicate", [batch("a"), batch("b"), batch("a")], "duplicate_custom_id", 3,
     'custom_id "a" is already used on line 1; every custom_id must be unique.')
case("method_get", [batch(method="GET")], "invalid_request", 1,
     'method is "GET", but batch requests must use "POST".')
case("method_missing", [batch(method=DEL)], "invalid_request", 1,
     'method is missing, but batch requests must use "POST".')
case("url_unknown", [batch(url="/v1/chat")], "invalid_request", 1,
     'url is "/v1/chat", but it must be "/v1/chat/completions", "/v1/completions" or "/v1/embeddings".')
case("url_responses", [batch(url="/v1/responses")], "invalid_request", 1,
     'url is "/v1/responses", which spill recognises but does not support yet; use "/v1/chat/completions", "/v1/completions" or "/v1/embeddings".')
case("embeddings_chat_body", [batch(url="/v1/embeddings")], "invalid_request", 1,
     "body.messages is not a field of an embeddings request that spill accepts; remove it.")
case("embeddings_no_input", [batch(b={"model": M}, url="/v1/embeddings")], "invalid_request", 1,
     "body.input is missing; an embeddings request needs an input (a string, a list of strings, a list of token ids or a list of token-id lists).")
case("embeddings_empty_string", [batch(b={"model": M, "input": ["a", ""]}, url="/v1/embeddings")], "invalid_request", 1,
     "body.input[1] is an empty string, which has nothing to embed; give it some text or drop it.")
case("embeddings_mixed_list", [batch(b={"model": M, "input": ["a", 3]}, url="/v1/embeddings")], "invalid_request", 1,
     "body.input[1] is 3, but like body.input[0] it must be a string.")
case("embeddings_encoding", [batch(b={"model": M, "input": "a", "encoding_format": "int8"}, url="/v1/embeddings")],
     "invalid_request", 1, 'body.encoding_format is "int8", but it must be "float" or "base64".')
case("embeddings_dimensions", [batch(b={"model": M, "input": "a", "dimensions": 0}, url="/v1/embeddings")],
     "invalid_request", 1, "body.dimensions is 0, but it must be at least 1.")
case("url_moderations", [batch(url="/v1/moderations")], "invalid_request", 1,
     'url is "/v1/moderations", an OpenAI batch endpoint that spill does not serve (it runs text models); use "/v1/chat/completions", "/v1/completions" or "/v1/embeddings".')
# endpoint_*: checked with --endpoint /v1/chat/completions (tests/test_check.c); without it a file may mix
# chat and completions rows, as `spill run` answers them
case("endpoint_mismatch", [batch("a"), batch("b", cbody(), url="/v1/completions")], "url_mismatch", 2,
     'url is "/v1/completions", but --endpoint is "/v1/chat/completions"; every line of this batch must use that endpoint.')
case("top_level_unknown", [batch(extra=1)], "invalid_request", 1,
     "extra is not a field of a batch line (custom_id, method, url, body, and expected in eval files) that spill accepts; remove it.")
case("body_string", [batch(b="hi")], "invalid_request", 1, 'body is "hi", but it must be the request object.')
case("model_missing", [batch(b=body(model=DEL))], "invalid_request", 1,
     "body.model is missing; every batch line must name the same model.")
case("model_mismatch", [batch("a"), batch("b", body(model="llama3.3:70b"))], "model_mismatch", 2,
     'body.model is "llama3.3:70b", but line 1 uses "smollm2:135m"; every line of a batch must name the same model.')
case("mixed_kinds", [batch("a"), dump({"messages": [{"role": "user", "content": "x"}]})], "invalid_request", 2,
     'this is a fine-tuning chat line ({"messages": …}), but line 1 is an OpenAI batch line; a file must use one format throughout.')
case("eval_missing_expected", [batch("a", expected="4"), batch("b")], "invalid_request", 2,
     'this line has no "expected" field, but line 1 has one; give every line an expected answer, or none.')
case("eval_expected_null", [batch("a", expected=None)], "invalid_request", 1,
     "expected is null; give the expected answer (a string, or the JSON value your metric reads).")
# --- messages ---
case("messages_missing", [batch(b=body(messages=DEL))], "invalid_request", 1,
     "body.messages is missing; a chat request needs a list of messages.")
case("messages_empty", [batch(b=body(messages=[]))], "invalid_request", 1,
     "body.messages is an empty array, but it must be a non-empty list of messages.")
case("message_string", [batch(b=body(messages=["hi"]))], "invalid_request", 1,
     'body.messages[0] is "hi", but each message must be an object with a role and content.')
case("role_missing", [batch(b=body(messages=[{"content": "x"}]))], "invalid_request", 1,
     "body.messages[0].role is missing; give each message a role (system, user, assistant, tool, …).")
case("role_invalid", [batch(b=body(messages=[{"role": "system", "content": "s"}, {"role": "robot", "content": "x"}]))],
     "invalid_request", 1,
     'body.messages[1].role is "robot", but it must be one of developer, system, user, assistant, tool or function.')
case("content_missing", [batch(b=body(messages=[{"role": "user"}]))], "invalid_request", 1,
     "body.messages[0].content is missing; a user message needs content (a string or a list of text parts).")
case("content_number", [batch(b=body(messages=[{"role": "user", "content": 5}]))], "invalid_request", 1,
     "body.messages[0].content is 5, but it must be a string or a list of text parts.")
case("content_image", [batch(b=body(messages=[{"role": "user", "content": [
    {"type": "text", "text": "What is this?"},
    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]))], "invalid_request", 1,
     'body.messages[0].content[1] is a part of type "image_url", which is not supported by text models; send text parts only.')
case("content_part_no_text", [batch(b=body(messages=[{"role": "user", "content": [{"type": "text"}]}]))],
     "invalid_request", 1, "body.messages[0].content[0].text is missing, but a text part needs a string text.")
case("message_unknown_field", [batch(b=body(messages=[{"role": "user", "content": "x", "thinking": "y"}]))],
     "invalid_request", 1, "body.messages[0].thinking is not a field of a user message that spill accepts; remove it.")
case("assistant_null_content", [batch(b=body(messages=[{"role": "user", "content": "x"},
                                                        {"role": "assistant", "content": None}]))],
     "invalid_request", 1,
     "body.messages[1].content is null; an assistant message needs content unless it has tool_calls.")
case("tool_call_bad_type", [batch(b=body(messages=[
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "tool", "function": {"name": "get_weather", "arguments": "{}"}}]}]))],
     "invalid_request", 1, 'body.messages[1].tool_calls[0].type is "tool", but it must be "function".')
case("tool_call_args_object", [batch(b=body(messages=[
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}]))],
     "invalid_request", 1,
     'body.messages[1].tool_calls[0].function.arguments is an object, but it must be a string holding the arguments as JSON (e.g. "{\\"x\\": 1}").')
case("tool_message_no_id", [batch(b=body(messages=[{"role": "user", "content": "x"},
                                                    {"role": "tool", "content": "18C"}]))],
     "invalid_request", 1,
     "body.messages[1].tool_call_id is missing; a tool message needs the id of the tool call it answers.")
# --- sampling parameters ---
case("max_tokens_zero", [batch(b=body(max_tokens=0))], "invalid_request", 1,
     "body.max_tokens is 0, but it must be at least 1.")
case("max_tokens_string", [batch(b=body(max_tokens="100"))], "invalid_request", 1,
     'body.max_tokens is "100", but it must be a whole number, at least 1.')
case("max_tokens_conflict", [batch(b=body(max_tokens=10, max_completion_tokens=20))], "invalid_request", 1,
     "body.max_completion_tokens is 20 but body.max_tokens is 10; set only one of them (max_tokens is the older name).")
case("temperature_high", [batch(b=body(temperature=2.5))], "invalid_request", 1,
     "body.temperature is 2.5, but it must be between 0 and 2.")
case("top_p_negative", [batch(b=body(top_p=-0.1))], "invalid_request", 1,
     "body.top_p is -0.1, but it must be between 0 and 1.")
case("n_too_big", [batch(b=body(n=200))], "invalid_request", 1, "body.n is 200, but it must be between 1 and 128.")
case("stop_too_many", [batch(b=body(stop=["a", "b", "c", "d", "e"]))], "invalid_request", 1,
     "body.stop has 5 sequences, but at most 4 are allowed.")
case("stop_empty", [batch(b=body(stop=""))], "invalid_request", 1,
     "body.stop is an empty string; give a non-empty stop sequence or remove it.")
case("seed_fraction", [batch(b=body(seed=1.5))], "invalid_request", 1,
     "body.seed is 1.5, but it must be a whole number.")
case("logprobs_string", [batch(b=body(logprobs="yes"))], "invalid_request", 1,
     'body.logprobs is "yes", but it must be true or false.')
case("top_logprobs_25", [batch(b=body(logprobs=True, top_logprobs=25))], "invalid_request", 1,
     "body.top_logprobs is 25, but it must be between 0 and 20.")
case("top_logprobs_no_logprobs", [batch(b=body(top_logprobs=5))], "invalid_request", 1,
     'body.top_logprobs is set, but body.logprobs is not true; set "logprobs": true to get top log-probs.')
case("presence_penalty_low", [batch(b=body(presence_penalty=-3))], "invalid_request", 1,
     "body.presence_penalty is -3, but it must be between -2 and 2.")
case("logit_bias_key", [batch(b=body(logit_bias={"hello": 5}))], "invalid_request", 1,
     'body.logit_bias: the key "hello" is not a token id; logit_bias keys must be token ids written as decimal strings.')
case("logit_bias_value", [batch(b=body(logit_bias={"50256": -101}))], "invalid_request", 1,
     "body.logit_bias.50256 is -101, but it must be between -100 and 100.")
case("logit_bias_fraction", [batch(b=body(logit_bias={"13": 2.5}))], "invalid_request", 1,
     "body.logit_bias.13 is 2.5, but it must be a whole number between -100 and 100.")
case("stream_true", [batch(b=body(stream=True))], "invalid_request", 1,
     "body.stream is true, but batch rows cannot stream; remove it or set it to false.")
case("body_unknown_field", [batch(b=body(temprature=0.5))], "invalid_request", 1,
     "body.temprature is not a field of a chat-completions request that spill accepts; remove it.")
case("response_format_keyword", [batch(b=body(response_format={"type": "json_schema", "json_schema": {
        "name": "code", "schema": {"type": "object", "properties": {"code": {"type": "string", "not": {"const": "x"}}}}}}))],
     "invalid_request", 1,
     'body.response_format.json_schema.schema.properties.code.not: the keyword "not" is not supported by spill\'s constrained decoding; remove it.')
case("tool_choice_required_no_tools", [batch(b=body(tool_choice="required"))], "invalid_request", 1,
     'body.tool_choice is "required", but the request has no tools to call; add tools or remove body.tool_choice.')
case("tool_choice_unknown_name", [batch(b=body(tools=[{"type": "function", "function": {"name": "f"}}],
                                             tool_choice={"type": "function", "function": {"name": "g"}}))],
     "invalid_request", 1,
     'body.tool_choice.function.name is "g", which is not the name of any of the request\'s tools.')
case("tool_not_function", [batch(b=body(tools=[{"type": "web_search"}]))], "invalid_request", 1,
     'body.tools[0].type is "web_search", but spill supports only "function" tools.')
case("tool_name_invalid", [batch(b=body(tools=[{"type": "function", "function": {"name": "get weather"}}]))],
     "invalid_request", 1,
     "body.tools[0].function.name is \"get weather\", but a function name must be 1 to 64 letters, digits, '_' or '-'.")
case("audio_output", [batch(b=body(audio={"voice": "alloy", "format": "wav"}))], "invalid_request", 1,
     "body.audio is set, but audio output needs an audio model; remove it.")
# --- completions ---
case("completions_no_prompt", [batch(b={"model": M}, url="/v1/completions")], "invalid_request", 1,
     "body.prompt is missing; a completions request needs a prompt.")
case("completions_prompt_mixed", [batch(b=cbody(prompt=["a", 1]), url="/v1/completions")], "invalid_request", 1,
     'body.prompt[1] is 1, but like body.prompt[0] it must be a string.')
case("completions_prompt_negative_token", [batch(b=cbody(prompt=[[1, 2], [3, -4]]), url="/v1/completions")],
     "invalid_request", 1, "body.prompt[1][1] is -4, but it must be a token id (a whole number from 0).")
case("completions_logprobs_6", [batch(b=cbody(logprobs=6), url="/v1/completions")], "invalid_request", 1,
     "body.logprobs is 6, but it must be between 0 and 5.")
case("completions_best_of", [batch(b=cbody(best_of=3), url="/v1/completions")], "invalid_request", 1,
     "body.best_of is 3, but spill does not support best_of above 1; use n to get several choices.")
case("completions_messages", [batch(b=body(), url="/v1/completions")], "invalid_request", 1,
     "body.messages is not a field of a completions request that spill accepts; remove it.")
# --- fine-tuning / eval chat lines ---
FT = {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "4"}]}
case("ft_unknown_top", [dump(dict(FT, model="x"))], "invalid_request", 1,
     "model is not a field of a fine-tuning chat line (messages, tools, parallel_tool_calls, functions, custom_id, expected) that spill accepts; remove it.")
case("ft_weight_2", [dump({"messages": [{"role": "user", "content": "x"},
                                        {"role": "assistant", "content": "y", "weight": 2}]})],
     "invalid_request", 1, "messages[1].weight is 2, but it must be 0 or 1.")
case("ft_generated_id_clash", [dump(dict(FT, custom_id="row-3")), dump(FT), dump(FT)], "duplicate_custom_id", 3,
     'custom_id "row-3" is already used on line 1; every custom_id must be unique.')
case("ft_messages_object", [dump({"messages": {"role": "user", "content": "x"}})], "invalid_request", 1,
     "messages is an object, but it must be a non-empty list of messages.")
# --- more shapes (each still one rule broken) ---
U = {"role": "user", "content": "x"}
case("content_part_string", [batch(b=body(messages=[{"role": "user", "content": ["hi"]}]))], "invalid_request", 1,
     'body.messages[0].content[0] is "hi", but each content part must be an object like {"type": "text", "text": "…"}.')
case("content_part_video", [batch(b=body(messages=[{"role": "user", "content": [{"type": "video", "text": "x"}]}]))],
     "invalid_request", 1, 'body.messages[0].content[0].type is "video", but it must be "text".')
case("content_part_refusal_user", [batch(b=body(messages=[{"role": "user", "content": [{"type": "refusal", "refusal": "x"}]}]))],
     "invalid_request", 1, 'body.messages[0].content[0].type is "refusal", but it must be "text".')
case("content_part_extra_key", [batch(b=body(messages=[{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {}}]}]))],
     "invalid_request", 1, "body.messages[0].content[0].cache_control is not a field of a content part that spill accepts; remove it.")
case("content_empty_list", [batch(b=body(messages=[{"role": "user", "content": []}]))], "invalid_request", 1,
     "body.messages[0].content is an empty list; give a string or at least one text part.")
case("system_content_null", [batch(b=body(messages=[{"role": "system", "content": None}, U]))], "invalid_request", 1,
     "body.messages[0].content is null; a system message needs content (a string or a list of text parts).")
case("tool_calls_empty", [batch(b=body(messages=[U, {"role": "assistant", "tool_calls": []}]))], "invalid_request", 1,
     "body.messages[1].tool_calls is an empty array, but it must be a non-empty list of tool calls.")
case("tool_call_no_id", [batch(b=body(messages=[U, {"role": "assistant", "tool_calls": [
    {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]))], "invalid_request", 1,
     "body.messages[1].tool_calls[0].id is missing, but a tool call needs a string id.")
case("tool_call_no_function", [batch(b=body(messages=[U, {"role": "assistant", "tool_calls": [
    {"id": "c", "type": "function"}]}]))], "invalid_request", 1,
     "body.messages[1].tool_calls[0].function is missing, but it must be an object with a name and JSON-encoded arguments.")
case("assistant_audio", [batch(b=body(messages=[U, {"role": "assistant", "content": "y", "audio": {"id": "a1"}}]))],
     "invalid_request", 1, "body.messages[1].audio refers to earlier audio output, which text models cannot use; remove it.")
case("assistant_weight_in_batch", [batch(b=body(messages=[U, {"role": "assistant", "content": "y", "weight": 1}]))],
     "invalid_request", 1, "body.messages[1].weight is not a field of an assistant message that spill accepts; remove it.")
case("function_message_no_name", [batch(b=body(messages=[U, {"role": "function", "content": "42"}]))],
     "invalid_request", 1, "body.messages[1].name is missing; a function message needs the function's name.")
case("message_name_number", [batch(b=body(messages=[{"role": "user", "content": "x", "name": 5}]))],
     "invalid_request", 1, "body.messages[0].name is 5, but it must be a string.")
case("tool_def_no_name", [batch(b=body(tools=[{"type": "function", "function": {"description": "d"}}]))],
     "invalid_request", 1, "body.tools[0].function.name is missing, but a function needs a string name.")
case("tool_def_parameters_list", [batch(b=body(tools=[{"type": "function", "function": {"name": "f", "parameters": []}}]))],
     "invalid_request", 1, "body.tools[0].function.parameters is an empty array, but it must be a JSON Schema object.")
case("tools_object", [batch(b=body(tools={"type": "function"}))], "invalid_request", 1,
     "body.tools is an object, but it must be a list of tools.")
case("functions_string", [batch(b=body(functions="f"))], "invalid_request", 1,
     'body.functions is "f", but it must be a list of functions.')
case("function_call_forced", [batch(b=body(functions=[{"name": "f"}], function_call={"name": "f"}))],
     "invalid_request", 1,
     'body.function_call is an object, but forcing a function call needs constrained decoding, which spill does not support; use "auto", "none" or remove it.')
case("stop_number", [batch(b=body(stop=5))], "invalid_request", 1,
     "body.stop is 5, but it must be a string or a list of up to 4 strings.")
case("stop_list_number", [batch(b=body(stop=["a", 1]))], "invalid_request", 1,
     "body.stop[1] is 1, but each stop sequence must be a non-empty string.")
case("logit_bias_list", [batch(b=body(logit_bias=[1, 2]))], "invalid_request", 1,
     "body.logit_bias is an array, but it must be an object mapping token ids to a whole-number bias between -100 and 100.")
case("stream_options_set", [batch(b=body(stream_options={"include_usage": True}))], "invalid_request", 1,
     "body.stream_options is set, but it applies only to streaming, which batch rows do not use; remove it.")
case("metadata_number_value", [batch(b=body(metadata={"k": 1}))], "invalid_request", 1,
     "body.metadata.k is 1, but metadata values must be strings.")
case("user_number", [batch(b=body(user=5))], "invalid_request", 1, "body.user is 5, but it must be a string.")
case("response_format_string", [batch(b=body(response_format="json"))], "invalid_request", 1,
     'body.response_format is "json", but it must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name": …, "schema": {…}}}.')
case("modalities_audio", [batch(b=body(modalities=["text", "audio"]))], "invalid_request", 1,
     'body.modalities is an array, but spill only produces text; use ["text"] or remove it.')
case("store_string", [batch(b=body(store="yes"))], "invalid_request", 1,
     'body.store is "yes", but it must be true or false.')
case("key_with_newline", [batch(b=body(**{"te\nmp": 1}))], "invalid_request", 1,
     "body.te?mp is not a field of a chat-completions request that spill accepts; remove it.")
case("url_missing", [batch(url=DEL)], "invalid_request", 1,
     'url is missing, but it must be "/v1/chat/completions", "/v1/completions" or "/v1/embeddings".')
case("model_empty", [batch(b=body(model=""))], "invalid_request", 1, 'body.model is "", but it must be the model\'s name.')
case("completions_prompt_empty", [batch(b=cbody(prompt=[]), url="/v1/completions")], "invalid_request", 1,
     "body.prompt is an empty array, but it must be a string, a list of strings, a list of token ids or a list of token-id lists.")
case("completions_prompt_object", [batch(b=cbody(prompt=[{"text": "a"}]), url="/v1/completions")], "invalid_request", 1,
     "body.prompt[0] is an object, but body.prompt must be a string, a list of strings, a list of token ids or a list of token-id lists.")
case("completions_prompt_empty_tokens", [batch(b=cbody(prompt=[[1], []]), url="/v1/completions")], "invalid_request", 1,
     "body.prompt[1] is an empty array, but like body.prompt[0] it must be a non-empty list of token ids.")
case("completions_suffix", [batch(b=cbody(suffix="The end."), url="/v1/completions")], "invalid_request", 1,
     'body.suffix is "The end.", but spill does not support insertion (suffix); remove it.')
case("completions_echo_string", [batch(b=cbody(echo="yes"), url="/v1/completions")], "invalid_request", 1,
     'body.echo is "yes", but it must be true or false.')
case("utf8_overlong", [b'{"custom_id":"\xc0\x80"}'], "invalid_json_line", 1,
     "byte 15 of the line is not valid UTF-8; save the file as UTF-8.")
case("utf8_surrogate", [b'{"custom_id":"\xed\xa0\x80"}'], "invalid_json_line", 1,
     "byte 15 of the line is not valid UTF-8; save the file as UTF-8.")
case("utf8_cut_at_end", [b'{"custom_id":"a"}\xe2\x82'], "invalid_json_line", 1,
     "byte 18 of the line is not valid UTF-8; save the file as UTF-8.")
# found by fuzz_jsonl: jansson's "near" excerpt cut a UTF-8 sequence; the sentence must stay valid UTF-8
case("json_error_cuts_utf8", [b'{"( ":"qs\\u0\xde\xad000"logp'], "invalid_json_line", 1,
     "the line is not valid JSON (invalid escape near '\"qs\\u0?', column 13); each line must be one complete JSON object.")
case("ft_custom_id_number", [dump(dict(FT, custom_id=5))], "invalid_request", 1,
     "custom_id is 5, but it must be a string.")
case("ft_tool_bad_type", [dump(dict(FT, tools=[{"type": "code_interpreter"}]))], "invalid_request", 1,
     'tools[0].type is "code_interpreter", but spill supports only "function" tools.')
case("ft_parallel_string", [dump(dict(FT, parallel_tool_calls="no"))], "invalid_request", 1,
     'parallel_tool_calls is "no", but it must be true or false.')
case("ft_eval_then_plain", [dump(dict(FT, expected="4")), dump(FT)], "invalid_request", 2,
     'this line has no "expected" field, but line 1 has one; give every line an expected answer, or none.')
case("ft_plain_then_eval", [dump(FT), dump(dict(FT, expected="4"))], "invalid_request", 2,
     'this line has an "expected" field, but line 1 does not; give every line an expected answer, or none.')
case("batch_after_ft", [dump(FT), batch("a")], "invalid_request", 2,
     'this is an OpenAI batch line, but line 1 is a fine-tuning chat line ({"messages": …}); a file must use one format throughout.')
case("error_after_blank_crlf", ["", OK1, "\r", '{"custom_id":"req-1"}'], "invalid_request", 4,
     'method is missing, but batch requests must use "POST".')
case("empty", [], "empty_file", 0,
     "the file has no requests (it is empty or holds only blank lines); write one JSON object per line.")
case("blank_only", ["", "   ", "\t"], "empty_file", 0,
     "the file has no requests (it is empty or holds only blank lines); write one JSON object per line.")

good = []  # (name, bytes, rows, kind name, model)


def gfile(name, lines, rows, kind, model, eol="\n", final=True):
    data = eol.join(l if isinstance(l, str) else l.decode() for l in lines)
    if final and lines:
        data += eol
    good.append((name, data.encode(), rows, kind, model))


gfile("mixed_endpoints.jsonl", [batch("a"), batch("b", cbody(), url="/v1/completions")], 2, "chat-completion batch", M)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
chat_lines = [
    batch("q-1", body(max_tokens=64)),
    batch("q-2", body(messages=[{"role": "developer", "content": "Answer in French."},
                                {"role": "user", "content": [{"type": "text", "text": "Hello"},
                                                             {"type": "text", "text": "there"}]}],
                      temperature=0.7, top_p=0.9, n=2, stop=["\n\n", "END"], seed=42, logprobs=True,
                      top_logprobs=5, frequency_penalty=0.5, presence_penalty=-0.5,
                      logit_bias={"50256": -100, "13": 2}, max_completion_tokens=128)),
    batch("q-3", body(messages=[{"role": "system", "content": "Use tools."},
                                {"role": "user", "content": "Weather in Paris?"},
                                {"role": "assistant", "content": None, "tool_calls": [
                                    {"id": "call_1", "type": "function",
                                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                                {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"}],
                      tools=TOOLS, tool_choice="auto", parallel_tool_calls=False, stream=False, user="u-1",
                      metadata={"split": "test"}, store=False, response_format={"type": "text"}, temperature=0,
                      stop="\n", max_tokens=None)),
    batch("q-4 ünïcödé ✓", body(messages=[{"role": "user", "content": "数学: 2+2? 🙂"}], max_tokens=100.0)),
    batch("q-5", body(messages=[{"role": "user", "content": "Call f.", "name": "ann"},
                                {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
                                {"role": "function", "name": "f", "content": "42"},
                                {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}],
                                 "refusal": "No."},
                                {"role": "user", "content": "Why?"}],
                      functions=[{"name": "f", "parameters": {"type": "object", "properties": {}}}],
                      function_call="auto", modalities=["text"], stream_options=None, reasoning_effort="low",
                      service_tier="auto", prompt_cache_key="k", safety_identifier="s", verbosity="low",
                      logit_bias={}, stop=[], seed=None, n=None)),
]
gfile("chat_batch.jsonl", chat_lines, 5, "chat-completion batch", M)
gfile("chat_batch_crlf.jsonl", chat_lines, 5, "chat-completion batch", M, eol="\r\n")
gfile("chat_batch_no_final_newline.jsonl", chat_lines[:2], 2, "chat-completion batch", M, final=False)
gfile("chat_batch_blank_lines.jsonl", ["", chat_lines[0], "  ", chat_lines[1], ""], 2, "chat-completion batch", M)
gfile("completions_batch.jsonl", [
    batch("c-1", cbody(), url="/v1/completions"),
    batch("c-2", cbody(prompt=["a", "b"], max_tokens=8, logprobs=0, echo=True, suffix=None, best_of=1),
          url="/v1/completions"),
    batch("c-3", cbody(prompt=[1, 2, 3], logprobs=5, stop=["."], temperature=0), url="/v1/completions"),
    batch("c-4", cbody(prompt=[[1, 2], [3]], n=3, seed=-7), url="/v1/completions"),
], 4, "completion batch", M)
gfile("embeddings_batch.jsonl", [
    batch("e-1", {"model": M, "input": "The quick brown fox"}, url="/v1/embeddings"),
    batch("e-2", {"model": M, "input": ["a", "b"], "encoding_format": "base64", "user": "u"}, url="/v1/embeddings"),
    batch("e-3", {"model": M, "input": [1, 2, 3], "dimensions": 8, "encoding_format": "float"}, url="/v1/embeddings"),
    batch("e-4", {"model": M, "input": [[1, 2], [3]], "dimensions": None}, url="/v1/embeddings"),
], 4, "embedding batch", M)
gfile("mixed_embeddings.jsonl", [batch("a"), batch("b", {"model": M, "input": "x"}, url="/v1/embeddings")], 2,
      "chat-completion batch", M)
gfile("finetune_chat.jsonl", [
    dump(FT),
    dump({"messages": [{"role": "user", "content": "Weather in Paris?"},
                       {"role": "assistant", "tool_calls": [
                           {"id": "call_id", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                       {"role": "tool", "tool_call_id": "call_id", "content": "18C"},
                       {"role": "assistant", "content": "It is 18C.", "weight": 1}],
          "tools": TOOLS, "parallel_tool_calls": False}),
    dump({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey", "weight": 0}]}),
], 3, "fine-tuning chat", "-")
gfile("eval_batch.jsonl", [batch("e-1", body(max_tokens=8), expected="4"),
                           batch("e-2", body(messages=[{"role": "user", "content": "Capital of France?"}]),
                                 expected=["Paris", "paris"])], 2, "eval (chat-completion batch)", M)
gfile("eval_finetune.jsonl", [dump({"messages": [{"role": "user", "content": "2+2?"}], "expected": "4"}),
                              dump({"messages": [{"role": "user", "content": "JSON?"}], "expected": {"a": 1},
                                    "custom_id": "json-1"})], 2, "eval (fine-tuning chat)", "-")


def main():
    for d in ("bad", "good"):
        os.makedirs(os.path.join(HERE, d), exist_ok=True)
        for f in os.listdir(os.path.join(HERE, d)):
            if f.endswith(".jsonl"):
                os.unlink(os.path.join(HERE, d, f))
    rows = []
    for name, lines, code, line, msg in bad:
        data = b"".join((l if isinstance(l, bytes) else l.encode()) + b"\n" for l in lines)
        with open(os.path.join(HERE, "bad", name + ".jsonl"), "wb") as f:
            f.write(data)
        fname = name + ".jsonl"
        sentence = ("%s line %d: %s" % (fname, line, msg)) if line else ("%s: %s" % (fname, msg))
        assert "\t" not in sentence and "\n" not in sentence
        rows.append("bad/%s\t%s\t%d\t%s" % (fname, code, line, sentence))
    for name, data, n, kind, model in good:
        with open(os.path.join(HERE, "good", name), "wb") as f:
            f.write(data)
        rows.append("good/%s\tOK\t%d\t%s\t%s" % (name, n, kind, model))
    with open(os.path.join(HERE, "expected.tsv"), "w", encoding="utf-8") as f:
        f.write("# written by make_corpus.py; see its docstring for the columns\n")
        f.write("\n".join(rows) + "\n")
    print("%d bad, %d good" % (len(bad), len(good)))


if __name__ == "__main__":
    main()
