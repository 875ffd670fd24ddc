#!/usr/bin/env python3
"""Pictures of RMSNorm at work, drawn as SVG from `./run --norms-json` (cli/norm_trace.h).
Python 3 standard library only.

  python3 tools/plot_norms.py sites TRACE.jsonl --out-dir DIR
      DIR/norms-rms-in.svg and DIR/norms-scale.svg: rms(in) and the scale 1/sqrt(mean(x^2) + eps)
      at each call site across positions: the sites of one D-vector in a panel each, one line per
      layer; QK-Norm q and k in a panel per layer, the line the mean over the heads, the shaded
      band their range. DIR/norms-residual-rms.svg: the residual stream's rms at each point a norm
      reads it (the input of each pre-attention, pre-MLP and the final norm), one thin line per
      position and their median.

  python3 tools/plot_norms.py scores -o OUT.svg --with 1=A.jsonl 2=B.jsonl ... --without 1=C.jsonl ...
                                     [--model MODEL.bin]
      OUT.svg: the largest attention score |q.k|/sqrt(d) of each layer (over heads and
      positions) against the factor q and k were scaled by, with QK-Norm and without, beside a
      slope-2 line (score proportional to factor^2); with --model, also each layer's bound
      sqrt(d) * max|w_q| * max|w_k| (see qk-bound).

  python3 tools/plot_norms.py qk-bound MODEL.bin [--trace TRACE.jsonl]
      Prints each layer's bound on |q.k|/sqrt(d) after QK-Norm that holds whatever the input:
      sqrt(d) * max|w_q| * max|w_k|, from the checkpoint's q_norm and k_norm weights (f32 or
      bf16 checkpoints); with --trace, beside the largest score the trace recorded.

  python3 tools/plot_norms.py lab MODEL.bin --out-dir DIR [--run ./run] [-i PROMPT] [-n N]
      Everything above from one model: runs ./run --norms-json on the model and on copies of it
      whose q_proj and k_proj are multiplied by 1/2 ... 8, with QK-Norm and without it (a copy
      whose header has no FLAG_QK_NORM and no q_norm/k_norm tensors: the engine then skips
      QK-Norm, as for Qwen2), and draws the four pictures. f32 and bf16 checkpoints only (the
      factors are powers of two, so bf16 weights scale exactly). The scaled checkpoints and the
      JSON files go to a temporary folder, removed at the end; --keep DIR writes them to DIR and
      keeps them (about 90 MB for the shipped model).

The without-QK-Norm trace can also come from the engine itself, with the ablation switch:
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
ROW_SITES = ['pre-attention', 'pre-MLP', 'final norm']  # one D-vector per position
QK_SITES = ['QK-Norm q', 'QK-Norm k']                   # one vector per head
COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf',
          '#7f7f7f', '#bcbd22']
FONT = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif"'


def layer_color(layer):
    return COLORS[layer % len(COLORS)] if layer >= 0 else '#000000'


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


def residual_stream(lines):
    """The residual stream's rms wherever a norm reads it, in the order the model adds to it:
    [(what was just added, the norm that reads it, {position: rms})]: the input of layer l's
    pre-attention norm (the embedding for layer 0, else the stream after layer l-1's MLP), of its
    pre-MLP norm (after layer l's attention), and of the final norm (after the last MLP; only at
    the positions where it runs)."""
    acc = {}
    for o in lines:
        if o['site'] in ROW_SITES:
            acc.setdefault((o['site'], o['layer']), {})[o['position']] = o['rms_in']
    layers = sorted({layer for site, layer in acc if layer >= 0})
    out = []
    for layer in layers:
        if ('pre-attention', layer) in acc:
            out.append(('embedding' if layer == 0 else '+ MLP %d' % (layer - 1), 'pre-attention %d' % layer,
                        acc['pre-attention', layer]))
        if ('pre-MLP', layer) in acc:
            out.append(('+ attention %d' % layer, 'pre-MLP %d' % layer, acc['pre-MLP', layer]))
    if ('final norm', -1) in acc:
        out.append(('+ MLP %d' % layers[-1] if layers else 'stream', 'final norm', acc['final norm', -1]))
    return out


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


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
    """Powers of ten inside [lo, hi], with their 2 and 5 multiples when the range spans at most
    four decades (so that a log axis has ticks between the powers of ten)."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    mults = (1,) if b - a > 4 else (1, 2, 5)
    return [m * 10 ** e for e in range(a, b + 1) for m in mults if lo <= m * 10 ** e <= hi]


class Panel:
    """One plot area at (x, y) of size (w, h) inside an SVG, with its own axes. A log axis says
    so in its label. xticks: the values to mark on x; xlabels: {value: text} to write there
    instead of the number."""

    def __init__(self, svg, x, y, w, h, xrange, yrange, title, xlabel, ylabel, xlog=False, ylog=False,
                 xticks=None, xlabels=None, yticks=None):
        self.svg, self.x, self.y, self.w, self.h = svg, x, y, w, h
        self.xlog, self.ylog = xlog, ylog
        self.x0, self.x1 = self._t(xrange[0], xlog), self._t(xrange[1], xlog)
        self.y0, self.y1 = self._t(yrange[0], ylog), self._t(yrange[1], ylog)
        if self.x1 == self.x0:
            self.x1 += 1
        if self.y1 == self.y0:
            self.y1 += 1
        if xlog and 'log' not in xlabel:
            xlabel += ' (log scale)'
        if ylog and 'log' not in ylabel:
            ylabel += ' (log scale)'
        self._frame(title, xlabel, ylabel, xrange, yrange, xticks, xlabels, yticks)

    @staticmethod
    def _t(v, log):
        return math.log10(v) if log else v

    def px(self, v):
        return self.x + (self._t(v, self.xlog) - self.x0) / (self.x1 - self.x0) * self.w

    def py(self, v):
        return self.y + self.h - (self._t(v, self.ylog) - self.y0) / (self.y1 - self.y0) * self.h

    def _frame(self, title, xlabel, ylabel, xrange, yrange, xticks, xlabels, yticks):
        s = self.svg
        s.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="white" stroke="#444"/>'
                 % (self.x, self.y, self.w, self.h))
        xt = xticks or (log_ticks(*xrange) if self.xlog else linear_ticks(*xrange))
        yt = yticks or (log_ticks(*yrange) if self.ylog else linear_ticks(*yrange))
        for v in xt:
            X = self.px(v)
            s.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e4e4e4"/>' % (X, self.y, X, self.y + self.h))
            label = (xlabels or {}).get(v, fmt_tick(v))
            for k, part in enumerate(str(label).split('\n')):
                s.append('<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle" %s>%s</text>'
                         % (X, self.y + self.h + 14 + 13 * k, FONT, esc(part)))
        for v in yt:
            Y = self.py(v)
            s.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e4e4e4"/>' % (self.x, Y, self.x + self.w, Y))
            s.append('<text x="%.1f" y="%.1f" font-size="11" text-anchor="end" %s>%s</text>'
                     % (self.x - 5, Y + 4, FONT, esc(fmt_tick(v))))
        s.append('<text x="%.1f" y="%.1f" font-size="13" font-weight="bold" text-anchor="middle" %s>%s</text>'
                 % (self.x + self.w / 2, self.y - 8, FONT, esc(title)))
        lines_below = max(len(str(t).split('\n')) for t in (xlabels or {0: ''}).values())
        s.append('<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle" %s>%s</text>'
                 % (self.x + self.w / 2, self.y + self.h + 19 + 13 * lines_below, FONT, esc(xlabel)))
        cx, cy = self.x - 48, self.y + self.h / 2
        s.append('<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle" transform="rotate(-90 %.1f %.1f)" %s>%s</text>'
                 % (cx, cy, cx, cy, FONT, esc(ylabel)))

    def line(self, pts, color, dash=False, width=1.8, marker=False, dash_pattern='6,4', opacity=1.0):
        if not pts:
            return
        d = ' '.join('%.1f,%.1f' % (self.px(a), self.py(b)) for a, b in pts)
        self.svg.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="%.1f"%s%s/>'
                        % (d, color, width, ' stroke-dasharray="%s"' % dash_pattern if dash else '',
                           ' stroke-opacity="%.2f"' % opacity if opacity < 1 else ''))
        if marker:
            for a, b in pts:
                self.svg.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (self.px(a), self.py(b), color))

    def band(self, pts_lo, pts_hi, color, opacity=0.15):
        if not pts_lo:
            return
        path = [(self.px(a), self.py(b)) for a, b in pts_lo] + [(self.px(a), self.py(b)) for a, b in reversed(pts_hi)]
        self.svg.append('<polygon points="%s" fill="%s" fill-opacity="%.2f" stroke="none"/>'
                        % (' '.join('%.1f,%.1f' % p for p in path), color, opacity))

    def text(self, X, Y, label, color='#222222', anchor='start', size=11):
        """A label at pixel coordinates (X, Y)."""
        self.svg.append('<text x="%.1f" y="%.1f" font-size="%d" fill="%s" text-anchor="%s" stroke="white" '
                        'stroke-width="3" paint-order="stroke" %s>%s</text>' % (X, Y, size, color, anchor, FONT, esc(label)))


def spread(ys, gap):
    """Pixel heights ys moved apart as little as possible so that neighbours are gap apart (for
    labels at the end of lines); returns them in the given order."""
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    out = [ys[i] for i in order]
    for k in range(1, len(out)):
        out[k] = max(out[k], out[k - 1] + gap)
    shift = (sum(out) - sum(ys[i] for i in order)) / len(out)  # recentre on the true heights
    out = [v - shift for v in out]
    res = [0.0] * len(ys)
    for k, i in enumerate(order):
        res[i] = out[k]
    return res


def legend(svg, x, y, entries, title=None):
    """entries: (label, color, dashed) or (label, color, dash pattern)."""
    if title:
        svg.append('<text x="%.1f" y="%.1f" font-size="12" font-weight="bold" %s>%s</text>' % (x, y, FONT, esc(title)))
        y += 18
    for label, color, dash in entries:
        pattern = dash if isinstance(dash, str) else ('6,4' if dash else '')
        svg.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2.5"%s/>'
                   % (x, y - 4, x + 28, y - 4, color, ' stroke-dasharray="%s"' % pattern if pattern else ''))
        svg.append('<text x="%.1f" y="%.1f" font-size="12" %s>%s</text>' % (x + 36, y, FONT, esc(label)))
        y += 18
    return y


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


def value_range(values, log_if=20):
    """(lo, hi) padded for a panel, and whether to draw it on a log axis (when hi/lo > log_if)."""
    lo, hi = min(values), max(values)
    ylog = lo > 0 and hi / lo > log_if
    if ylog:
        return (lo / 1.2, hi * 1.2), True
    pad = 0.06 * (hi - lo) if hi > lo else 0.1 * abs(hi) or 1.0
    return (lo - pad, hi + pad), False


# ------------------------------------------------------------------------------------------------
# The pictures


PANEL_TITLES = {
    # without --dump-logits the engine runs the final norm only where logits are needed
    'final norm': 'final norm (where logits are computed)',
}


def plot_sites(lines, field, path, ylabel, title, note):
    """Top row: the sites of one D-vector, a panel each, a line per layer. Below: QK-Norm q and k,
    a panel per layer (the mean over the heads as a line, their range as a band), sharing one
    y axis of their own so that q and k and the layers compare."""
    series = site_series(lines, field)
    row_sites = [s for s in ROW_SITES if s in series]
    qk_sites = [s for s in QK_SITES if s in series]
    positions = [p for s in series for pts in series[s].values() for p, *_ in pts]
    if not series or not positions:
        sys.exit('plot_norms: no RMSNorm lines in the trace')
    xrange = (min(positions), max(max(positions), 1))
    layers = sorted({l for s in series for l in series[s] if l >= 0})
    body = []
    top = 80
    # top row
    pw, ph, gap = 300, 210, 95
    if row_sites:
        yrange, ylog = value_range([v for s in row_sites for pts in series[s].values()
                                    for _, m, lo, hi in pts for v in (lo, hi)])
        for i, site in enumerate(row_sites):
            panel = Panel(body, 80 + i * (pw + gap), top, pw, ph, xrange, yrange, PANEL_TITLES.get(site, site),
                          'position', ylabel, ylog=ylog)
            for layer, pts in sorted(series[site].items()):
                panel.line([(p, m) for p, m, _, _ in pts], layer_color(layer))
        entries = [('layer %d' % l, layer_color(l), False) for l in layers]
        if 'final norm' in series:
            entries.append(('after the last layer', '#000000', False))
        legend(body, 80 + len(row_sites) * (pw + gap) - 40, top + 10, entries, 'lines')
        top += ph + 105
    # QK-Norm: one panel per layer and site
    cols = min(len(layers), 4) or 1
    qw, qh, qgap = 215, 170, 80
    if qk_sites:
        body.append('<text x="80" y="%.1f" font-size="12" fill="#444" %s>%s</text>'
                    % (top - 38, FONT, esc('QK-Norm, a panel per layer: the line is the mean over the heads, the '
                                           'shaded band the smallest..largest head at each position')))
        top += 8
        yrange, ylog = value_range([v for s in qk_sites for pts in series[s].values()
                                    for _, m, lo, hi in pts for v in (lo, hi)])
        for site in qk_sites:
            for k, layer in enumerate(l for l in layers if l in series[site]):
                X = 80 + (k % cols) * (qw + qgap)
                Y = top + (k // cols) * (qh + 85)
                panel = Panel(body, X, Y, qw, qh, xrange, yrange, '%s, layer %d' % (site, layer), 'position',
                              ylabel if k % cols == 0 else '', ylog=ylog)
                pts = series[site][layer]
                color = layer_color(layer)
                panel.band([(p, a) for p, _, a, _ in pts], [(p, b) for p, _, _, b in pts], color, opacity=0.25)
                panel.line([(p, m) for p, m, _, _ in pts], color, width=1.5)
            rows = (len([l for l in layers if l in series[site]]) + cols - 1) // cols
            top += rows * (qh + 85)
    width = max(80 + len(row_sites) * (pw + gap) + 150, 80 + cols * (qw + qgap))
    write_svg(path, width, top, body, title, note)


def plot_residual(lines, path, note):
    """The residual stream's rms at each point a norm reads it (residual_stream): a thin line per
    position, the median over positions bold, on a log axis."""
    stream = residual_stream(lines)
    if not stream:
        sys.exit('plot_norms: no pre-attention, pre-MLP or final-norm lines in the trace')
    positions = sorted({p for *_, by_pos in stream for p in by_pos})
    values = [v for *_, by_pos in stream for v in by_pos.values()]
    yrange = (min(values) / 1.3, max(values) * 1.3)
    ylog = yrange[1] / yrange[0] > 5
    xs = list(range(len(stream)))
    xlabels = {i: '%s\n%s' % (added, reader) for i, (added, reader, _) in enumerate(stream)}
    body = []
    pw, ph = 150 + 80 * len(stream), 400
    panel = Panel(body, 90, 80, pw, ph, (-0.4, len(stream) - 0.6), yrange, 'rms of the residual stream x',
                  'top: what the stream holds by then; below: the norm that reads it there',
                  'rms(x)', ylog=ylog, xticks=xs, xlabels=xlabels)
    for p in positions:
        pts = [(i, by_pos[p]) for i, (_, _, by_pos) in enumerate(stream) if p in by_pos]
        panel.line(pts, '#1f77b4', width=1.0, opacity=0.35)
    med = [(i, median(list(by_pos.values()))) for i, (_, _, by_pos) in enumerate(stream)]
    panel.line(med, '#000000', width=2.5, marker=True)
    for i, m in med:
        panel.text(panel.px(i) + 7, panel.py(m) - 8, '%.3g' % m, size=12)
    legend(body, 90 + pw + 25, 100, [('one position', '#1f77b4', False), ('median over positions', '#000000', False)])
    final = [len(by_pos) for _, reader, by_pos in stream if reader == 'final norm']
    if final:
        body.append('<text x="%.1f" y="%.1f" font-size="11" fill="#444" %s>%s</text>'
                    % (90 + pw + 25, 150, FONT, esc('final norm: only the %d positions' % final[0])))
        body.append('<text x="%.1f" y="%.1f" font-size="11" fill="#444" %s>%s</text>'
                    % (90 + pw + 25, 164, FONT, esc('where logits are computed')))
    write_svg(path, 90 + pw + 250, 80 + ph + 85, body,
              'The residual stream grows as each block adds to it; each norm divides its size away', note)


def plot_scores(with_runs, without_runs, path, note, bounds=None):
    """with_runs, without_runs: {factor: trace lines}. bounds: None, or {layer: (max|w_q|,
    max|w_k|, bound)} (qk_bounds). Left: every curve on log-log axes with a slope-2 line. Right:
    the with-QK-Norm curves alone on a linear axis, beside each layer's bound."""
    curves = {}
    for label, runs in (('with QK-Norm', with_runs), ('without QK-Norm', without_runs)):
        for factor, lines in runs.items():
            for layer, best in max_score_per_layer(lines).items():
                curves.setdefault((label, layer), []).append((factor, best))
    if not curves:
        sys.exit('plot_norms: no attention lines in the traces (were they written by --norms-json?)')
    bounds = bounds or {}
    factors = sorted({f for pts in curves.values() for f, _ in pts})
    values = [v for pts in curves.values() for _, v in pts] + [b for _, _, b in bounds.values()]
    layers = sorted({layer for _, layer in curves})
    body = []
    pw, ph = 470, 400
    xr = (factors[0] / 1.15, factors[-1] * 1.15) if len(factors) > 1 else (factors[0] / 2, factors[0] * 2)
    panel = Panel(body, 90, 80, pw, ph, xr, (min(values) / 1.5, max(values) * 1.5),
                  'largest |q.k|/sqrt(d) per layer', 'factor on q_proj and k_proj',
                  'largest attention score', xlog=True, ylog=True, xticks=factors)
    if bounds:
        lo, hi = min(b for _, _, b in bounds.values()), max(b for _, _, b in bounds.values())
        panel.band([(xr[0], lo), (xr[1], lo)], [(xr[0], hi), (xr[1], hi)], '#555555', opacity=0.18)
    without = [pts for (label, _), pts in curves.items() if label.startswith('without')]
    if without:  # a third of the smallest without-QK-Norm score at the largest factor: below the curves
        top = [v for pts in without for f, v in pts if f == factors[-1]]
        if top:
            anchor = min(top) / 3
            x_lo = max(xr[0], factors[-1] * math.sqrt(min(values) / 1.4 / anchor))
            panel.line([(f, anchor * (f / factors[-1]) ** 2) for f in (x_lo, xr[1])], '#777777',
                       dash=True, dash_pattern='9,3,2,3', width=1.6)
            X, Y = panel.px(factors[-1]), panel.py(anchor)
            panel.text(X - 4, Y + 18, 'slope 2', color='#555555', anchor='end')
    for (label, layer), pts in sorted(curves.items()):
        panel.line(sorted(pts), layer_color(layer), dash=label.startswith('without'), marker=True)
    # right: with QK-Norm, linear axis, with the bounds
    withs = {layer: sorted(pts) for (label, layer), pts in curves.items() if label == 'with QK-Norm'}
    X2 = 90 + pw + 110
    if withs:
        vals = [v for pts in withs.values() for _, v in pts] + [b for _, _, b in bounds.values()]
        lo, hi = math.floor(min(vals) - 0.5), math.ceil(max(vals) + 0.5)
        right = Panel(body, X2, 80, 330, ph, xr, (lo, hi), 'with QK-Norm, on a linear axis',
                      'factor on q_proj and k_proj', 'largest attention score', xlog=True, xticks=factors,
                      yticks=linear_ticks(lo, hi, 8))
        labels = []
        for layer, pts in sorted(withs.items()):
            right.line(pts, layer_color(layer), marker=True)
            labels.append((right.py(pts[-1][1]), '%.2f' % pts[-1][1], layer_color(layer)))
            if layer in bounds:
                b = bounds[layer][2]
                right.line([(xr[0], b), (xr[1], b)], layer_color(layer), dash=True, dash_pattern='2,3', width=1.6)
                labels.append((right.py(b), 'bound %.2f' % b, layer_color(layer)))
        ys = spread([y for y, _, _ in labels], 13)
        for y, (_, text, color) in zip(ys, labels):
            right.text(right.x + right.w + 6, y + 4, text, color=color)
    entries = [('layer %d' % l, layer_color(l), False) for l in layers]
    lx = X2 + 330 + 90 if withs else 90 + pw + 30
    y = legend(body, lx, 100, entries, 'colour: layer')
    line_entries = [('with QK-Norm', '#333333', False), ('without QK-Norm', '#333333', True),
                    ('slope 2: score ~ factor^2', '#777777', '9,3,2,3')]
    if bounds:
        line_entries.append(('bound sqrt(d)*max|w_q|*max|w_k|', '#333333', '2,3'))
    y = legend(body, lx, y + 20, line_entries, 'line')
    if bounds:
        body.append('<rect x="%.1f" y="%.1f" width="28" height="12" fill="#555555" fill-opacity="0.18"/>' % (lx, y - 10))
        body.append('<text x="%.1f" y="%.1f" font-size="12" %s>%s</text>'
                    % (lx + 36, y, FONT, esc('the bounds\' range (left)')))
    write_svg(path, lx + 250, 80 + ph + 70, body,
              'Attention scores as q and k grow: QK-Norm holds them below a bound set by its weights', note)


# ------------------------------------------------------------------------------------------------
# Checkpoints (model.h's layout): reading tensors, and copies with q_proj and k_proj scaled, with
# or without QK-Norm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
import export  # noqa: E402  (the checkpoint's header and its table of tensors, export.TENSORS)

HEADER = struct.Struct(export.HEADER_FORMAT)
W_OFFSET, W_BYTES = 33, 34  # weights_offset and weights_bytes in HEADER's tuple (after the tokenizer's two)
FLAG_QK_NORM, FLAG_MOE, ALIGN = export.FLAG_QK_NORM, export.FLAG_MOE, export.ALIGN


def checkpoint_plan(h):
    """The tensors of a checkpoint whose header fields are h, in file order, from export.py's
    table: [(name, layer, kind, bytes)], name as model.c's TENSORS has it, kind 'm' (a matrix, of
    weight_type) or 'v' (an f32 vector); layer -1 for the embedding, the final norm and lm_head."""
    (magic, version, arch, flags, D, F, L, H, K, d, V, max_seq, wtype, gs) = h[:14]
    if magic != b'QW3C':
        raise ValueError('not a checkpoint of this engine')
    if wtype not in (0, 1):
        raise ValueError('only f32 and bf16 checkpoints can be read here (export one with --dtype bf16)')
    if flags & FLAG_MOE:  # its layers hold a router and experts in place of the MLP
        raise ValueError('a Qwen3-MoE checkpoint: only dense ones can be read here')
    c = {'dim': D, 'hidden_dim': F, 'n_layers': L, 'n_heads': H, 'n_kv_heads': K, 'head_dim': d,
         'vocab_size': V, 'flags': flags}
    engine_name = {t[1]: t[0] for t in export.TENSORS}  # the Hugging Face name (in a layer) -> model.c's
    plan = []
    for hf_name, shape, is_matrix in export.tensor_plan(c):
        parts = hf_name.split('.', 3)  # model.layers.L.rest
        layer, rest = (int(parts[2]), parts[3]) if parts[1] == 'layers' else (-1, hf_name)
        n = shape[0] * (shape[1] if len(shape) > 1 else 1)
        plan.append((engine_name[rest], layer, 'm' if is_matrix else 'v', n * (2 if is_matrix and wtype else 4)))
    return plan


def read_checkpoint(path):
    """(header fields, {(name, layer): list of floats}) of an f32 or bf16 checkpoint: every tensor
    as a flat list (a matrix row by row)."""
    with open(path, 'rb') as f:
        data = f.read()
    h = HEADER.unpack_from(data, 0)
    try:
        plan = checkpoint_plan(h)
    except ValueError as e:
        sys.exit('plot_norms: %s: %s' % (path, e))
    tensors = {}
    pos = h[W_OFFSET]
    for name, layer, kind, size in plan:
        pos = (pos + ALIGN - 1) // ALIGN * ALIGN
        blob = data[pos:pos + size]
        pos += size
        if kind == 'v' or h[12] == 0:
            tensors[name, layer] = list(struct.unpack('<%df' % (size // 4), blob))
        else:  # bf16: the top half of a float32
            n = size // 2
            tensors[name, layer] = list(struct.unpack('<%df' % n, b''.join(b'\0\0' + blob[2 * i:2 * i + 2]
                                                                          for i in range(n))))
    return h, tensors


def qk_bounds(path):
    """layer -> (max|w_q|, max|w_k|, sqrt(d) * max|w_q| * max|w_k|) from the checkpoint's QK-Norm
    weights: after QK-Norm each head has length at most sqrt(d) * max|w| (RoPE keeps lengths), so
    by Cauchy-Schwarz |q.k|/sqrt(d) stays below the third number whatever the input and whatever
    q_proj and k_proj are (docs/rmsnorm.md, Exercise 8). {} for a model without QK-Norm."""
    h, tensors = read_checkpoint(path)
    d = h[9]
    out = {}
    for l in range(h[6]):
        if ('q_norm', l) in tensors:
            a, b = max(map(abs, tensors['q_norm', l])), max(map(abs, tensors['k_norm', l]))
            out[l] = (a, b, math.sqrt(d) * a * b)
    return out


def scale_qk_checkpoint(src, factor, dst, drop_qk_norm=False):
    """Writes a copy of checkpoint src to dst with q_proj and k_proj multiplied by factor (a power
    of two), and without QK-Norm when drop_qk_norm."""
    with open(src, 'rb') as f:
        data = f.read()
    h = list(HEADER.unpack_from(data, 0))
    if h[0] != b'QW3C':
        sys.exit('plot_norms: %s is not a checkpoint of this engine' % src)
    if math.frexp(factor)[0] != 0.5:
        sys.exit('plot_norms: the factor must be a power of two, got %g' % factor)
    try:
        plan = checkpoint_plan(h)
    except ValueError as e:
        sys.exit('plot_norms: %s: %s' % (src, e))
    flags, wtype, w_off = h[3], h[12], h[W_OFFSET]
    out = bytearray(data[:w_off])
    pos = w_off
    for name, _, _, size in plan:
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
    h[W_BYTES] = len(out) - w_off
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


def print_qk_bounds(model, trace=None):
    bounds = qk_bounds(model)
    if not bounds:
        sys.exit('plot_norms: %s has no QK-Norm weights' % model)
    best = max_score_per_layer(read_trace(trace)) if trace else {}
    d = read_checkpoint(model)[0][9]
    print('bound on |q.k|/sqrt(d) after QK-Norm = sqrt(d) * max|w_q| * max|w_k|, d = %d' % d)
    print('layer  max|w_q|  max|w_k|  bound' + ('  largest score  score/bound' if best else ''))
    for layer, (a, b, bound) in sorted(bounds.items()):
        row = '%5d  %8.4f  %8.4f  %5.2f' % (layer, a, b, bound)
        if layer in best:
            row += '  %13.2f  %11.3f' % (best[layer], best[layer] / bound)
        print(row)


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
        plot_scores(runs[True], runs[False], os.path.join(args.out_dir, 'norms-qk-scores.svg'), note,
                    qk_bounds(args.model))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def shorten(text, n=48):
    return text if len(text) <= n else text[:n - 3] + '...'


def sites_pictures(lines, out_dir, note):
    plot_sites(lines, 'rms_in', os.path.join(out_dir, 'norms-rms-in.svg'), 'rms(in)',
               'What goes into each RMSNorm: rms(x)', note)
    plot_sites(lines, 'scale', os.path.join(out_dir, 'norms-scale.svg'), 'scale',
               'What each RMSNorm multiplies it by: scale = 1/sqrt(mean(x^2) + eps)', note)
    plot_residual(lines, os.path.join(out_dir, 'norms-residual-rms.svg'), note)


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
    p = sub.add_parser('sites', help='rms(in) and scale per call site and layer across positions, and the '
                       'residual stream across layers')
    p.add_argument('trace')
    p.add_argument('--out-dir', default='.')
    p = sub.add_parser('scores', help='largest attention score per layer, with and without QK-Norm')
    p.add_argument('-o', '--out', required=True)
    p.add_argument('--with', dest='with_', nargs='+', metavar='FACTOR=FILE', required=True)
    p.add_argument('--without', nargs='+', metavar='FACTOR=FILE', default=[])
    p.add_argument('--model', help='the checkpoint the traces came from: draw its QK-Norm bounds')
    p = sub.add_parser('qk-bound', help="each layer's input-independent bound on the attention score after QK-Norm")
    p.add_argument('model')
    p.add_argument('--trace', help='a --norms-json trace of the model: its largest score per layer beside the bound')
    p = sub.add_parser('scale-qk', help='a checkpoint copy with q_proj and k_proj times a power of two')
    p.add_argument('model')
    p.add_argument('factor', type=float)
    p.add_argument('out')
    p.add_argument('--drop-qk-norm', action='store_true', help='also without QK-Norm')
    p = sub.add_parser('lab', help='all the runs and all four pictures from one model')
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
        plot_scores(factor_files(args.with_), factor_files(args.without), args.out, 'from the given traces',
                    qk_bounds(args.model) if args.model else None)
    elif args.cmd == 'qk-bound':
        print_qk_bounds(args.model, args.trace)
    elif args.cmd == 'scale-qk':
        scale_qk_checkpoint(args.model, args.factor, args.out, args.drop_qk_norm)
    else:
        lab(args)


if __name__ == '__main__':
    main()
