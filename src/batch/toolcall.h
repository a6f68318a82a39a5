/*
 * toolcall.h — function calling: which convention a model's chat template
 * teaches (Hermes/Qwen <tool_call>, Llama 3.x JSON / <|python_tag|>, Mistral
 * [TOOL_CALLS]), the tools a row's tool_choice lets the template see, and the
 * parser that turns an answer's text back into OpenAI `message.tool_calls`.
 * See toolcall.c for the conventions byte by byte and every rule.
 *
 * Nothing here runs the model: the runner asks for a row's state when it
 * builds the row (toolcall_row_init), emits the convention's marker tokens as
 * text (the detokenizer would skip them as special), and parses each choice's
 * text when the row finishes (toolcall_parse).
 */
#ifndef SPILL_TOOLCALL_H
#define SPILL_TOOLCALL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum tc_style {
    TC_STYLE_NONE = 0, /* the template shows no call convention spill knows: tools are rendered, nothing parsed */
    TC_STYLE_HERMES,   /* <tool_call>{"name":…,"arguments":{…}}</tool_call> (Hermes 2/3, Qwen2.5, Qwen3) */
    TC_STYLE_LLAMA3,   /* {"name":…,"parameters":{…}} or <|python_tag|>{…} (Llama 3.1, 3.2, 3.3) */
    TC_STYLE_MISTRAL,  /* [TOOL_CALLS][{…},…] (v0.3, Nemo) or [TOOL_CALLS]name[ARGS]{…} (v11 tokenizers) */
} tc_style;

/* body.tool_choice as request.c validated it. */
typedef enum tc_choice {
    TC_CHOICE_AUTO = 0, /* absent, null or "auto" */
    TC_CHOICE_NONE,     /* "none": the template sees no tools and nothing is parsed (OpenAI, vLLM) */
    TC_CHOICE_REQUIRED, /* "required": every tool is shown; the answer should be a call */
    TC_CHOICE_NAMED,    /* {"type":"function","function":{"name":N}}: only that tool is shown */
} tc_choice;

/* The convention a chat template teaches, from the markers its text holds ([TOOL_CALLS], <tool_call>,
 * <|python_tag|> or Llama's ipython header); TC_STYLE_NONE for NULL or none of them. */
tc_style toolcall_style(const char *chat_template);

/* "hermes", "llama3", "mistral", "none". */
const char *toolcall_style_name(tc_style st);

/* The tools the template renders for a tool_choice: NULL (none given, or "none"), the named tool alone (a
 * new one-element array), or tools itself (a new reference).  The caller decrefs.  NULL also when out of
 * memory; *oom says which. */
json_t *toolcall_rendered_tools(json_t *tools, tc_choice choice, const char *name, bool *oom);

/* One parsed call: the function's name and its arguments as compact JSON text (an object). */
typedef struct tc_call {
    char *name;
    char *arguments;
} tc_call;

/* An answer that holds calls: the calls in order, and the text outside them (trimmed; NULL when empty, which
 * the answer writes as "content": null). */
typedef struct tc_parsed {
    size_t n;
    tc_call *calls; /* (n) owned */
    char *content;  /* owned, NUL-terminated, or NULL */
    size_t content_len;
} tc_parsed;

/*
 * Parses an answer's text by the convention st.  Returns 1 with *out filled when the text is one or more
 * well-formed calls (with at most content around them, as the convention allows) and every call names a
 * function of `tools` (the rendered tools; NULL → never a call); 0 when it is not (plain text: *out zeroed);
 * -1 when memory ran out.  `parallel` false keeps the first call only (parallel_tool_calls: false).
 */
int toolcall_parse(tc_style st, const char *text, size_t len, const json_t *tools, bool parallel, tc_parsed *out);

/* Frees what *p owns and zeroes it; safe on a zeroed one. */
void toolcall_parsed_free(tc_parsed *p);

/* A call's id: "call_" + 24 characters of [A-Za-z0-9] derived from SHA-256 of (custom_id, choice, k), so a
 * resumed or rerun job names the same call the same way.  out holds 30 bytes with the NUL. */
#define TC_ID_LEN 30
void toolcall_id(const char *custom_id, int choice, size_t k, char out[TC_ID_LEN]);

/*
 * What a `required` or named tool_choice forces the answer to be: *prefix, then a JSON value valid against the
 * returned schema, then *suffix (both static).  The schema is the call object {"name": N, "arguments": {…}}
 * ("parameters" for Llama), anyOf over the rendered tools for `required` (one object per tool, its name a
 * const); for Mistral a list of them (minItems 1, maxItems 1 unless parallel).  Prefix and suffix:
 * "<tool_call>\n" … "\n</tool_call>" (Hermes), "[TOOL_CALLS]" … "" (Mistral), "" … "" (Llama's bare JSON).
 * run_rows.c compiles them into the row's grammar (grammar_compile_wrapped, the convention's markers as
 * single tokens), so the answer parses as a call and finishes "tool_calls".  NULL for auto / none, a style
 * without a convention, or out of memory.
 */
json_t *toolcall_forced_schema(tc_style st, const json_t *rendered_tools, tc_choice choice, bool parallel,
                               const char **prefix, const char **suffix);

/* A row's function-calling state, kept by the runner from the row's build to its answer. */
#define TC_MAX_MARKERS 4
typedef struct tc_row {
    tc_style style;
    json_t *tools;  /* owned reference: the tools the template rendered (calls must name one of them) */
    bool parallel;  /* parallel_tool_calls */
    int n_markers;
    int32_t marker_ids[TC_MAX_MARKERS]; /* the convention's markers that are single special tokens of the
                                           vocabulary: emitted as text, though the detokenizer skips specials */
    const char *marker_text[TC_MAX_MARKERS]; /* (n_markers) their text, static (toolcall_markers) */
} tc_row;

/* The convention's marker strings ("<tool_call>", "[TOOL_CALLS]", …), NULL-terminated. */
const char *const *toolcall_markers(tc_style st);

void toolcall_row_free(tc_row *t);

#endif
