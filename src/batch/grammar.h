/*
 * grammar.h — structured output: a JSON schema (or "any JSON object") compiled into a byte-level pushdown
 * automaton, and the per-choice state that walks it one byte at a time.  token_mask.h turns a state into the
 * set of vocabulary tokens whose bytes it accepts.
 *
 *     grammar_compile(schema, "body.response_format.json_schema.schema", &g, …)   once per distinct schema
 *     gstate_init(g, &s)                                                           per choice
 *     per generated token: gstate_feed(g, &s, byte) for each of its bytes          0 = accepted, -1 = rejected
 *     gstate_done(&s): the top-level value is closed and nothing may follow it
 *     gstate_can_end(g, &s): the bytes so far are a complete value (an end token may come now)
 *
 * The language accepted (grammar.c's opening comment has the decisions) is compact JSON: no white space
 * except at most one space after ':' and ','; object keys in the schema's order; numbers of bounded length.
 * Every accepted byte string is a prefix of a text that parses and validates against the schema.
 *
 * A gstate is a plain value: copy it with gstate_copy, compare and hash its first gstate_bytes bytes (the
 * unused frames are never read, and a state's bytes are canonical — equal states have equal bytes).
 */
#ifndef SPILL_GRAMMAR_H
#define SPILL_GRAMMAR_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GRAMMAR_MAX_DEPTH 32   /* frames: the root, each open container, the scalar being written */
#define GRAMMAR_MAX_NODES 4096 /* schema nodes one grammar may have */
#define GRAMMAR_MAX_PROPS 64   /* properties one object schema may list (a key's candidates are a 64-bit mask) */

typedef struct grammar grammar;

/* One open construct.  Every field is written whenever a frame is pushed (no padding: 24 bytes). */
typedef struct gframe {
    int32_t node;  /* schema node (a key: its object's node) */
    uint8_t kind;  /* grammar.c's FR_* */
    uint8_t phase; /* kind-specific */
    uint8_t a, b;  /* string: UTF-8 continuation bytes left and the next one's range; number: digits, sign */
    uint32_t n;    /* string: characters; array: items (capped); object: next property; literal: bytes matched */
    uint32_t m;    /* object: the property whose value is open (index + 1, 0 = an extra key); literal: first
                      candidate; string: format position */
    uint64_t x;    /* literal: end of the candidate range; key: candidate mask; number: |integer value|;
                      string: \u value or format fields */
} gframe;

typedef struct gstate {
    int32_t depth; /* frames in use, >= 1 (frame 0 is the root; its n: bytes of a wrap's prefix or suffix) */
    int32_t pad;   /* always 0: keeps f aligned and the bytes canonical */
    gframe f[GRAMMAR_MAX_DEPTH];
} gstate;

/*
 * Compiles schema (a JSON Schema object; NULL = response_format json_object: any JSON object) into *out.
 * path names the schema in error sentences ("body.response_format.json_schema.schema").  Supported: type
 * (one or a list), properties, required, additionalProperties (false, true or a schema), items, prefixItems,
 * minItems, maxItems, uniqueItems (over enum / const items), enum, const, minLength, maxLength, pattern (a
 * regex subset: regex.h), format (date, time, date-time, uuid, email, ipv4, ipv6, hostname), minimum /
 * maximum / exclusiveMinimum / exclusiveMaximum (integers and numbers), multipleOf (integers), anyOf / oneOf
 * whose branches start with different bytes or are objects told apart by a first const property, allOf of
 * object schemas, $ref into the same document ($defs, definitions, "#"), and annotations (title,
 * description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly), which are
 * ignored.  Anything else fails with one sentence naming the keyword and its path; where (wlen bytes, may
 * be NULL) gets the JSON path alone.
 * Returns 0, or -1 (*out NULL).
 */
int grammar_compile(const json_t *schema, const char *path, grammar **out, char *where, size_t wlen, char *err,
                    size_t errlen);

/*
 * A value with literal text around it: a forced tool call is prefix + the call's JSON + suffix
 * ("<tool_call>\n" … "\n</tool_call>").  markers (NULL-terminated, may be NULL) are strings that, where they
 * occur in prefix or suffix, are written as one token when the vocabulary has a token of exactly those
 * bytes (special or not): token_mask.c allows only that token where a marker starts and no token that would
 * spell the marker in pieces (gstate_marker).
 */
#define GRAMMAR_MAX_MARKS 4
typedef struct grammar_wrap {
    const char *prefix, *suffix; /* NULL or "": none */
    const char *const *markers;
} grammar_wrap;

/* grammar_compile, wrapped: the text must be prefix, a value valid against schema, then suffix, then end. */
int grammar_compile_wrapped(const json_t *schema, const grammar_wrap *wrap, const char *path, grammar **out,
                            char *where, size_t wlen, char *err, size_t errlen);

/* Safe on NULL. */
void grammar_free(grammar *g);

/* 1 when s stands at the start of a marker of the wrap (*text, *len: its bytes, owned by g), else 0. */
int gstate_marker(const grammar *g, const gstate *s, const uint8_t **text, size_t *len);

/* The wrap has markers (so token_mask.c checks gstate_marker along its walk). */
bool grammar_has_markers(const grammar *g);

/* A number unique to this grammar in the process (token_mask.c keys its cache by it). */
uint64_t grammar_id(const grammar *g);

/* The start state: nothing written yet. */
void gstate_init(const grammar *g, gstate *s);

/* Advances s by one byte: 0 when the byte is accepted, -1 when not (s is then unspecified: feed a copy when
 * the caller needs the old state). */
int gstate_feed(const grammar *g, gstate *s, uint8_t b);

/* Feeds n bytes; 0, or -1 at the first rejected one. */
int gstate_feed_bytes(const grammar *g, gstate *s, const uint8_t *b, size_t n);

/* The bytes so far form a complete value (an end-of-turn token may follow). */
bool gstate_can_end(const grammar *g, const gstate *s);

/* The top-level value is closed and no byte can follow. */
bool gstate_done(const gstate *s);

/* The bytes of s that define it (hash and compare these). */
static inline size_t gstate_bytes(const gstate *s)
{
    return offsetof(gstate, f) + (size_t)s->depth * sizeof(gframe);
}

static inline void gstate_copy(gstate *dst, const gstate *src)
{
    __builtin_memcpy(dst, src, gstate_bytes(src));
}

/*
 * The grammars of one job, one per distinct schema (compared by their canonical text: keys sorted, compact),
 * so rows with the same schema share one grammar and its cached masks.
 */
typedef struct grammar_set {
    grammar **g;
    char **key; /* (n) canonical schema text; "" for json_object */
    size_t n, cap;
} grammar_set;

/* The grammar for schema (NULL = json_object), compiled on first use; *out borrowed from the set.  0, or -1
 * with grammar_compile's sentence (or out of memory). */
int grammar_set_get(grammar_set *set, const json_t *schema, const char *path, const grammar **out, char *err,
                    size_t errlen);
/* The same for a wrapped grammar (wrap NULL: grammar_set_get); the wrap is part of the key. */
int grammar_set_get_wrapped(grammar_set *set, const json_t *schema, const grammar_wrap *wrap, const char *path,
                            const grammar **out, char *err, size_t errlen);
void grammar_set_free(grammar_set *set);

#endif
