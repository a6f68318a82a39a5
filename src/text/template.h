/*
 * template.h — chat templates: spill's own interpreter for the Jinja subset
 * that model chat templates use, rendering byte-identically to transformers'
 * apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
 * (jinja2 ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
 * loopcontrols, no autoescape, transformers' tojson/raise_exception/
 * strftime_now globals).  See docs/formats.md §6.
 *
 * The template source is hostile input (GGUF metadata, tokenizer_config.json):
 * compilation bounds nesting, rendering bounds steps, depth, output, live
 * memory and range() size, and every failure is an error sentence, never a
 * crash.  A compiled template is immutable: several threads may render it at
 * once.
 */
#ifndef SPILL_TEMPLATE_H
#define SPILL_TEMPLATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef struct tmpl_t tmpl_t;

/* Returned by template_render when the template itself called raise_exception(msg);
 * err then holds msg verbatim (what transformers' TemplateError carries). */
#define TEMPLATE_ERR_RAISED (-2)

typedef struct {
    uint64_t max_steps; /* fuel: statements + expressions + iterations + allocated bytes/64 (50M) */
    uint32_t max_depth; /* nested evaluation / macro recursion depth (256) */
    size_t max_output;  /* bytes of rendered output (16 MiB) */
    uint64_t max_range; /* largest range() (100000 = jinja2 sandbox MAX_RANGE) */
    size_t max_memory;  /* live bytes of template values (256 MiB) */
    time_t now;         /* the clock strftime_now() formats (local time); 0 = time(NULL) at render */
} tmpl_limits;

/* Fills the defaults above. */
void template_limits_default(tmpl_limits *lim);

/*
 * Compiles `len` bytes of template source.  `name` (e.g. "chat template") prefixes
 * error messages.  On success *out owns the template (template_free).  On failure
 * returns -1 with "NAME line L, column C: reason" in err.
 */
int template_compile(const char *src, size_t len, const char *name, tmpl_t **out, char *err, size_t errlen);

/*
 * Renders with `context` (a JSON object: its keys are the template's globals).
 * lim NULL = defaults.  On success *out is a fresh NUL-terminated buffer of *outlen
 * bytes (caller frees).  Returns 0, TEMPLATE_ERR_RAISED (err = the template's message),
 * or -1 ("NAME line L, column C: reason").
 */
int template_render(const tmpl_t *t, json_t *context, const tmpl_limits *lim, char **out, size_t *outlen, char *err,
                    size_t errlen);

void template_free(tmpl_t *t);

/*
 * Compile + render in transformers' shape: context = {messages (reasoning aliases filled
 * like transformers: `reasoning_content`/`thinking`), tools (None when NULL),
 * documents (extra["documents"] or None), add_generation_prompt, then every key of
 * `extra` (bos_token, eos_token, caller kwargs such as enable_thinking)}.  `now` pins
 * strftime_now (0 = current time).  Same returns as template_render.
 */
int chat_template_render(const char *src, size_t len, json_t *messages, json_t *tools, json_t *extra,
                         bool add_generation_prompt, time_t now, char **out, size_t *outlen, char *err, size_t errlen);

/* The same with a template compiled once (template_compile), for rendering many conversations;
 * thread-safe on a shared tmpl_t. */
int chat_template_apply(const tmpl_t *t, json_t *messages, json_t *tools, json_t *extra, bool add_generation_prompt,
                        time_t now, char **out, size_t *outlen, char *err, size_t errlen);

#endif
