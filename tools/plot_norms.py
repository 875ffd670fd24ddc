#!/usr/bin/env python3
"""Pictures of RMSNorm at work, drawn as SVG from `./run --norms-json` (cli/norm_trace.h).
Python 3 standard library only.

  python3 tools/plot_norms.py sites TRACE.jsonl --out-dir DIR
      DIR/norms-rms-in.svg and DIR/norms-scale.svg: rms(in) and the scale 1/sqrt(mean(x^2) + eps)
      at each call site (a panel each), one line per layer, across positions; QK-Norm's line is
      the mean over the heads, the shaded band their range.

  python3 tools/plot_norms.py scores -o OUT.svg --with 1=A.jsonl 2=B.jsonl ... --without 1=C.jsonl ...
      OUT.svg: the largest attention score |q.k|/sqrt(d) of each layer (over heads and
      positions) against the factor q and k were scaled by, with QK-Norm and without.

  python3 tools/plot_norms.py lab MODEL.bin --out-dir DIR [--run ./run] [-i PROMPT] [-n N]
      Everything above from one model: runs ./run --norms-json on the model and on copies of it
      whose q_proj and k_proj are multiplied by 1/2 ... 8, with QK-Norm and without it (a copy
      whose header has no FLAG_QK_NORM and no q_norm/k_norm tensors: the engine then skips
      QK-Norm, as for Qwen2), and draws the three pictures. f32 and bf16 checkpoints only (the
      factors are powers of two, so bf16 weights scale exactly). The JSON files stay in a
      temporary folder; --keep DIR keeps them there.

The without-QK-Norm trace can also come from the engine itself, where it has the ablation switch:
`./run MODEL.bin --ablate qk-norm --norms-json C.jsonl ...` on a checkpoint scaled by
`plot_norms.py scale-qk MODEL.bin S OUT.bin`.
"""

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SITES = ['pre-attention', 'QK-Norm q', 'QK-Norm k', 'pre-MLP', 'final norm']
COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf',
          '#7f7f7f', '#bcbd22']
FONT = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif"'


# ------------------------------------------------------------------------------------------------
# Reading the trace


def read_trace(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def site_series(lines, field):
    """site -> layer -> sorted [(pos, mean, lo, hi)] of `field` (mean and range over the heads)."""
    acc = {}
    for o in lines:
        if o['site'] == 'attention':
            continue
        acc.setdefault(o['site'], {}).setdefault(o['layer'], {}).setdefault(o['position'], []).append(o[field])
    out = {}
    for site, layers in acc.items():
        out[site] = {layer: sorted((p, sum(v) / len(v), min(v), max(v)) for p, v in by_pos.items())
                     for layer, by_pos in layers.items()}
    return out


def max_score_per_layer(lines):
    """layer -> the largest max_score over heads and positions."""
    best = {}
    for o in lines:
        if o['site'] == 'attention':
            best[o['layer']] = max(best.get(o['layer'], 0.0), o['max_score'])
    return best


# ------------------------------------------------------------------------------------------------
# A small SVG plotter: panels with axes, ticks, labels, lines, bands and a legend


def esc(text):
    return str(text).replace('&', '&amp;').replace('<', '&lt;').replace('>', '&gt;')


def fmt_tick(v):
    if v == 0:
        return '0'
    if abs(v) >= 1e4 or abs(v) < 1e-2:
        return '%.0e' % v
    return ('%.4g' % v)


def linear_ticks(lo, hi, n=5):
    span = hi - lo if hi > lo else 1.0
    raw = span / n
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * step:
            step *= m
            break
    first = math.ceil(lo / step) * step
    ticks = []
    v = first
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 10))
        v += step
    return ticks


def log_ticks(lo, hi):
    """Powers of ten inside [lo, hi], with 2 and 5 multiples when fewer than three decades."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    mults = (1,) if b - a > 3 else (1, 2, 5)
    return [m * 10 ** e for e in range(a, b + 1) for m in mults if lo <= m * 10 ** e <= hi]


class Panel:
    """One plot area at (x, y) of size (w, h) inside an SVG, with its own axes."""

    def __init__(self, svg, x, y, w, h, xrange, yrange, title, xlabel, ylabel, xlog=False, ylog=False,
                 xticks=None):
        self.svg, self.x, self.y, self.w, self.h = svg, x, y, w, h
        self.xlog, self.ylog = xlog, ylog
        self.x0, self.x1 = self._t(xrange[0], xlog), self._t(xrange[1], xlog)
        self.y0, self.y1 = self._t(yrange[0], ylog), self._t(yrange[1], ylog)
        if self.x1 == self.x0:
            self.x1 += 1
        if self.y1 == self.y0:
            self.y1 += 1
        self._frame(title, xlabel, ylabel, xrange, yrange, xticks)

    @staticmethod
    def _t(v, log):
        return math.log10(v) if log else v

    def px(self, v):
        return self.x + (self._t(v, self.xlog) - self.x0) / (self.x1 - self.x0) * self.w

    def py(self, v):
        return self.y + self.h - (self._t(v, self.ylog) - self.y0) / (self.y1 - self.y0) * self.h

    def _frame(self, title, xlabel, ylabel, xrange, yrange, xticks):
        s = self.svg
        s.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="white" stroke="#444"/>'
                 % (self.x, self.y, self.w, self.h))
        xt = xticks or (log_ticks(*xrange) if self.xlog else linear_ticks(*xrange))
        yt = log_ticks(*yrange) if self.ylog else linear_ticks(*yrange)
        for v in xt:
            X = self.px(v)
            s.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e4e4e4"/>' % (X, self.y, X, self.y + self.h))
            s.append('<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle" %s>%s</text>'
                     % (X, self.y + self.h + 14, FONT, esc(fmt_tick(v))))
        for v in yt:
            Y = self.py(v)
            s.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e4e4e4"/>' % (self.x, Y, self.x + self.w, Y))
            s.append('<text x="%.1f" y="%.1f" font-size="11" text-anchor="end" %s>%s</text>'
                     % (self.x - 5, Y + 4, FONT, esc(fmt_tick(v))))
        s.append('<text x="%.1f" y="%.1f" font-size="13" font-weight="bold" text-anchor="middle" %s>%s</text>'
                 % (self.x + self.w / 2, self.y - 8, FONT, esc(title)))
        s.append('<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle" %s>%s</text>'
                 % (self.x + self.w / 2, self.y + self.h + 32, FONT, esc(xlabel)))
        cx, cy = self.x - 48, self.y + self.h / 2
        s.append('<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle" transform="rotate(-90 %.1f %.1f)" %s>%s</text>'
                 % (cx, cy, cx, cy, FONT, esc(ylabel)))

    def line(self, pts, color, dash=False, width=1.8, marker=False):
        if not pts:
            return
        d = ' '.join('%.1f,%.1f' % (self.px(a), self.py(b)) for a, b in pts)
        self.svg.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="%.1f"%s/>'
                        % (d, color, width, ' stroke-dasharray="6,4"' if dash else ''))
        if marker:
            for a, b in pts:
                self.svg.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (self.px(a), self.py(b), color))

    def band(self, pts_lo, pts_hi, color):
        if not pts_lo:
            return
        path = [(self.px(a), self.py(b)) for a, b in pts_lo] + [(self.px(a), self.py(b)) for a, b in reversed(pts_hi)]
        self.svg.append('<polygon points="%s" fill="%s" fill-opacity="0.15" stroke="none"/>'
                        % (' '.join('%.1f,%.1f' % p for p in path), color))


def legend(svg, x, y, entries, title=None):
    """entries: (label, color, dashed)."""
    if title:
        svg.append('<text x="%.1f" y="%.1f" font-size="12" font-weight="bold" %s>%s</text>' % (x, y, FONT, esc(title)))
        y += 18
    for label, color, dash in entries:
        svg.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2.5"%s/>'
                   % (x, y - 4, x + 28, y - 4, color, ' stroke-dasharray="6,4"' if dash else ''))
        svg.append('<text x="%.1f" y="%.1f" font-size="12" %s>%s</text>' % (x + 36, y, FONT, esc(label)))
        y += 18


def write_svg(path, width, height, body, title, note):
    head = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">'
            % (width, height, width, height),
            '<rect width="100%" height="100%" fill="white"/>',
            '<text x="%.1f" y="24" font-size="16" font-weight="bold" text-anchor="middle" %s>%s</text>'
            % (width / 2, FONT, esc(title)),
            '<text x="%.1f" y="42" font-size="12" fill="#444" text-anchor="middle" %s>%s</text>'
            % (width / 2, FONT, esc(note))]
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        f.write('\n'.join(head + body + ['</svg>']) + '\n')
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------
# The pictures


PANEL_TITLES = {
    'QK-Norm q': 'QK-Norm q (mean over heads, band: range)',
    'QK-Norm k': 'QK-Norm k (mean over heads, band: range)',
    # without --dump-logits the engine runs the final norm only where logits are needed
    'final norm': 'final norm (where logits are computed)',
}


def plot_sites(lines, field, path, ylabel, title, note):
    series = site_series(lines, field)
    sites = [s for s in SITES if s in series]
    layers = sorted({l for s in sites for l in series[s] if l >= 0})
    positions = [p for s in sites for pts in series[s].values() for p, *_ in pts]
    values = [v for s in sites for pts in series[s].values() for _, _, lo, hi in pts for v in (lo, hi)]
    if not sites or not positions:
        sys.exit('plot_norms: no RMSNorm lines in the trace')
    lo, hi = min(values), max(values)
    ylog = lo > 0 and hi / lo > 20
    yrange = (lo / 1.2, hi * 1.2) if ylog else (lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    cols, pw, ph, mx, my = 3, 330, 220, 90, 80
    rows = (len(sites) + 1 + cols - 1) // cols  # one cell for the legend
    width, height = cols * (pw + mx) + 40, rows * (ph + my) + 60
    body = []
    for i, site in enumerate(sites):
        X, Y = 80 + (i % cols) * (pw + mx), 80 + (i // cols) * (ph + my)
        panel = Panel(body, X, Y, pw, ph, (min(positions), max(max(positions), 1)), yrange,
                      PANEL_TITLES.get(site, site),
                      'position', ylabel, ylog=ylog)
        for layer, pts in sorted(series[site].items()):
            color = COLORS[layer % len(COLORS)] if layer >= 0 else '#000000'
            if site.startswith('QK'):
                panel.band([(p, a) for p, _, a, _ in pts], [(p, b) for p, _, _, b in pts], color)
            panel.line([(p, m) for p, m, _, _ in pts], color)
    i = len(sites)
    X, Y = 80 + (i % cols) * (pw + mx), 80 + (i // cols) * (ph + my)
    entries = [('layer %d' % l, COLORS[l % len(COLORS)], False) for l in layers]
    if 'final norm' in series:
        entries.append(('after the last layer', '#000000', False))
    legend(body, X, Y + 10, entries, 'lines')
    write_svg(path, width, height, body, title, note)


def plot_scores(with_runs, without_runs, path, note):
    """with_runs, without_runs: {factor: trace lines}."""
    curves = {}
    for label, runs in (('with QK-Norm', with_runs), ('without QK-Norm', without_runs)):
        for factor, lines in runs.items():
            for layer, best in max_score_per_layer(lines).items():
                curves.setdefault((label, layer), []).append((factor, best))
    if not curves:
        sys.exit('plot_norms: no attention lines in the traces (were they written by --norms-json?)')
    factors = sorted({f for pts in curves.values() for f, _ in pts})
    values = [v for pts in curves.values() for _, v in pts]
    layers = sorted({layer for _, layer in curves})
    body = []
    pw, ph = 560, 380
    panel = Panel(body, 90, 80, pw, ph, (factors[0], factors[-1]), (min(values) / 1.5, max(values) * 1.5),
                  'largest |q.k|/sqrt(d) per layer', 'factor on q_proj and k_proj (log scale)',
                  'largest attention score (log scale)', xlog=True, ylog=True, xticks=factors)
    for (label, layer), pts in sorted(curves.items()):
        panel.line(sorted(pts), COLORS[layer % len(COLORS)], dash=label.startswith('without'), marker=True)
    entries = [('layer %d' % l, COLORS[l % len(COLORS)], False) for l in layers]
    legend(body, 90 + pw + 30, 100, entries, 'colour: layer')
    legend(body, 90 + pw + 30, 120 + 18 * len(entries) + 20,
           [('with QK-Norm', '#333333', False), ('without QK-Norm', '#333333', True)], 'line')
    write_svg(path, 90 + pw + 230, 80 + ph + 70, body,
              'Attention scores as q and k grow: QK-Norm holds them', note)


# ------------------------------------------------------------------------------------------------
# Checkpoint copies with q_proj and k_proj scaled, with or without QK-Norm (model.h's layout)

HEADER = struct.Struct('<4s13I f i d I 8i f f i 2I 4Q 96x')
FLAG_QK_NORM, FLAG_QKV_BIAS, FLAG_TIED_EMBED = 1, 2, 4
ALIGN = 64


def scale_qk_checkpoint(src, factor, dst, drop_qk_norm=False):
    """Writes a copy of checkpoint src to dst with q_proj and k_proj multiplied by factor (a power
    of two), and without QK-Norm when drop_qk_norm."""
    with open(src, 'rb') as f:
        data = f.read()
    h = list(HEADER.unpack_from(data, 0))
    (magic, version, arch, flags, D, F, L, H, K, d, V, max_seq, wtype, gs) = h[:14]
    if magic != b'QW3C':
        sys.exit('plot_norms: %s is not a checkpoint of this engine' % src)
    if wtype not in (0, 1):
        sys.exit('plot_norms: %s: only f32 and bf16 checkpoints can be scaled here (export one with --dtype bf16)' % src)
    if math.frexp(factor)[0] != 0.5:
        sys.exit('plot_norms: the factor must be a power of two, got %g' % factor)
    w_off = h[-2]
    elem = 4 if wtype == 0 else 2

    def matrix(rows, cols):
        return ('m', rows * cols * elem)

    def vector(n):
        return ('v', n * 4)

    plan = [('embed', matrix(V, D))]
    for _ in range(L):
        plan += [('in_norm', vector(D)), ('q_proj', matrix(H * d, D))]
        if flags & FLAG_QKV_BIAS:
            plan.append(('q_bias', vector(H * d)))
        plan.append(('k_proj', matrix(K * d, D)))
        if flags & FLAG_QKV_BIAS:
            plan.append(('k_bias', vector(K * d)))
        plan.append(('v_proj', matrix(K * d, D)))
        if flags & FLAG_QKV_BIAS:
            plan.append(('v_bias', vector(K * d)))
        if flags & FLAG_QK_NORM:
            plan += [('q_norm', vector(d)), ('k_norm', vector(d))]
        plan += [('o_proj', matrix(D, H * d)), ('post_norm', vector(D)), ('gate', matrix(F, D)),
                 ('up', matrix(F, D)), ('down', matrix(D, F))]
    plan.append(('norm', vector(D)))
    if not flags & FLAG_TIED_EMBED:
        plan.append(('lm_head', matrix(V, D)))

    out = bytearray(data[:w_off])
    pos = w_off
    for name, (_, size) in plan:
        pos = (pos + ALIGN - 1) // ALIGN * ALIGN
        blob = data[pos:pos + size]
        pos += size
        if drop_qk_norm and name in ('q_norm', 'k_norm'):
            continue
        if name in ('q_proj', 'k_proj') and factor != 1:
            blob = scale_values(blob, wtype, factor)
        out += bytes(-len(out) % ALIGN) + blob
    out += bytes(-len(out) % ALIGN)
    if drop_qk_norm:
        h[3] = flags & ~FLAG_QK_NORM
    h[-1] = len(out) - w_off
    out[:HEADER.size] = HEADER.pack(*h)
    with open(dst + '.tmp', 'wb') as f:
        f.write(out)
    os.replace(dst + '.tmp', dst)


def scale_values(blob, wtype, factor):
    if wtype == 0:
        n = len(blob) // 4
        return struct.pack('<%df' % n, *(v * factor for v in struct.unpack('<%df' % n, blob)))
    # bf16: the top half of a float32; times a power of two the low half stays zero (no rounding)
    n = len(blob) // 2
    as_f32 = struct.unpack('<%df' % n, b''.join(b'\0\0' + blob[2 * i:2 * i + 2] for i in range(n)))
    packed = struct.pack('<%df' % n, *(v * factor for v in as_f32))
    return b''.join(packed[4 * i + 2:4 * i + 4] for i in range(n))


# ------------------------------------------------------------------------------------------------
# The lab: every run and every picture from one model

LAB_PROMPT = 'Once upon a time, there was a little girl named Lily. She loved to play in the park with her dog.'
LAB_FACTORS = (0.5, 1, 2, 4, 8)


def run_engine(run, ckpt, prompt, steps, json_path):
    args = [run, ckpt, '-i', prompt, '-n', str(steps), '-t', '0', '--norms-json', json_path]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit('plot_norms: %s failed:\n%s' % (' '.join(args), p.stderr))
    return read_trace(json_path)


def lab(args):
    work = args.keep or tempfile.mkdtemp(prefix='plot_norms_')
    os.makedirs(work, exist_ok=True)
    os.makedirs(args.out_dir, exist_ok=True)
    name = os.path.basename(args.model)
    try:
        runs = {True: {}, False: {}}
        for qk_norm in (True, False):
            for factor in LAB_FACTORS:
                tag = '%s.x%g%s' % (name, factor, '' if qk_norm else '.no-qk-norm')
                ckpt = os.path.join(work, tag + '.bin')
                sys.stderr.write('plot_norms: %s\n' % tag)
                scale_qk_checkpoint(args.model, factor, ckpt, drop_qk_norm=not qk_norm)
                runs[qk_norm][factor] = run_engine(args.run, ckpt, args.input, args.steps,
                                                   os.path.join(work, tag + '.jsonl'))
                if not args.keep:
                    os.remove(ckpt)
        base = runs[True][1]
        n_pos = 1 + max(o['position'] for o in base)
        note = '%s, %d positions (prompt and greedy continuation): %s' % (name, n_pos, shorten(args.input))
        sites_pictures(base, args.out_dir, note)
        plot_scores(runs[True], runs[False], os.path.join(args.out_dir, 'norms-qk-scores.svg'), note)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def shorten(text, n=48):
    return text if len(text) <= n else text[:n - 3] + '...'


def sites_pictures(lines, out_dir, note):
    plot_sites(lines, 'rms_in', os.path.join(out_dir, 'norms-rms-in.svg'), 'rms(in)',
               'What goes into each RMSNorm: rms(x)', note)
    plot_sites(lines, 'scale', os.path.join(out_dir, 'norms-scale.svg'), 'scale = 1/sqrt(mean(x^2)+eps)',
               'What each RMSNorm multiplies it by: the scale', note)


def factor_files(items):
    runs = {}
    for item in items or ():
        factor, sep, path = item.partition('=')
        if not sep:
            sys.exit("plot_norms: expected FACTOR=FILE, got '%s'" % item)
        runs[float(factor)] = read_trace(path)
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest='cmd', required=True)
    p = sub.add_parser('sites', help='rms(in) and scale per call site and layer across positions')
    p.add_argument('trace')
    p.add_argument('--out-dir', default='.')
    p = sub.add_parser('scores', help='largest attention score per layer, with and without QK-Norm')
    p.add_argument('-o', '--out', required=True)
    p.add_argument('--with', dest='with_', nargs='+', metavar='FACTOR=FILE', required=True)
    p.add_argument('--without', nargs='+', metavar='FACTOR=FILE', default=[])
    p = sub.add_parser('scale-qk', help='a checkpoint copy with q_proj and k_proj times a power of two')
    p.add_argument('model')
    p.add_argument('factor', type=float)
    p.add_argument('out')
    p.add_argument('--drop-qk-norm', action='store_true', help='also without QK-Norm')
    p = sub.add_parser('lab', help='all the runs and all three pictures from one model')
    p.add_argument('model')
    p.add_argument('--out-dir', default='.')
    p.add_argument('--run', default=os.path.join(ROOT, 'run'))
    p.add_argument('-i', '--input', default=LAB_PROMPT)
    p.add_argument('-n', '--steps', type=int, default=40)
    p.add_argument('--keep', metavar='DIR', help='keep the scaled checkpoints and JSON files in DIR')
    args = ap.parse_args()
    if args.cmd == 'sites':
        os.makedirs(args.out_dir, exist_ok=True)
        sites_pictures(read_trace(args.trace), args.out_dir, os.path.basename(args.trace))
    elif args.cmd == 'scores':
        plot_scores(factor_files(args.with_), factor_files(args.without), args.out, 'from the given traces')
    elif args.cmd == 'scale-qk':
        scale_qk_checkpoint(args.model, args.factor, args.out, args.drop_qk_norm)
    else:
        lab(args)


if __name__ == '__main__':
    main()
