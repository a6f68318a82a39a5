/*
 * schema_check.h — an independent JSON Schema validator for the keywords spill's constrained decoding
 * supports (src/batch/grammar.h), written from the JSON Schema spec rather than from grammar.c, so the
 * tests can check that what the grammar lets through validates.  type, properties, required,
 * additionalProperties, items, minItems, maxItems, enum, const, minLength, maxLength (code points),
 * minimum / maximum / exclusive*, anyOf, oneOf (exactly one), $ref ("#/…"), format date / time / date-time /
 * uuid.  Returns true when v is valid; *why (may be NULL) gets a short reason otherwise.
 */
#ifndef SPILL_TEST_SCHEMA_CHECK_H
#define SPILL_TEST_SCHEMA_CHECK_H

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const json_t *sc_ref(const json_t *doc, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    const json_t *at = doc;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", ref + 1);
    for (char *tok = strtok(buf, "/"); tok && at; tok = strtok(NULL, "/"))
        at = json_object_get(at, tok);
    return at;
}

static bool sc_type_is(const json_t *v, const char *t)
{
    if (!strcmp(t, "null"))
        return json_is_null(v);
    if (!strcmp(t, "boolean"))
        return json_is_boolean(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(t, "number"))
        return json_is_number(v);
    if (!strcmp(t, "string"))
        return json_is_string(v);
    if (!strcmp(t, "object"))
        return json_is_object(v);
    return !strcmp(t, "array") && json_is_array(v);
}

static size_t sc_codepoints(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static bool sc_digits(const char *s, int n)
{
    for (int i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

static bool sc_date(const char *s)
{
    static const int D[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (strlen(s) < 10 || !sc_digits(s, 4) || s[4] != '-' || !sc_digits(s + 5, 2) || s[7] != '-' ||
        !sc_digits(s + 8, 2))
        return false;
    int y = atoi(s), m = (s[5] - '0') * 10 + s[6] - '0', d = (s[8] - '0') * 10 + s[9] - '0';
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return y >= 1 && m >= 1 && m <= 12 && d >= 1 && d <= (m == 2 && !leap ? 28 : D[m - 1]);
}

static bool sc_time(const char *s)
{
    size_t n = strlen(s);
    if (n < 9 || !sc_digits(s, 2) || s[2] != ':' || !sc_digits(s + 3, 2) || s[5] != ':' || !sc_digits(s + 6, 2))
        return false;
    int h = atoi(s), mi = atoi(s + 3), se = atoi(s + 6);
    return h <= 23 && mi <= 59 && se <= 60 && (!strcmp(s + 8, "Z") || !strcmp(s + 8, "z") ||
                                             (n == 14 && (s[8] == '+' || s[8] == '-') && s[11] == ':'));
}

static bool sc_format(const char *f, const char *s)
{
    if (!strcmp(f, "date"))
        return strlen(s) == 10 && sc_date(s);
    if (!strcmp(f, "time"))
        return sc_time(s);
    if (!strcmp(f, "date-time"))
        return strlen(s) > 11 && sc_date(s) && (s[10] == 'T' || s[10] == 't') && sc_time(s + 11);
    if (!strcmp(f, "uuid")) {
        if (strlen(s) != 36)
            return false;
        for (int i = 0; i < 36; i++) {
            bool dash = i == 8 || i == 13 || i == 18 || i == 23;
            if (dash ? s[i] != '-' : !strchr("0123456789abcdefABCDEF", s[i]))
                return false;
        }
        return true;
    }
    return true;
}

static bool sc_valid(const json_t *doc, const json_t *s, const json_t *v, const char **why);

static bool sc_fail(const char **why, const char *r)
{
    if (why)
        *why = r;
    return false;
}

static bool sc_valid(const json_t *doc, const json_t *s, const json_t *v, const char **why)
{
    if (json_is_true(s))
        return true;
    if (!json_is_object(s))
        return sc_fail(why, "schema false");
    const json_t *ref = json_object_get(s, "$ref");
    if (ref)
        return sc_valid(doc, sc_ref(doc, json_string_value(ref)), v, why);
    const json_t *t = json_object_get(s, "type");
    if (t) {
        bool ok = false;
        if (json_is_string(t))
            ok = sc_type_is(v, json_string_value(t));
        for (size_t i = 0; json_is_array(t) && i < json_array_size(t); i++)
            ok |= sc_type_is(v, json_string_value(json_array_get(t, i)));
        if (!ok)
            return sc_fail(why, "type");
    }
    const json_t *en = json_object_get(s, "enum"), *co = json_object_get(s, "const");
    if (en) {
        bool ok = false;
        for (size_t i = 0; i < json_array_size(en); i++)
            ok |= json_equal(json_array_get(en, i), v);
        if (!ok)
            return sc_fail(why, "enum");
    }
    if (co && !json_equal(co, v))
        return sc_fail(why, "const");
    const json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    if (any || one) {
        int hits = 0;
        const json_t *br = any ? any : one;
        for (size_t i = 0; i < json_array_size(br); i++)
            hits += sc_valid(doc, json_array_get(br, i), v, NULL);
        if (any ? hits == 0 : hits != 1)
            return sc_fail(why, any ? "anyOf" : "oneOf");
    }
    if (json_is_object(v)) {
        const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
                     *ap = json_object_get(s, "additionalProperties");
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_object_get(v, json_string_value(json_array_get(req, i))))
                return sc_fail(why, "required");
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x)
        {
            const json_t *ps = props ? json_object_get(props, k) : NULL;
            if (ps) {
                if (!sc_valid(doc, ps, x, why))
                    return false;
            } else if (ap && !sc_valid(doc, ap, x, why))
                return false;
        }
    }
    if (json_is_array(v)) {
        const json_t *it = json_object_get(s, "items"), *mn = json_object_get(s, "minItems"),
                     *mx = json_object_get(s, "maxItems");
        if (mn && (json_int_t)json_array_size(v) < json_integer_value(mn))
            return sc_fail(why, "minItems");
        if (mx && (json_int_t)json_array_size(v) > json_integer_value(mx))
            return sc_fail(why, "maxItems");
        for (size_t i = 0; it && i < json_array_size(v); i++)
            if (!sc_valid(doc, it, json_array_get(v, i), why))
                return false;
    }
    if (json_is_string(v)) {
        size_t n = sc_codepoints(json_string_value(v), json_string_length(v));
        const json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength"),
                     *f = json_object_get(s, "format");
        if (mn && (json_int_t)n < json_integer_value(mn))
            return sc_fail(why, "minLength");
        if (mx && (json_int_t)n > json_integer_value(mx))
            return sc_fail(why, "maxLength");
        if (f && !sc_format(json_string_value(f), json_string_value(v)))
            return sc_fail(why, "format");
    }
    if (json_is_number(v)) {
        double d = json_number_value(v);
        const json_t *b;
        if ((b = json_object_get(s, "minimum")) && d < json_number_value(b))
            return sc_fail(why, "minimum");
        if ((b = json_object_get(s, "maximum")) && d > json_number_value(b))
            return sc_fail(why, "maximum");
        if ((b = json_object_get(s, "exclusiveMinimum")) && d <= json_number_value(b))
            return sc_fail(why, "exclusiveMinimum");
        if ((b = json_object_get(s, "exclusiveMaximum")) && d >= json_number_value(b))
            return sc_fail(why, "exclusiveMaximum");
    }
    return true;
}

/* v valid against the whole schema document doc. */
static inline bool schema_valid(const json_t *doc, const json_t *v, const char **why)
{
    return sc_valid(doc, doc, v, why);
}

#endif
