/*
 * template_lex.c — chat templates, front end's ground floor: the template
 * arena, source positions and error sentences, and the Jinja lexer that turns
 * the normalised source into the token stream the parser (template_parse.c)
 * reads.  Nothing here calls the parser or the public API: template.c
 * normalises the source and calls tmpl_lex, then tmpl_parse, so dependencies
 * point one way (template.c -> template_parse.c -> template_lex.c, and
 * template.c -> template_lex.c).
 *
 * Source layout read (jinja2 3.1 lexer, the transformers environment; the
 * newline normalisation is template_compile's):
 *   - data runs until `{{`, `{%` or `{#`; each opener may carry `-` (strip all
 *     whitespace before it) or `+` (keep it); without a sign, `{%` and `{#`
 *     also remove spaces/tabs back to the start of their line (lstrip_blocks);
 *   - `-%}`/`-}}`/`-#}` strip all whitespace after; `%}`/`#}` eat one \n
 *     after (trim_blocks); `+%}` keeps it;
 *   - inside a tag the end marker only counts when (), [] and {} balance, so
 *     `{{ {'a': {'b': 1}} }}` works;
 *   - `{% raw %}…{% endraw %}` is data; a `{#` or `{% raw %}` that is the
 *     very last thing in the source ends it silently, as in jinja2.
 *
 * Key decision: whitespace is Python's (str.isspace, including U+3000 and
 * friends) wherever jinja2 uses \s or str.rstrip().  Does not own: parsing
 * (template_parse.c), compile/render (template.c).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template_ast.h"
#include "../base/util.h"

/* ---------------------------------------------------------------- arena */

void *tmpl_alloc(tmpl_t *t, size_t size)
{
    if (t->nblocks == t->capblocks) {
        size_t ncap = t->capblocks ? t->capblocks * 2 : 64;
        void **p = realloc(t->blocks, ncap * sizeof *p);
        if (!p)
            return NULL;
        t->blocks = p;
        t->capblocks = ncap;
    }
    void *m = calloc(1, size ? size : 1);
    if (m)
        t->blocks[t->nblocks++] = m;
    return m;
}

char *tmpl_strndup(tmpl_t *t, const char *s, size_t n)
{
    char *p = tmpl_alloc(t, n + 1);
    if (p)
        memcpy(p, s, n);
    return p;
}

/* ---------------------------------------------------------------- tokens */

void tmpl_linecol(const parser *p, size_t off, int *line, int *col)
{
    size_t lo = 0, hi = p->nlines;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (p->lines[mid] <= off)
            lo = mid;
        else
            hi = mid;
    }
    *line = (int)lo + 1;
    *col = (int)(off - p->lines[lo]) + 1;
}

int tmpl_fail_at(parser *p, size_t off, const char *fmt, ...)
{
    char msg[300];
    int line, col;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tmpl_linecol(p, off, &line, &col);
    return util_errf(p->err, p->errlen, "%s line %d, column %d: %s", p->t->name, line, col, msg);
}

static int push_tok(parser *p, tok_type t, size_t off, const char *s, size_t len)
{
    if (p->ntok == p->captok) {
        size_t ncap = p->captok ? p->captok * 2 : 256;
        token *nt = realloc(p->tok, ncap * sizeof *nt);
        if (!nt)
            return tmpl_fail_at(p, off, "out of memory while lexing the template");
        p->tok = nt;
        p->captok = ncap;
    }
    token *k = &p->tok[p->ntok++];
    memset(k, 0, sizeof *k);
    k->t = t;
    k->off = off;
    k->s = s;
    k->len = len;
    return 0;
}

/* Length of the Python-whitespace code point at s[i], 0 if none. */
static size_t ws_at(const char *s, size_t n, size_t i)
{
    if (i >= n)
        return 0;
    uint32_t c;
    int k = jv_utf8_decode(s + i, n - i, &c);
    return jv_py_isspace(c) ? (size_t)k : 0;
}

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    size_t k;
    while ((k = ws_at(s, n, i)))
        i += k;
    return i;
}

/* Length of text after removing trailing Python whitespace (str.rstrip()). */
static size_t rstrip_len(const char *s, size_t len)
{
    while (len) {
        size_t st = len - 1;
        while (st && ((unsigned char)s[st] & 0xC0) == 0x80)
            st--;
        uint32_t c;
        jv_utf8_decode(s + st, len - st, &c);
        if (!jv_py_isspace(c))
            break;
        len = st;
    }
    return len;
}

static bool starts(const char *s, size_t n, size_t i, const char *lit)
{
    size_t l = strlen(lit);
    return i + l <= n && !memcmp(s + i, lit, l);
}

/* Emits data [a, b) with the opener's whitespace control applied. */
static int emit_data(parser *p, size_t a, size_t b, char sign, bool lstrip_ok, bool line_starting)
{
    size_t len = b - a;
    const char *s = p->src + a;
    if (sign == '-') {
        len = rstrip_len(s, len);
    } else if (sign != '+' && lstrip_ok) {
        size_t l = len;
        while (l && s[l - 1] != '\n')
            l--;
        if ((l > 0 || line_starting) && l < len) {
            size_t i = l;
            while (i < len && ws_at(s, len, i))
                i += ws_at(s, len, i);
            if (i == len)
                len = l;
        }
    }
    if (!len)
        return 0;
    return push_tok(p, T_DATA, a, s, len);
}

/* Decodes a Python string literal body (what unicode-escape accepts) into the arena. */
static int decode_string(parser *p, size_t off, const char *s, size_t n, const char **out, size_t *outlen)
{
    char *o = tmpl_alloc(p->t, n + 1), *w = o;
    if (!o)
        return tmpl_fail_at(p, off, "out of memory while lexing the template");
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\' || i + 1 >= n) {
            *w++ = s[i++];
            continue;
        }
        char c = s[i + 1];
        uint32_t cp = 0;
        int hex = 0;
        i += 2;
        switch (c) {
        case '\n':
            continue;
        case '\\':
            *w++ = '\\';
            continue;
        case '\'':
            *w++ = '\'';
            continue;
        case '"':
            *w++ = '"';
            continue;
        case 'a':
            *w++ = '\a';
            continue;
        case 'b':
            *w++ = '\b';
            continue;
        case 'f':
            *w++ = '\f';
            continue;
        case 'n':
            *w++ = '\n';
            continue;
        case 'r':
            *w++ = '\r';
            continue;
        case 't':
            *w++ = '\t';
            continue;
        case 'v':
            *w++ = '\v';
            continue;
        case 'x':
            hex = 2;
            break;
        case 'u':
            hex = 4;
            break;
        case 'U':
            hex = 8;
            break;
        default:
            if (c >= '0' && c <= '7') {
                cp = (uint32_t)(c - '0');
                for (int k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(s[i++] - '0');
                break;
            }
            *w++ = '\\';
            *w++ = c;
            continue;
        }
        for (int k = 0; k < hex; k++, i++) {
            int d = i < n ? (s[i] >= '0' && s[i] <= '9'                 ? s[i] - '0'
                             : (s[i] | 32) >= 'a' && (s[i] | 32) <= 'f' ? (s[i] | 32) - 'a' + 10
                                                                        : -1)
                          : -1;
            if (d < 0)
                return tmpl_fail_at(p, off, "truncated \\%c escape in string literal", c);
            cp = cp * 16 + (uint32_t)d;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return tmpl_fail_at(p, off, "string literal escape \\%c names an invalid code point", c);
        w += jv_utf8_encode(cp, w);
    }
    *out = o;
    *outlen = (size_t)(w - o);
    return 0;
}

static const char *const OPS[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                  "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};

/* Lexes the inside of {{ … }} or {% … %} starting at *pi; stops after the end marker. */
static int lex_tag(parser *p, size_t *pi, bool block, bool *line_starting)
{
    const char *s = p->src;
    size_t n = p->n, i = *pi, open_off = *pi;
    char stack[PARSE_MAX_NEST];
    int depth = 0;
    for (;;) {
        if (i >= n)
            return tmpl_fail_at(p, open_off, "unexpected end of template inside a %s tag; close it with %s",
                                block ? "{% %}" : "{{ }}", block ? "%}" : "}}");
        if (depth == 0) {
            const char *end = block ? "%}" : "}}";
            bool plus = block && s[i] == '+' && starts(s, n, i + 1, end);
            bool minus = s[i] == '-' && starts(s, n, i + 1, end);
            if (plus || minus || starts(s, n, i, end)) {
                if (push_tok(p, block ? T_BLOCK_END : T_VAR_END, i, NULL, 0))
                    return -1;
                i += (plus || minus) ? 3 : 2;
                if (minus)
                    i = skip_ws(s, n, i);
                else if (block && !plus && i < n && s[i] == '\n')
                    i++;
                *line_starting = s[i - 1] == '\n';
                *pi = i;
                return 0;
            }
        }
        size_t w = ws_at(s, n, i);
        if (w) {
            i += w;
            continue;
        }
        unsigned char c = (unsigned char)s[i];
        if (c >= '0' && c <= '9') {
            size_t a = i;
            bool isfloat = false, after_dot = a > 0 && s[a - 1] == '.';
            if (c == '0' && i + 1 < n && strchr("xXoObB", s[i + 1]) && s[i + 1]) {
                int base = (s[i + 1] | 32) == 'x' ? 16 : (s[i + 1] | 32) == 'o' ? 8 : 2;
                uint64_t v = 0;
                i += 2;
                size_t digits = 0;
                for (; i < n; i++) {
                    if (s[i] == '_')
                        continue;
                    int d = s[i] >= '0' && s[i] <= '9'                 ? s[i] - '0'
                            : (s[i] | 32) >= 'a' && (s[i] | 32) <= 'f' ? (s[i] | 32) - 'a' + 10
                                                                       : 99;
                    if (d >= base)
                        break;
                    if (v > (UINT64_MAX >> 4) || v * (uint64_t)base + (uint64_t)d > INT64_MAX)
                        return tmpl_fail_at(p, a, "integer literal is too large");
                    v = v * (uint64_t)base + (uint64_t)d;
                    digits++;
                }
                if (!digits)
                    return tmpl_fail_at(p, a, "integer literal has no digits");
                if (push_tok(p, T_INT, a, s + a, i - a))
                    return -1;
                p->tok[p->ntok - 1].i = (int64_t)v;
                continue;
            }
            while (i < n &&
                   ((s[i] >= '0' && s[i] <= '9') || (s[i] == '_' && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '9')))
                i++;
            if (!after_dot && i + 1 < n && s[i] == '.' && s[i + 1] >= '0' && s[i + 1] <= '9') {
                isfloat = true;
                i++;
                while (i < n && ((s[i] >= '0' && s[i] <= '9') ||
                                 (s[i] == '_' && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '9')))
                    i++;
            }
            if (!after_dot && i < n && (s[i] | 32) == 'e') {
                size_t e = i + 1;
                if (e < n && (s[e] == '+' || s[e] == '-'))
                    e++;
                if (e < n && s[e] >= '0' && s[e] <= '9') {
                    isfloat = true;
                    i = e;
                    while (i < n && ((s[i] >= '0' && s[i] <= '9') ||
                                     (s[i] == '_' && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '9')))
                        i++;
                }
            }
            char buf[64];
            size_t bl = 0;
            for (size_t k = a; k < i && bl < sizeof buf - 1; k++)
                if (s[k] != '_')
                    buf[bl++] = s[k];
            buf[bl] = 0;
            if (push_tok(p, isfloat ? T_FLOAT : T_INT, a, s + a, i - a))
                return -1;
            if (isfloat) {
                p->tok[p->ntok - 1].f = strtod(buf, NULL);
            } else {
                uint64_t v = 0;
                for (size_t k = 0; k < bl; k++) {
                    if (v > (uint64_t)INT64_MAX / 10 || v * 10 + (uint64_t)(buf[k] - '0') > (uint64_t)INT64_MAX)
                        return tmpl_fail_at(p, a, "integer literal is too large");
                    v = v * 10 + (uint64_t)(buf[k] - '0');
                }
                p->tok[p->ntok - 1].i = (int64_t)v;
            }
            continue;
        }
        if (c == '_' || ((c | 32) >= 'a' && (c | 32) <= 'z')) {
            size_t a = i;
            while (i < n && (s[i] == '_' || ((s[i] | 32) >= 'a' && (s[i] | 32) <= 'z') || (s[i] >= '0' && s[i] <= '9')))
                i++;
            if (push_tok(p, T_NAME, a, s + a, i - a))
                return -1;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t a = i++;
            while (i < n && (unsigned char)s[i] != c)
                i += s[i] == '\\' ? 2 : 1;
            if (i >= n)
                return tmpl_fail_at(p, a, "unterminated string literal");
            const char *str = NULL;
            size_t slen = 0;
            if (decode_string(p, a, s + a + 1, i - a - 1, &str, &slen))
                return -1;
            if (push_tok(p, T_STRING, a, str, slen))
                return -1;
            i++;
            continue;
        }
        size_t k;
        for (k = 0; k < sizeof OPS / sizeof *OPS; k++)
            if (starts(s, n, i, OPS[k]))
                break;
        if (k == sizeof OPS / sizeof *OPS) {
            uint32_t cp;
            jv_utf8_decode(s + i, n - i, &cp);
            return tmpl_fail_at(p, i, "unexpected character U+%04X inside a tag", cp);
        }
        size_t ol = strlen(OPS[k]);
        char oc = OPS[k][0];
        if (ol == 1 && (oc == '(' || oc == '[' || oc == '{')) {
            if (depth == PARSE_MAX_NEST)
                return tmpl_fail_at(p, i, "brackets nest deeper than %d levels", PARSE_MAX_NEST);
            stack[depth++] = oc == '(' ? ')' : oc == '[' ? ']' : '}';
        } else if (ol == 1 && (oc == ')' || oc == ']' || oc == '}')) {
            if (!depth)
                return tmpl_fail_at(p, i, "unexpected '%c'", oc);
            if (stack[--depth] != oc)
                return tmpl_fail_at(p, i, "unexpected '%c', expected '%c'", oc, stack[depth]);
        }
        if (push_tok(p, T_OP, i, s + i, ol))
            return -1;
        i += ol;
    }
}

/* `{%[-+]? raw [-]?%}` at i (i points at '{')?  Returns the offset after it, or 0. */
static size_t raw_open(const char *s, size_t n, size_t i, const char *word, char *sign_out, bool *end_minus)
{
    size_t j = i + 2;
    char sign = 0;
    if (j < n && (s[j] == '-' || s[j] == '+'))
        sign = s[j++];
    j = skip_ws(s, n, j);
    if (!starts(s, n, j, word))
        return 0;
    j += strlen(word);
    size_t after_word = j;
    j = skip_ws(s, n, j);
    if (j == after_word && j < n && s[j] != '-' && s[j] != '%' && s[j] != '+')
        return 0;
    *end_minus = false;
    if (starts(s, n, j, "-%}"))
        *end_minus = true, j += 3;
    else if (starts(s, n, j, "+%}"))
        j += 3;
    else if (starts(s, n, j, "%}"))
        j += 2;
    else
        return 0;
    *sign_out = sign;
    return j;
}

int tmpl_lex(parser *p)
{
    const char *s = p->src;
    size_t n = p->n, i = 0;
    bool line_starting = true;
    while (i < n) {
        size_t q = i;
        while (q + 1 < n && !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')))
            q++;
        if (q + 1 >= n) {
            if (push_tok(p, T_DATA, i, s + i, n - i))
                return -1;
            break;
        }
        char opener = s[q + 1];
        char sign = q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+') ? s[q + 2] : 0;
        size_t j;
        char rsign;
        bool rminus;
        if (opener == '%' && (j = raw_open(s, n, q, "raw", &rsign, &rminus))) {
            if (emit_data(p, i, q, sign, true, line_starting))
                return -1;
            if (rminus)
                j = skip_ws(s, n, j);
            if (j >= n)
                break; /* jinja2 quirk: an opener at the very end of the source ends lexing silently */
            /* raw body runs to the first {% endraw %} */
            size_t e = j, after = 0;
            char esign = 0;
            bool eminus = false;
            for (; e + 1 < n; e++)
                if (s[e] == '{' && s[e + 1] == '%' && (after = raw_open(s, n, e, "endraw", &esign, &eminus)))
                    break;
            if (!after)
                return tmpl_fail_at(p, q, "missing {%% endraw %%} for this {%% raw %%}");
            if (emit_data(p, j, e, esign, true, s[j - 1] == '\n'))
                return -1;
            if (eminus)
                after = skip_ws(s, n, after);
            else if (s[after - 1] == '}' && s[after - 2] == '%' && s[after - 3] != '+' && after < n && s[after] == '\n')
                after++;
            i = after;
            line_starting = s[i - 1] == '\n';
            continue;
        }
        if (emit_data(p, i, q, sign, opener != '{', line_starting))
            return -1;
        j = q + 2 + (sign ? 1 : 0);
        if (opener == '#') {
            size_t e = j;
            if (j >= n)
                break; /* as for raw: `{#` as the last bytes is not an error in jinja2 */
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}'))
                e++;
            if (e + 1 >= n)
                return tmpl_fail_at(p, q, "missing end of comment tag #}");
            char esign = e > j && (s[e - 1] == '-' || s[e - 1] == '+') ? s[e - 1] : 0;
            i = e + 2;
            if (esign == '-')
                i = skip_ws(s, n, i);
            else if (esign != '+' && i < n && s[i] == '\n')
                i++;
            line_starting = s[i - 1] == '\n';
            continue;
        }
        if (push_tok(p, opener == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, q, NULL, 0))
            return -1;
        i = j;
        if (lex_tag(p, &i, opener == '%', &line_starting))
            return -1;
    }
    return push_tok(p, T_EOF, n, NULL, 0);
}
