/*
 * jinja_value.c — values of the chat-template interpreter: allocation with a
 * metered heap, reference counting, Python truthiness/equality, str()/repr()
 * and json.dumps() byte-exact with CPython, and json_t conversion.
 * See jinja_value.h for the design.
 */
#include "jinja_value.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "../base/util.h"

/* ---------------------------------------------------------------- heap */

void *jheap_alloc(jheap *h, jv_type kind, size_t bytes)
{
    if (h->oom || bytes > h->max_live || h->live > h->max_live - bytes) {
        h->oom = true;
        return NULL;
    }
    jobj *o = calloc(1, bytes);
    if (!o) {
        h->oom = true;
        return NULL;
    }
    o->rc = 1;
    o->kind = (uint8_t)kind;
    o->heap = h;
    o->bytes = bytes;
    h->live += bytes;
    h->total += bytes;
    return o;
}

/* Grows an object's side array, charging the heap; false on cap/malloc failure. */
static bool jheap_grow(jobj *o, void **arr, size_t *cap, size_t elem, size_t need)
{
    if (need <= *cap)
        return true;
    jheap *h = o->heap;
    size_t ncap = *cap ? *cap : 4, bytes, old;
    while (ncap < need)
        if (!ck_mul_size(ncap, 2, &ncap))
            return h->oom = true, false;
    if (!ck_mul_size(ncap, elem, &bytes))
        return h->oom = true, false;
    old = *cap * elem;
    if (h->oom || bytes - old > h->max_live || h->live > h->max_live - (bytes - old))
        return h->oom = true, false;
    void *p = realloc(*arr, bytes);
    if (!p)
        return h->oom = true, false;
    *arr = p;
    *cap = ncap;
    h->live += bytes - old;
    h->total += bytes - old;
    o->bytes += bytes - old;
    return true;
}

jv jv_str(jheap *h, const char *s, size_t len)
{
    jv v = jv_undef();
    size_t bytes;
    if (!ck_add_size(sizeof(jstr) + 1, len, &bytes)) {
        h->oom = true;
        return v;
    }
    jstr *p = jheap_alloc(h, JV_STR, bytes);
    if (!p)
        return v;
    p->len = len;
    if (len)
        memcpy(p->s, s, len);
    p->s[len] = 0;
    v.t = JV_STR;
    v.u.s = p;
    return v;
}

jv jv_cstr(jheap *h, const char *s)
{
    return jv_str(h, s, strlen(s));
}

jv jv_undef_hint(jheap *h, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    jv s = jv_cstr(h, buf);
    jv v = jv_undef();
    if (s.t == JV_STR) {
        s.u.s->h.kind = JV_UNDEF;
        v.u.s = s.u.s;
    }
    return v;
}

jv jv_list(jheap *h, size_t cap_hint, bool tuple)
{
    jv v = jv_undef();
    jlist *l = jheap_alloc(h, JV_LIST, sizeof(jlist));
    if (!l)
        return v;
    l->tuple = tuple;
    l->depth = 1;
    v.t = JV_LIST;
    v.u.l = l;
    if (cap_hint && !jheap_grow(&l->h, (void **)&l->v, &l->cap, sizeof(jv), cap_hint)) {
        jv_unref(v);
        return jv_undef();
    }
    return v;
}

jv jv_dict(jheap *h, bool ns)
{
    jv v = jv_undef();
    jdict *d = jheap_alloc(h, ns ? JV_NS : JV_DICT, sizeof(jdict));
    if (!d)
        return v;
    v.t = ns ? JV_NS : JV_DICT;
    v.u.d = d;
    d->depth = 1;
    if (ns) {
        d->ns_next = h->namespaces;
        h->namespaces = d;
        d->h.rc++; /* the heap's list holds a reference until jheap_clear_namespaces */
    }
    return v;
}

jv jv_func(jheap *h, jfunc_kind kind, const char *name, jv self)
{
    jfunc *f = jheap_alloc(h, JV_FUNC, sizeof(jfunc));
    if (!f) {
        jv_unref(self);
        return jv_undef();
    }
    f->kind = kind;
    f->name = name;
    f->self = self;
    jv v = {.t = JV_FUNC};
    v.u.fn = f;
    return v;
}

static uint32_t jv_depth(jv v)
{
    return v.t == JV_LIST ? v.u.l->depth : v.t == JV_DICT ? v.u.d->depth : 0;
}

/* New depth of a container receiving v, or 0 (heap->too_deep set) when over the limit. */
static uint32_t nest_check(jobj *o, uint32_t cur, jv v)
{
    uint32_t d = jv_depth(v) + 1;
    if (d > JV_MAX_NEST) {
        o->heap->too_deep = true;
        return 0;
    }
    return d > cur ? d : cur;
}

bool jv_list_push(jv list, jv v)
{
    jlist *l = list.u.l;
    uint32_t d = nest_check(&l->h, l->depth, v);
    if (!d) {
        jv_unref(v);
        return false;
    }
    l->depth = d;
    if (!jheap_grow(&l->h, (void **)&l->v, &l->cap, sizeof(jv), l->n + 1)) {
        jv_unref(v);
        return false;
    }
    l->v[l->n++] = v;
    return true;
}

jv *jv_dict_get(jv dict, jv key)
{
    jdict *d = dict.u.d;
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], key))
            return &d->v[i];
    return NULL;
}

jv *jv_dict_getc(jv dict, const char *key)
{
    jdict *d = dict.u.d;
    size_t len = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s->len == len && !memcmp(d->k[i].u.s->s, key, len))
            return &d->v[i];
    return NULL;
}

bool jv_dict_set(jv dict, jv k, jv v)
{
    jdict *d = dict.u.d;
    uint32_t dk = nest_check(&d->h, d->depth, k), dv = dk ? nest_check(&d->h, dk, v) : 0;
    if (!dv) {
        jv_unref(k);
        jv_unref(v);
        return false;
    }
    d->depth = dv;
    jv *slot = jv_dict_get(dict, k);
    if (slot) {
        jv_unref(k);
        jv_unref(*slot);
        *slot = v;
        return true;
    }
    size_t kcap = d->cap;
    if (!jheap_grow(&d->h, (void **)&d->k, &kcap, sizeof(jv), d->n + 1) ||
        !jheap_grow(&d->h, (void **)&d->v, &d->cap, sizeof(jv), d->n + 1)) {
        jv_unref(k);
        jv_unref(v);
        return false;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return true;
}

static void jdict_release_items(jdict *d)
{
    for (size_t i = 0; i < d->n; i++) {
        jv_unref(d->k[i]);
        jv_unref(d->v[i]);
    }
    d->n = 0;
}

void jv_free_obj(jobj *o)
{
    jheap *h = o->heap;
    switch ((jv_type)o->kind) {
    case JV_LIST: {
        jlist *l = (jlist *)o;
        for (size_t i = 0; i < l->n; i++)
            jv_unref(l->v[i]);
        free(l->v);
        break;
    }
    case JV_DICT:
    case JV_NS: {
        jdict *d = (jdict *)o;
        jdict_release_items(d);
        free(d->k);
        free(d->v);
        break;
    }
    case JV_LOOP: {
        jloop *lp = (jloop *)o;
        if (lp->items) {
            jv l = {.t = JV_LIST};
            l.u.l = lp->items;
            jv_unref(l);
        }
        break;
    }
    case JV_FUNC:
        jv_unref(((jfunc *)o)->self);
        break;
    default:
        break;
    }
    h->live -= o->bytes;
    free(o);
}

void jheap_clear_namespaces(jheap *h)
{
    jdict *d = h->namespaces;
    h->namespaces = NULL;
    /* First empty every namespace (drops references between them), then drop the list's own references. */
    for (jdict *p = d; p; p = p->ns_next)
        jdict_release_items(p);
    while (d) {
        jdict *next = d->ns_next;
        jv v = {.t = JV_NS};
        v.u.d = d;
        jv_unref(v);
        d = next;
    }
}

/* ---------------------------------------------------------------- UTF-8 */

int jv_utf8_decode(const char *s, size_t len, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    int n = u[0] < 0x80 ? 1 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : 4;
    if ((size_t)n > len)
        n = 1;
    uint32_t c = n == 1 ? u[0] : n == 2 ? u[0] & 0x1F : n == 3 ? u[0] & 0x0F : u[0] & 0x07;
    for (int i = 1; i < n; i++)
        c = (c << 6) | (u[i] & 0x3F);
    *cp = c;
    return n;
}

int jv_utf8_encode(uint32_t c, char out[4])
{
    if (c < 0x80)
        return out[0] = (char)c, 1;
    if (c < 0x800)
        return out[0] = (char)(0xC0 | c >> 6), out[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | c >> 12);
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | c >> 18);
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

size_t jv_utf8_count(const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

size_t jv_utf8_offset(const char *s, size_t len, size_t cp)
{
    size_t i = 0;
    while (i < len && cp) {
        i++;
        while (i < len && ((unsigned char)s[i] & 0xC0) == 0x80)
            i++;
        cp--;
    }
    return i;
}

/* Python's str.isspace() set (also what `\s` and str.strip() use). */
bool jv_py_isspace(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---------------------------------------------------------------- buffer */

bool jbuf_put(jbuf *b, const char *s, size_t n)
{
    if (b->over)
        return false;
    size_t need;
    if (!ck_add_size(b->n, n + 1, &need) || (b->max && need > b->max + 1))
        return b->over = true, false;
    if (need > b->cap) {
        size_t ncap = b->cap ? b->cap : 64;
        while (ncap < need)
            ncap *= 2;
        char *p = realloc(b->p, ncap);
        if (!p)
            return b->over = true, false;
        b->p = p;
        b->cap = ncap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool jbuf_putc(jbuf *b, char c)
{
    return jbuf_put(b, &c, 1);
}

void jbuf_free(jbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---------------------------------------------------------------- Python semantics */

bool jv_truthy(jv v)
{
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE:
        return false;
    case JV_BOOL:
        return v.u.b;
    case JV_INT:
        return v.u.i != 0;
    case JV_FLOAT:
        return v.u.f != 0.0;
    case JV_STR:
        return v.u.s->len != 0;
    case JV_LIST:
        return v.u.l->gen || v.u.l->n != 0;
    case JV_DICT:
        return v.u.d->n != 0;
    default:
        return true;
    }
}

static bool jv_is_num(jv v)
{
    return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT;
}
static double jv_num(jv v)
{
    return v.t == JV_FLOAT ? v.u.f : v.t == JV_BOOL ? (double)v.u.b : (double)v.u.i;
}

bool jv_equal(jv a, jv b)
{
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT)
            return (a.t == JV_BOOL ? a.u.b : a.u.i) == (b.t == JV_BOOL ? b.u.b : b.u.i);
        return jv_num(a) == jv_num(b);
    }
    if (a.t != b.t)
        return false;
    if ((a.t == JV_LIST && a.u.l == b.u.l) || ((a.t == JV_DICT || a.t == JV_NS) && a.u.d == b.u.d))
        return true; /* CPython compares container items with `is` first: shared values stay linear */
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE:
        return true;
    case JV_STR:
        return a.u.s->len == b.u.s->len && !memcmp(a.u.s->s, b.u.s->s, a.u.s->len);
    case JV_LIST:
        if (a.u.l->gen || b.u.l->gen)
            return a.u.l == b.u.l;
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->n != b.u.l->n)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_equal(a.u.l->v[i], b.u.l->v[i]))
                return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n)
            return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv *o = jv_dict_get(b, a.u.d->k[i]);
            if (!o || !jv_equal(a.u.d->v[i], *o))
                return false;
        }
        return true;
    default:
        return a.u.o == b.u.o;
    }
}

const char *jv_type_name(jv v)
{
    switch (v.t) {
    case JV_UNDEF:
        return "Undefined";
    case JV_NONE:
        return "NoneType";
    case JV_BOOL:
        return "bool";
    case JV_INT:
        return "int";
    case JV_FLOAT:
        return "float";
    case JV_STR:
        return "str";
    case JV_LIST:
        return v.u.l->gen ? "generator" : v.u.l->tuple ? "tuple" : "list";
    case JV_DICT:
        return "dict";
    case JV_NS:
        return "Namespace";
    case JV_LOOP:
        return "LoopContext";
    default:
        return v.u.fn->kind == JF_MACRO ? "Macro" : "function";
    }
}

/* ---------------------------------------------------------------- str / repr */

void jv_float_repr(double f, char out[32])
{
    if (isnan(f)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f < 0 ? "-inf" : "inf");
        return;
    }
    /* Shortest digit string that round-trips (what repr() picks), then Python's layout:
     * scientific when the decimal exponent is < -4 or >= 16. */
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    char digits[20];
    int nd = 0, exp10;
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg)
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    char *o = out;
    if (neg)
        *o++ = '-';
    if (exp10 < -4 || exp10 >= 16) {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++)
                *o++ = digits[i];
        }
        int ax = exp10 < 0 ? -exp10 : exp10; /* |exp10| <= 324 for doubles */
        snprintf(o, 8, "e%c%02d", exp10 < 0 ? '-' : '+', ax % 1000);
        return;
    }
    if (exp10 < 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -exp10 - 1; i++)
            *o++ = '0';
        for (int i = 0; i < nd; i++)
            *o++ = digits[i];
    } else {
        for (int i = 0; i <= exp10; i++)
            *o++ = i < nd ? digits[i] : '0';
        *o++ = '.';
        if (nd > exp10 + 1)
            for (int i = exp10 + 1; i < nd; i++)
                *o++ = digits[i];
        else
            *o++ = '0';
    }
    *o = 0;
}

/* Python's str.isprintable() for one code point. */
static bool py_isprintable(uint32_t c)
{
    if (c == ' ')
        return true;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

static bool repr_str(jbuf *b, const char *s, size_t len)
{
    char q = memchr(s, '\'', len) && !memchr(s, '"', len) ? '"' : '\'';
    jbuf_putc(b, q);
    for (size_t i = 0; i < len;) {
        uint32_t c;
        int n = jv_utf8_decode(s + i, len - i, &c);
        char esc[16];
        if (c == (uint32_t)q || c == '\\') {
            jbuf_putc(b, '\\');
            jbuf_putc(b, (char)c);
        } else if (c == '\n') {
            jbuf_puts(b, "\\n");
        } else if (c == '\r') {
            jbuf_puts(b, "\\r");
        } else if (c == '\t') {
            jbuf_puts(b, "\\t");
        } else if (!py_isprintable(c)) {
            if (c < 0x100)
                snprintf(esc, sizeof esc, "\\x%02x", c);
            else if (c < 0x10000)
                snprintf(esc, sizeof esc, "\\u%04x", c);
            else
                snprintf(esc, sizeof esc, "\\U%08x", c);
            jbuf_puts(b, esc);
        } else {
            jbuf_put(b, s + i, (size_t)n);
        }
        i += (size_t)n;
    }
    return jbuf_putc(b, q);
}

/* Containers being printed, outermost first: Python's Py_ReprEnter guard.  A container met again
 * inside itself prints as "[...]" / "{...}" (a namespace's attribute dict is the guarded object,
 * so a namespace inside itself prints "<Namespace {...}>"), exactly as CPython + Jinja do. */
typedef struct {
    const void *on[JV_MAX_NEST + 16];
    int n;
} repr_guard;

static bool repr_at(jbuf *b, jv v, repr_guard *g);

bool jv_repr(jbuf *b, jv v)
{
    repr_guard g = {.n = 0};
    return repr_at(b, v, &g);
}

static bool repr_entered(const repr_guard *g, const void *p)
{
    for (int i = 0; i < g->n; i++)
        if (g->on[i] == p)
            return true;
    return false;
}

static bool repr_items(jbuf *b, const jv *k, const jv *v, size_t n, repr_guard *g)
{
    for (size_t i = 0; i < n && !b->over; i++) {
        if (i)
            jbuf_puts(b, ", ");
        if (k) {
            repr_at(b, k[i], g);
            jbuf_puts(b, ": ");
        }
        repr_at(b, v[i], g);
    }
    return !b->over;
}

/* Stops as soon as the buffer is over its cap: a value shared many times over (a list holding
 * itself twice, ten levels deep) would otherwise take 2^depth steps to print nothing more. */
static bool repr_at(jbuf *b, jv v, repr_guard *g)
{
    if (b->over)
        return false;
    const void *self = v.t == JV_LIST ? (const void *)v.u.l : v.t == JV_DICT || v.t == JV_NS ? (const void *)v.u.d : NULL;
    if (self && v.t == JV_LIST && v.u.l->gen)
        self = NULL;
    if (self && repr_entered(g, self))
        return jbuf_puts(b, v.t == JV_LIST ? (v.u.l->tuple ? "(...)" : "[...]") : v.t == JV_DICT ? "{...}" : "<Namespace {...}>");
    if (self && g->n >= (int)(sizeof g->on / sizeof g->on[0]))
        return jbuf_puts(b, "...");
    bool ok;
    switch (v.t) {
    case JV_STR:
        return repr_str(b, v.u.s->s, v.u.s->len);
    case JV_LIST: {
        jlist *l = v.u.l;
        if (l->gen)
            return jbuf_puts(b, "<generator object>"); /* CPython adds an address: never byte-equal */
        jbuf_putc(b, l->tuple ? '(' : '[');
        g->on[g->n++] = self;
        ok = repr_items(b, NULL, l->v, l->n, g);
        g->n--;
        if (ok && l->tuple && l->n == 1)
            jbuf_putc(b, ',');
        return jbuf_putc(b, l->tuple ? ')' : ']');
    }
    case JV_DICT:
    case JV_NS: {
        jdict *d = v.u.d;
        jbuf_puts(b, v.t == JV_NS ? "<Namespace {" : "{");
        g->on[g->n++] = self;
        repr_items(b, d->k, d->v, d->n, g);
        g->n--;
        return jbuf_puts(b, v.t == JV_NS ? "}>" : "}");
    }
    case JV_UNDEF:
        return jbuf_puts(b, "Undefined");
    default:
        break;
    }
    return jv_to_str(b, v);
}

bool jv_to_str(jbuf *b, jv v)
{
    char num[32];
    switch (v.t) {
    case JV_UNDEF:
        return !b->over;
    case JV_NONE:
        return jbuf_puts(b, "None");
    case JV_BOOL:
        return jbuf_puts(b, v.u.b ? "True" : "False");
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        return jbuf_puts(b, num);
    case JV_FLOAT:
        jv_float_repr(v.u.f, num);
        return jbuf_puts(b, num);
    case JV_STR:
        return jbuf_put(b, v.u.s->s, v.u.s->len);
    case JV_LIST:
    case JV_DICT:
    case JV_NS:
        return jv_repr(b, v);
    case JV_LOOP:
        return jbuf_puts(b, "<LoopContext>");
    case JV_FUNC:
        jbuf_puts(b, v.u.fn->kind == JF_MACRO ? "<Macro '" : "<function ");
        jbuf_puts(b, v.u.fn->name ? v.u.fn->name : "?");
        return jbuf_puts(b, v.u.fn->kind == JF_MACRO ? "'>" : ">");
    }
    return false;
}

/* ---------------------------------------------------------------- json.dumps */

static void json_str(jbuf *b, const char *s, size_t len, bool ensure_ascii)
{
    jbuf_putc(b, '"');
    for (size_t i = 0; i < len;) {
        uint32_t c;
        int n = jv_utf8_decode(s + i, len - i, &c);
        char esc[16];
        switch (c) {
        case '"':
            jbuf_puts(b, "\\\"");
            break;
        case '\\':
            jbuf_puts(b, "\\\\");
            break;
        case '\n':
            jbuf_puts(b, "\\n");
            break;
        case '\r':
            jbuf_puts(b, "\\r");
            break;
        case '\t':
            jbuf_puts(b, "\\t");
            break;
        case '\b':
            jbuf_puts(b, "\\b");
            break;
        case '\f':
            jbuf_puts(b, "\\f");
            break;
        default:
            if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
                if (c >= 0x10000) {
                    uint32_t u = c - 0x10000;
                    snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF));
                } else {
                    snprintf(esc, sizeof esc, "\\u%04x", c);
                }
                jbuf_puts(b, esc);
            } else {
                jbuf_put(b, s + i, (size_t)n);
            }
        }
        i += (size_t)n;
    }
    jbuf_putc(b, '"');
}

static void json_newline(jbuf *b, const jjson_opts *o, int level)
{
    jbuf_putc(b, '\n');
    for (int i = 0; i < o->indent * level && !b->over; i++)
        jbuf_putc(b, ' ');
}

static int json_float(jbuf *b, double f)
{
    char num[32];
    if (isnan(f))
        return jbuf_puts(b, "NaN"), 0;
    if (isinf(f))
        return jbuf_puts(b, f < 0 ? "-Infinity" : "Infinity"), 0;
    jv_float_repr(f, num);
    jbuf_puts(b, num);
    return 0;
}

/* json.dumps turns non-string keys into strings: True → "true", 1.5 → "1.5", None → "null". */
static int json_key(jbuf *b, jv k, const jjson_opts *o, char *err, size_t errlen)
{
    jbuf t = {0};
    switch (k.t) {
    case JV_STR:
        json_str(b, k.u.s->s, k.u.s->len, o->ensure_ascii);
        return 0;
    case JV_NONE:
        jbuf_puts(b, "\"null\"");
        return 0;
    case JV_BOOL:
        jbuf_puts(b, k.u.b ? "\"true\"" : "\"false\"");
        return 0;
    case JV_INT:
    case JV_FLOAT:
        if (k.t == JV_INT)
            jv_to_str(&t, k);
        else
            json_float(&t, k.u.f);
        jbuf_putc(b, '"');
        jbuf_put(b, t.p, t.n);
        jbuf_putc(b, '"');
        jbuf_free(&t);
        return 0;
    default:
        return util_errf(err, errlen, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
}

static int json_value(jbuf *b, jv v, const jjson_opts *o, int level, char *err, size_t errlen)
{
    const char *isep = o->item_sep ? o->item_sep : o->indent >= 0 ? "," : ", ";
    const char *ksep = o->key_sep ? o->key_sep : ": ";
    if (level > 1000)
        return util_errf(err, errlen, "maximum recursion depth exceeded while encoding a JSON object");
    if (b->over) /* over the cap already: the caller reports it; walking on could take 2^depth steps */
        return 0;
    switch (v.t) {
    case JV_NONE:
        jbuf_puts(b, "null");
        return 0;
    case JV_BOOL:
        jbuf_puts(b, v.u.b ? "true" : "false");
        return 0;
    case JV_INT:
        return jv_to_str(b, v) ? 0 : 0;
    case JV_FLOAT:
        return json_float(b, v.u.f);
    case JV_STR:
        json_str(b, v.u.s->s, v.u.s->len, o->ensure_ascii);
        return 0;
    case JV_LIST: {
        jlist *l = v.u.l;
        if (l->gen)
            return util_errf(err, errlen, "Object of type generator is not JSON serializable");
        if (!l->n)
            return jbuf_puts(b, "[]"), 0;
        jbuf_putc(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                jbuf_puts(b, isep);
            if (o->indent >= 0)
                json_newline(b, o, level + 1);
            if (json_value(b, l->v[i], o, level + 1, err, errlen))
                return -1;
        }
        if (o->indent >= 0)
            json_newline(b, o, level);
        jbuf_putc(b, ']');
        return 0;
    }
    case JV_DICT: {
        jdict *d = v.u.d;
        if (!d->n)
            return jbuf_puts(b, "{}"), 0;
        size_t *order = malloc(d->n * sizeof *order);
        if (!order)
            return util_errf(err, errlen, "out of memory while encoding JSON");
        for (size_t i = 0; i < d->n; i++)
            order[i] = i;
        if (o->sort_keys) /* insertion sort: stable, keys are few */
            for (size_t i = 1; i < d->n; i++) {
                size_t x = order[i], j = i;
                while (j > 0) {
                    jv a = d->k[order[j - 1]], c = d->k[x];
                    if (a.t != JV_STR || c.t != JV_STR) {
                        free(order);
                        return util_errf(err, errlen, "'<' not supported between dict keys of type %s and %s",
                                         jv_type_name(c), jv_type_name(a));
                    }
                    size_t m = a.u.s->len < c.u.s->len ? a.u.s->len : c.u.s->len;
                    int r = memcmp(a.u.s->s, c.u.s->s, m);
                    if (r < 0 || (r == 0 && a.u.s->len <= c.u.s->len))
                        break;
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        jbuf_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                jbuf_puts(b, isep);
            if (o->indent >= 0)
                json_newline(b, o, level + 1);
            if (json_key(b, d->k[order[i]], o, err, errlen) < 0) {
                free(order);
                return -1;
            }
            jbuf_puts(b, ksep);
            if (json_value(b, d->v[order[i]], o, level + 1, err, errlen)) {
                free(order);
                return -1;
            }
        }
        free(order);
        if (o->indent >= 0)
            json_newline(b, o, level);
        jbuf_putc(b, '}');
        return 0;
    }
    default:
        return util_errf(err, errlen, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

int jv_to_json(jbuf *b, jv v, const jjson_opts *o, char *err, size_t errlen)
{
    return json_value(b, v, o, 0, err, errlen);
}

/* ---------------------------------------------------------------- json_t → jv */

static int from_json(jheap *h, const json_t *j, int depth, jv *out, char *err, size_t errlen)
{
    if (depth < 0)
        return util_errf(err, errlen, "template context nests deeper than the template limit; flatten it");
    switch (json_typeof(j)) {
    case JSON_NULL:
        *out = jv_none();
        return 0;
    case JSON_TRUE:
        *out = jv_bool(true);
        return 0;
    case JSON_FALSE:
        *out = jv_bool(false);
        return 0;
    case JSON_INTEGER:
        *out = jv_int((int64_t)json_integer_value(j));
        return 0;
    case JSON_REAL:
        *out = jv_float(json_real_value(j));
        return 0;
    case JSON_STRING:
        *out = jv_str(h, json_string_value(j), json_string_length(j));
        break;
    case JSON_ARRAY: {
        *out = jv_list(h, json_array_size(j), false);
        if (out->t != JV_LIST)
            break;
        for (size_t i = 0; i < json_array_size(j); i++) {
            jv e;
            if (from_json(h, json_array_get(j, i), depth - 1, &e, err, errlen) || !jv_list_push(*out, e)) {
                jv_unref(*out);
                return h->oom ? util_errf(err, errlen, "template context is too large for the template memory limit")
                              : -1;
            }
        }
        return 0;
    }
    case JSON_OBJECT: {
        *out = jv_dict(h, false);
        if (out->t != JV_DICT)
            break;
        const char *k;
        size_t klen;
        json_t *val;
        void *tmp;
        json_object_keylen_foreach_safe((json_t *)j, tmp, k, klen, val)
        {
            jv e;
            if (from_json(h, val, depth - 1, &e, err, errlen) || !jv_dict_set(*out, jv_str(h, k, klen), e)) {
                jv_unref(*out);
                return h->oom ? util_errf(err, errlen, "template context is too large for the template memory limit")
                              : -1;
            }
        }
        return 0;
    }
    }
    if (out->t == JV_UNDEF)
        return util_errf(err, errlen, "template context is too large for the template memory limit");
    return 0;
}

int jv_from_json(jheap *h, const json_t *j, int max_depth, jv *out, char *err, size_t errlen)
{
    *out = jv_undef();
    return from_json(h, j, max_depth, out, err, errlen);
}
