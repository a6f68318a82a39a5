/*
 * templates.c — the built-in chat templates (the .jinja files of templates/, sources in
 * templates/README.md), embedded in the binary when this file is compiled.
 *
 * Owns: the table of built-in template names and their text.
 * Does not own: when a built-in template applies (model.c: only for a curated
 * tag's own file that has no template), rendering (text/template.c).
 *
 * Key decision: the assembler's .incbin copies each .jinja file verbatim into
 * .rodata at build time (plus a NUL), so the binary works from any directory
 * and the template stays a plain data file, diffable against its upstream;
 * the alternatives — a generated C string (an xxd step and a generated file
 * in every build rule) or a runtime file lookup (breaks an installed binary)
 * — cost more.  The path is relative to the repository root, where make runs
 * every compiler; the Makefile lists the .jinja files as prerequisites.
 */
#include "templates.h"

#include <stddef.h>
#include <string.h>

#define EMBED(sym, file)                                                                                               \
    __asm__(".section .rodata\n"                                                                                       \
            ".global " #sym "\n"                                                                                       \
            ".hidden " #sym "\n" #sym ":\n"                                                                            \
            ".incbin \"" file "\"\n"                                                                                   \
            ".byte 0\n"                                                                                                \
            ".previous\n")

EMBED(spill_tmpl_gemma3, "src/model/templates/gemma3.jinja");
extern const char spill_tmpl_gemma3[];

static const struct {
    const char *name;
    const char *src;
} builtin[] = {
    {"gemma3", spill_tmpl_gemma3},
};

const char *templates_builtin(const char *name)
{
    for (size_t i = 0; name && i < sizeof builtin / sizeof builtin[0]; i++)
        if (!strcmp(builtin[i].name, name))
            return builtin[i].src;
    return NULL;
}
