/*
 * cli.h — what the tests that drive the real binary share: which binary (build/asan/spill, or $SPILL_BIN), a
 * shell command with its exit code, a JSONL file read back as a JSON array, a row's line and answer.
 */
#ifndef SPILL_TEST_CLI_H
#define SPILL_TEST_CLI_H

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static inline const char *bin(void)
{
    const char *b = getenv("SPILL_BIN");
    return b && *b ? b : "build/asan/spill";
}

/* Runs a shell command made from fmt; its exit code (-1 when it did not exit). */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Every line of a JSONL file that parses, as an array (empty when the file cannot be read); \u0000 is allowed,
 * as the byte tokens put it in answers.  *bad (may be NULL) counts the lines that do not parse. */
static inline json_t *read_lines_n(const char *path, int *bad)
{
    json_t *a = json_array();
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while (f && (n = getline(&line, &cap, f)) > 0) {
        json_t *o = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, NULL);
        if (o)
            json_array_append_new(a, o);
        else if (bad)
            (*bad)++;
    }
    free(line);
    if (f)
        fclose(f);
    return a;
}

static inline json_t *read_lines(const char *path)
{
    return read_lines_n(path, NULL);
}

/* A job's answers: custom_id -> its response body's choices (a new object; the caller decrefs it). */
static inline json_t *job_answers(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/results.jsonl", dir);
    json_t *lines = read_lines(path), *map = json_object();
    size_t i;
    json_t *o;
    json_array_foreach(lines, i, o)
    {
        json_t *body = json_object_get(json_object_get(o, "response"), "body");
        json_object_set(map, json_string_value(json_object_get(o, "custom_id")), json_object_get(body, "choices"));
    }
    json_decref(lines);
    return map;
}

/* Lines (newlines) in a file; 0 when it cannot be read. */
static inline int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    int n = 0, c;
    while (f && (c = fgetc(f)) != EOF)
        n += c == '\n';
    if (f)
        fclose(f);
    return n;
}

/* A chat results line's answer text (choices[0].message.content), or NULL. */
static inline const char *chat_answer(json_t *line)
{
    json_t *ch = json_array_get(json_object_get(json_object_get(json_object_get(line, "response"), "body"), "choices"),
                                0);
    return json_string_value(json_object_get(json_object_get(ch, "message"), "content"));
}

/* The line whose custom_id is id, or NULL. */
static inline json_t *by_id(json_t *lines, const char *id)
{
    size_t i;
    json_t *o;
    json_array_foreach(lines, i, o)
    {
        const char *c = json_string_value(json_object_get(o, "custom_id"));
        if (c && !strcmp(c, id))
            return o;
    }
    return NULL;
}

#endif
