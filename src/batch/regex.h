/*
 * regex.h — a JSON Schema `pattern` (a subset of ECMA-262 regular expressions) compiled into a deterministic
 * automaton over the bytes of a JSON string's text, for grammar.c's pattern-constrained strings (and the
 * formats email, ipv4, ipv6, hostname, which grammar.c writes as patterns).
 *
 *     rx_compile(pattern, &d, err, errlen)   once per schema string node
 *     s = 0; per byte: s = d.next[s * 256 + byte] (-1: refused); d.accept[s]: the text so far matches
 *
 * The text is the string as written between the quotes: the automaton never takes '"', '\', or a byte below
 * 0x20 (a pattern string is written without escapes), only well-formed UTF-8, and from every state it can
 * still reach an accepting one (dead states are pruned), so every accepted byte string extends to a match.
 */
#ifndef SPILL_REGEX_H
#define SPILL_REGEX_H

#include <stddef.h>
#include <stdint.h>

#define RX_MAX_NFA 8192 /* automaton sizes a pattern may need (counted repetitions are expanded) */
#define RX_MAX_DFA 2048

typedef struct rx_dfa {
    int32_t n;       /* states; 0 is the start */
    int32_t *next;   /* (n, 256) the next state, -1 when the byte is refused */
    uint8_t *accept; /* (n) 1 when the text so far matches */
    int32_t *minrem; /* (n) fewest characters from here to a match */
} rx_dfa;

/*
 * Compiles pattern (NUL-terminated, UTF-8) as JSON Schema reads it: a search, anchored only by a leading ^
 * and a trailing $ (of the whole pattern or of each top-level alternative).  Supported: literals, escapes of
 * punctuation, \d \w \s and their negations (ASCII), \uXXXX, classes [...] and [^...] of ASCII characters
 * and ranges, ., groups (…) and (?:…), alternation |, quantifiers ? * + {m} {m,} {m,n} (lazy forms too: the
 * same language).  Refused with a sentence (err, no path): backreferences, lookarounds, word boundaries,
 * named groups, flags, Unicode properties, classes listing non-ASCII characters, ^ or $ elsewhere, and
 * patterns that need more than RX_MAX_NFA / RX_MAX_DFA states.  0, or -1 (*out zeroed).
 */
int rx_compile(const char *pattern, rx_dfa *out, char *err, size_t errlen);

/* Safe on a zeroed one. */
void rx_free(rx_dfa *d);

#endif
