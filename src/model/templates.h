/*
 * templates.h — chat templates built into the binary, for curated models
 * whose file carries none (the .jinja files of src/model/templates/).
 */
#ifndef SPILL_TEMPLATES_H
#define SPILL_TEMPLATES_H

/* The NUL-terminated source of the built-in template called name ("gemma3"), or NULL when there is none.
 * The text is static: never freed. */
const char *templates_builtin(const char *name);

#endif
