#!/usr/bin/env python3
"""Generates tokenizer/unicode_tables.c and tokenizer/unicode_tables.h (the Unicode data the tokenizer needs) from
Python's unicodedata module.

Regenerate (from the repository root):   python3 tools/gen_unicode_tables.py
The output depends only on unicodedata.unidata_version (printed into the files); the committed
tables were made with Python 3.11 (Unicode 14.0.0), the version checked against the reference
tokenizer (QWEN3.md 4.3).

What is generated:
  * a two-stage property table, one byte per code point:
      UT_L       general category L* (Lu Ll Lt Lm Lo)            = regex \\p{L}
      UT_N       general category N* (Nd Nl No)                  = regex \\p{N}
      UT_WS      Unicode White_Space (PropList.txt)              = Oniguruma's \\s
      UT_UNSAFE  the character may change under NFC or may interact with its neighbours:
                 canonical combining class != 0, or it has a canonical decomposition (Hangul
                 syllables excepted: they are NFC-stable and handled algorithmically), or it is the
                 second character of some canonical composition (incl. Hangul V and T jamo).
                 A text with no UT_UNSAFE character is already NFC; and NFC can be applied
                 separately to the stretches between "safe" characters.
  * canonical combining classes (ranges),
  * the full (recursive) canonical decomposition of every character that has one (Hangul by
    algorithm in the C code, not in the table),
  * the primary composites: pairs (first, second) -> composite, excluding Full_Composition_Exclusion
    (found as: the pair's NFC is not the composite).
"""
import os
import sys
import unicodedata as ud

MAXCP = 0x110000
UT_L, UT_N, UT_WS, UT_UNSAFE = 1, 2, 4, 8

# Unicode White_Space from PropList.txt (unchanged since Unicode 6.3, when U+180E left it).
# unicodedata has no White_Space property; str.isspace() differs (it includes U+001C..U+001F).
WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
               (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
               (0x3000, 0x3000)]

SBASE, LBASE, VBASE, TBASE = 0xAC00, 0x1100, 0x1161, 0x11A7
LCOUNT, VCOUNT, TCOUNT = 19, 21, 28
SCOUNT = LCOUNT * VCOUNT * TCOUNT


def is_hangul_syllable(cp):
    return SBASE <= cp < SBASE + SCOUNT


def canon_decomp_raw(cp):
    """The one-level canonical decomposition from UnicodeData.txt, or None."""
    d = ud.decomposition(chr(cp))
    if not d or d.startswith('<'):
        return None
    return [int(x, 16) for x in d.split()]


def full_decomp(cp):
    d = canon_decomp_raw(cp)
    if d is None:
        return [cp]
    out = []
    for x in d:
        out.extend(full_decomp(x))
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    props = bytearray(MAXCP)
    ccc = [0] * MAXCP
    decomp = {}
    comps = {}
    for cp in range(MAXCP):
        if 0xD800 <= cp < 0xE000:
            continue
        ch = chr(cp)
        cat = ud.category(ch)
        if cat[0] == 'L':
            props[cp] |= UT_L
        elif cat[0] == 'N':
            props[cp] |= UT_N
        ccc[cp] = ud.combining(ch)
        raw = canon_decomp_raw(cp)
        if raw is not None:
            full = full_decomp(cp)
            # the NFD of the character must be its full decomposition (sanity check of the recursion)
            assert ud.normalize('NFD', ch) == ''.join(map(chr, full)), hex(cp)
            decomp[cp] = full
            if len(raw) == 2 and ud.normalize('NFC', chr(raw[0]) + chr(raw[1])) == ch:
                comps[(raw[0], raw[1])] = cp
    for lo, hi in WHITE_SPACE:
        for cp in range(lo, hi + 1):
            props[cp] |= UT_WS
    seconds = {b for (_, b) in comps}
    seconds.update(range(VBASE, VBASE + VCOUNT))
    seconds.update(range(TBASE + 1, TBASE + TCOUNT))
    for cp in range(MAXCP):
        if ccc[cp] != 0 or cp in seconds or (cp in decomp and not is_hangul_syllable(cp)):
            props[cp] |= UT_UNSAFE
    # ASCII is always safe (the C code skips it without a lookup)
    assert all(not props[cp] & UT_UNSAFE for cp in range(128))
    # Check the claim the C code relies on: every string of safe characters is NFC (spot check on
    # every safe character alone and next to a few others is done by the unit tests; here each one).
    for cp in range(MAXCP):
        if not (props[cp] & UT_UNSAFE) and not (0xD800 <= cp < 0xE000):
            assert ud.normalize('NFC', chr(cp)) == chr(cp), hex(cp)

    # two-stage table with 128-entry blocks
    BS = 128
    blocks, index, stage1 = [], {}, []
    for start in range(0, MAXCP, BS):
        blk = bytes(props[start:start + BS])
        if blk not in index:
            index[blk] = len(blocks)
            blocks.append(blk)
        stage1.append(index[blk])
    assert len(blocks) < 65536

    ccc_ranges = []  # (lo, hi, class)
    for cp in range(MAXCP):
        c = ccc[cp]
        if c == 0:
            continue
        if ccc_ranges and ccc_ranges[-1][1] == cp - 1 and ccc_ranges[-1][2] == c:
            ccc_ranges[-1][1] = cp
        else:
            ccc_ranges.append([cp, cp, c])

    dec_keys = sorted(decomp)
    max_dec = max(len(v) for v in decomp.values())
    pool = []
    dec_entries = []
    for cp in dec_keys:
        dec_entries.append((cp, len(pool), len(decomp[cp])))
        pool.extend(decomp[cp])
    comp_keys = sorted(comps)

    version = ud.unidata_version
    gen = 'Generated by tools/gen_unicode_tables.py from Python %s unicodedata (Unicode %s). Do not edit.' % (
        sys.version.split()[0], version)

    h = []
    h.append('/* unicode_tables.h: Unicode data for the tokenizer. %s */' % gen)
    h.append('#ifndef UNICODE_TABLES_H\n#define UNICODE_TABLES_H\n\n#include <stdint.h>\n')
    h.append('#define UT_UNICODE_VERSION "%s"' % version)
    h.append('#define UT_L 1        /* \\p{L}: general category L* */')
    h.append('#define UT_N 2        /* \\p{N}: general category N* */')
    h.append('#define UT_WS 4       /* Unicode White_Space */')
    h.append('#define UT_UNSAFE 8   /* may change under NFC or combine with a neighbour */')
    h.append('#define UT_MAX_DECOMP %d  /* longest full canonical decomposition */' % max_dec)
    h.append('#define UT_BLOCK_SHIFT 7\n')
    h.append('extern const uint16_t ut_stage1[%d];' % len(stage1))
    h.append('extern const uint8_t ut_stage2[%d];\n' % (len(blocks) * BS))
    h.append('/* UT_* bits of code point cp (0 for cp > 0x10FFFF). */')
    h.append('static inline unsigned ut_props(uint32_t cp) {')
    h.append('    if (cp >= 0x110000) return 0;')
    h.append('    return ut_stage2[((uint32_t)ut_stage1[cp >> UT_BLOCK_SHIFT] << UT_BLOCK_SHIFT) | (cp & ((1u << UT_BLOCK_SHIFT) - 1))];')
    h.append('}\n')
    h.append('/* Canonical combining class of cp. */')
    h.append('int ut_ccc(uint32_t cp);')
    h.append('/* Full canonical decomposition of cp (Hangul syllables by algorithm) into out; returns the')
    h.append(' * number of code points (1 and out[0] = cp when cp has none). */')
    h.append('int ut_decompose(uint32_t cp, uint32_t out[UT_MAX_DECOMP]);')
    h.append('/* The primary composite of the pair (a, b) (Hangul LV and LVT by algorithm), or 0. */')
    h.append('uint32_t ut_compose(uint32_t a, uint32_t b);')
    h.append('\n#endif')

    c = []
    c.append('/* unicode_tables.c: %s */' % gen)
    c.append('#include "unicode_tables.h"\n#include <stddef.h>\n')
    c.append('const uint16_t ut_stage1[%d] = {' % len(stage1))
    for i in range(0, len(stage1), 24):
        c.append(','.join(str(x) for x in stage1[i:i + 24]) + ',')
    c.append('};\n')
    c.append('const uint8_t ut_stage2[%d] = {' % (len(blocks) * BS))
    for b in blocks:
        for i in range(0, BS, 64):
            c.append(','.join(str(x) for x in b[i:i + 64]) + ',')
    c.append('};\n')
    c.append('static const struct { uint32_t lo, hi; uint8_t ccc; } ccc_ranges[%d] = {' % len(ccc_ranges))
    for i in range(0, len(ccc_ranges), 6):
        c.append(' '.join('{0x%X,0x%X,%d},' % tuple(r) for r in ccc_ranges[i:i + 6]))
    c.append('};\n')
    c.append('static const struct { uint32_t cp; uint16_t off; uint8_t len; } decomp_index[%d] = {' % len(dec_entries))
    for i in range(0, len(dec_entries), 6):
        c.append(' '.join('{0x%X,%d,%d},' % e for e in dec_entries[i:i + 6]))
    c.append('};\n')
    c.append('static const uint32_t decomp_pool[%d] = {' % len(pool))
    for i in range(0, len(pool), 12):
        c.append(','.join('0x%X' % x for x in pool[i:i + 12]) + ',')
    c.append('};\n')
    c.append('static const struct { uint32_t a, b, c; } comp_pairs[%d] = {' % len(comp_keys))
    for i in range(0, len(comp_keys), 5):
        c.append(' '.join('{0x%X,0x%X,0x%X},' % (a, b, comps[(a, b)]) for (a, b) in comp_keys[i:i + 5]))
    c.append('};\n')
    c.append(r'''enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7,
       LCOUNT = 19, VCOUNT = 21, TCOUNT = 28, NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT };

int ut_ccc(uint32_t cp) {
    size_t lo = 0, hi = sizeof ccc_ranges / sizeof ccc_ranges[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < ccc_ranges[mid].lo) hi = mid;
        else if (cp > ccc_ranges[mid].hi) lo = mid + 1;
        else return ccc_ranges[mid].ccc;
    }
    return 0;
}

int ut_decompose(uint32_t cp, uint32_t out[UT_MAX_DECOMP]) {
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE;
        out[0] = LBASE + s / NCOUNT;
        out[1] = VBASE + (s % NCOUNT) / TCOUNT;
        if (s % TCOUNT == 0) return 2;
        out[2] = TBASE + s % TCOUNT;
        return 3;
    }
    size_t lo = 0, hi = sizeof decomp_index / sizeof decomp_index[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < decomp_index[mid].cp) hi = mid;
        else if (cp > decomp_index[mid].cp) lo = mid + 1;
        else {
            for (int i = 0; i < decomp_index[mid].len; i++) out[i] = decomp_pool[decomp_index[mid].off + i];
            return decomp_index[mid].len;
        }
    }
    out[0] = cp;
    return 1;
}

uint32_t ut_compose(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = sizeof comp_pairs / sizeof comp_pairs[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a < comp_pairs[mid].a || (a == comp_pairs[mid].a && b < comp_pairs[mid].b)) hi = mid;
        else if (a > comp_pairs[mid].a || b > comp_pairs[mid].b) lo = mid + 1;
        else return comp_pairs[mid].c;
    }
    return 0;
}''')
    with open(os.path.join(root, 'tokenizer', 'unicode_tables.h'), 'w') as f:
        f.write('\n'.join(h) + '\n')
    with open(os.path.join(root, 'tokenizer', 'unicode_tables.c'), 'w') as f:
        f.write('\n'.join(c) + '\n')
    print('unicode_tables.c: %d blocks, %d ccc ranges, %d decompositions (pool %d), %d compositions, Unicode %s'
          % (len(blocks), len(ccc_ranges), len(dec_entries), len(pool), len(comp_keys), version))


if __name__ == '__main__':
    main()
