/*
 * test.h — the whole test framework: CHECK records a failure with file:line
 * and a message and keeps going; each test binary's main() returns
 * test_finish(), non-zero when anything failed.  No timing assertions.
 */
#ifndef SPILL_TEST_H
#define SPILL_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures, test_checks;

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        test_checks++;                                                                                                 \
        if (!(cond)) {                                                                                                 \
            test_failures++;                                                                                           \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);                                   \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
        }                                                                                                              \
    } while (0)

static inline int test_finish(const char *name)
{
    fprintf(stderr, "%s: %d checks, %d failed\n", name, test_checks, test_failures);
    return test_failures ? 1 : 0;
}

#endif
