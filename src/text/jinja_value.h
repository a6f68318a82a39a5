/*
 * jinja_value.h — the value model of the chat-template interpreter
 * (template_parse.c parses, template_eval.c evaluates, this file holds the data).
 *
 * Owns: the tagged value `jv` (undefined, none, bool, int, float, string,
 * list/tuple, dict, namespace, loop, callable), reference counting, the
 * per-render heap that meters live bytes, Python's str()/repr() of values
 * (what `{{ x }}` prints) and json.dumps() (what `|tojson` prints), and the
 * conversion from jansson json_t.
 *
 * Does not own: evaluation, scoping, filters (template_eval.c).
 *
 * Key decisions:
 *  - Immediate scalars live inside `jv`; strings, lists, dicts, namespaces,
 *    loops and callables are reference-counted heap objects.  Templates run
 *    in Jinja's ImmutableSandbox, so only namespaces mutate; a namespace can
 *    hold itself, so the heap keeps a list of namespaces and clears them when
 *    the render ends (that breaks every cycle before the final release).
 *  - Dicts keep insertion order and look keys up linearly: chat templates
 *    see dicts of a few dozen keys, and ordering must match Python's.
 *  - Strings are UTF-8 bytes (validated at the boundary); lengths, indexing
 *    and slicing count code points like Python does.
 *  - Every allocation is charged to the heap: live bytes are capped
 *    (max_memory) and total bytes feed the fuel counter, so a template that
 *    doubles a string in a loop stops with a clear error instead of eating
 *    the machine.
 */
#ifndef SPILL_JINJA_VALUE_H
#define SPILL_JINJA_VALUE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    JV_UNDEF, /* Jinja Undefined: prints "", falsy, iterates empty; .attr raises */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST, /* list or tuple (jlist.tuple) */
    JV_DICT,
    JV_NS,   /* namespace(): a mutable dict reached by attribute */
    JV_LOOP, /* the `loop` variable of a for loop */
    JV_FUNC, /* global function, bound method or macro */
} jv_type;

typedef struct jheap jheap;
typedef struct jobj jobj;
typedef struct jstr jstr;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jloop jloop;
typedef struct jfunc jfunc;

typedef struct jv {
    jv_type t;
    union {
        bool b;
        int64_t i;
        double f;
        jstr *s; /* JV_STR; JV_UNDEF: hint for the error message, may be NULL */
        jlist *l;
        jdict *d; /* JV_DICT and JV_NS */
        jloop *lp;
        jfunc *fn;
        jobj *o;
    } u;
} jv;

struct jobj {
    int32_t rc;
    uint8_t kind; /* jv_type of the object */
    jheap *heap;
    size_t bytes; /* charged to heap->live */
};

struct jstr {
    jobj h;
    size_t len; /* bytes, excluding the NUL */
    char s[];   /* NUL-terminated UTF-8 */
};

/* Lists and dicts nest at most JV_MAX_NEST deep (namespaces do not count: they are released
 * separately), which bounds every recursive walk (free, repr, ==, json) on the C stack. */
#define JV_MAX_NEST 1000

struct jlist {
    jobj h;
    uint32_t depth; /* 1 + deepest child */
    bool tuple;
    bool gen; /* a jinja filter's lazy generator (select, map, unique, items…): always truthy,
               * no len(), compares by identity; |list turns it into a list */
    size_t n, cap;
    jv *v; /* (n) */
};

struct jdict {
    jobj h;
    uint32_t depth; /* 1 + deepest key or value */
    size_t n, cap;
    jv *k, *v;      /* (n) keys and values, insertion order */
    jdict *ns_next; /* JV_NS only: heap's namespace list */
};

struct jloop {
    jobj h;
    size_t index0, length;
    jlist *items; /* the (filtered) sequence being iterated, for previtem/nextitem */
    int depth0;
};

typedef enum { JF_RANGE, JF_NAMESPACE, JF_DICT, JF_RAISE, JF_STRFTIME, JF_MACRO, JF_METHOD, JF_CYCLE } jfunc_kind;

struct jfunc {
    jobj h;
    jfunc_kind kind;
    const char *name;  /* method or macro name (static or AST-owned) */
    jv self;           /* bound receiver (JF_METHOD, JF_CYCLE), else JV_NONE */
    const void *macro; /* JF_MACRO: AST node owned by the template */
    const void *env;   /* JF_MACRO: the evaluator frame it was defined in; only used after it is
                        * found alive on the current scope chain with the same id */
    uint64_t env_id;
};

struct jheap {
    size_t live, max_live; /* bytes of live objects and the cap */
    uint64_t total;        /* bytes ever allocated: charged as fuel */
    jdict *namespaces;     /* every namespace created, for cycle breaking */
    bool oom;              /* an allocation failed or hit max_live */
    bool too_deep;         /* a push/set would have nested deeper than JV_MAX_NEST */
};

/* ---- construction (each returns a value with one reference, or JV_UNDEF with heap->oom set) */
static inline jv jv_undef(void)
{
    jv v = {.t = JV_UNDEF};
    v.u.s = NULL;
    return v;
}
static inline jv jv_none(void)
{
    jv v = {.t = JV_NONE};
    v.u.i = 0;
    return v;
}
static inline jv jv_bool(bool b)
{
    jv v = {.t = JV_BOOL};
    v.u.b = b;
    return v;
}
static inline jv jv_int(int64_t i)
{
    jv v = {.t = JV_INT};
    v.u.i = i;
    return v;
}
static inline jv jv_float(double f)
{
    jv v = {.t = JV_FLOAT};
    v.u.f = f;
    return v;
}

void *jheap_alloc(jheap *h, jv_type kind, size_t bytes);
jv jv_str(jheap *h, const char *s, size_t len);
jv jv_cstr(jheap *h, const char *s);
jv jv_undef_hint(jheap *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
jv jv_list(jheap *h, size_t cap_hint, bool tuple);
jv jv_dict(jheap *h, bool ns);
jv jv_func(jheap *h, jfunc_kind kind, const char *name, jv self /* consumed */);

/* Appends/sets, consuming `v` (and `k`); false when out of memory or too deep (heap->oom or
 * heap->too_deep set, value released). */
bool jv_list_push(jv list, jv v);
bool jv_dict_set(jv dict, jv k, jv v);
/* Borrowed lookup; NULL when absent.  Keys compare with Python == . */
jv *jv_dict_get(jv dict, jv key);
jv *jv_dict_getc(jv dict, const char *key);

/* rc < 0 marks an immortal object (a template's string constant): never counted, never freed,
 * so one compiled template can be rendered by several threads at once. */
static inline jv jv_ref(jv v)
{
    if ((v.t >= JV_STR || (v.t == JV_UNDEF && v.u.o)) && v.u.o->rc >= 0)
        v.u.o->rc++;
    return v;
}
void jv_free_obj(jobj *o);
static inline void jv_unref(jv v)
{
    if ((v.t >= JV_STR || (v.t == JV_UNDEF && v.u.o)) && v.u.o->rc > 0 && --v.u.o->rc == 0)
        jv_free_obj(v.u.o);
}
/* Breaks namespace cycles; call once when a render ends, before releasing the roots. */
void jheap_clear_namespaces(jheap *h);

/* ---- Python semantics */
bool jv_truthy(jv v);
bool jv_equal(jv a, jv b);
const char *jv_type_name(jv v); /* Python type name for messages: 'str', 'int', 'dict', 'NoneType', … */
size_t jv_utf8_count(const char *s, size_t len);
/* Byte offset of code point `cp` within s (clamped to len). */
size_t jv_utf8_offset(const char *s, size_t len, size_t cp);
bool jv_py_isspace(uint32_t c);
/* Decodes one code point at s (valid UTF-8 assumed), returns its byte length. */
int jv_utf8_decode(const char *s, size_t len, uint32_t *cp);
int jv_utf8_encode(uint32_t cp, char out[4]);

/* ---- growable byte buffer with a cap */
typedef struct {
    char *p;
    size_t n, cap, max; /* max 0 = unlimited */
    bool over;          /* an append failed (cap or malloc) */
} jbuf;
bool jbuf_put(jbuf *b, const char *s, size_t n);
static inline bool jbuf_puts(jbuf *b, const char *s)
{
    return jbuf_put(b, s, __builtin_strlen(s));
}
bool jbuf_putc(jbuf *b, char c);
void jbuf_free(jbuf *b);

/* Python str(v) appended to b (None, True, 1.5, "['a', 1]", …); false on error (b->over
 * or a value with no string form, e.g. undefined inside a list prints as in Jinja: ''). */
bool jv_to_str(jbuf *b, jv v);
/* Python repr(v). */
bool jv_repr(jbuf *b, jv v);
/* Python repr of a float ("1.0", "1e+16", "0.30000000000000004", "inf"). */
void jv_float_repr(double f, char out[32]);

/* json.dumps(v, ensure_ascii, indent (<0 = None), separators, sort_keys).  Returns 0, or -1
 * and writes the Python TypeError sentence into err (e.g. "Object of type Undefined is not
 * JSON serializable"). */
typedef struct {
    bool ensure_ascii, sort_keys;
    int indent;                     /* < 0: None */
    const char *item_sep, *key_sep; /* NULL: Python defaults for the indent */
} jjson_opts;
int jv_to_json(jbuf *b, jv v, const jjson_opts *o, char *err, size_t errlen);

/* json_t → jv (objects keep their order).  Fails on nesting deeper than max_depth. */
int jv_from_json(jheap *h, const json_t *j, int max_depth, jv *out, char *err, size_t errlen);

#endif
