#!/usr/bin/env python3
"""compare.py: this engine beside llama.cpp on the same machine, in alternating rounds, and the
side-by-side table of prefill and decode tok/s (docs/speed.md#beside-llamacpp).

    tools/llama_cpp/build.sh native                # llama.cpp and lbench, once
    python3 tools/llama_cpp/compare.py             # 2 rounds of q8 q4 bf16 f32, 1 and 2 threads
    python3 tools/llama_cpp/compare.py --table build/bench/compare.log   # the table again
    python3 tools/llama_cpp/compare.py --depth 2048 --engine-args="--kv-cache f16"
                                                   # both start with 2048 positions cached
    python3 tools/llama_cpp/compare.py --llama-bench LLAMA_BENCH --depth 4096 \
        --llama-args="-fa on -ctk q8_0 -ctv q8_0" --engine-args="--kv-cache q8"
                                                   # both with q8 caches
    python3 tools/llama_cpp/compare.py --size 1.7b --formats q8,q4 --llama-bench LLAMA_CPP/build/bin/llama-bench
                                                   # another size, against upstream's own llama-bench

Per round and format: both files dropped from the page cache and read back by tools/page_read.c
(unless --keep-pages; see fresh_pages), which also prints how fast each file's pages stream (one
thread; under the table), llama.cpp's `lbench GGUF T PROMPT GEN REPS`
for each thread count T, then
`./run MODEL -m bench --threads 1,2 ... --json`, one after the other, so both meet the machine of
the same minutes; a shared machine changes speed from minute to minute, so the table keeps each
round's figures apart instead of pooling them. Each program's figure is the median of its reps
(llama-bench's samples_ts, lbench's list of reps; the mean where a log has no reps), so that a slow
rep moves neither side; the ratio is this engine / llama.cpp in that round;
the roof is this engine's paired memory read (bench.c), "own read" the same against a streaming
read of its checkpoint's own pages, "compute" prefill against the compute roof (older logs may
have neither). A ratio marked with a dagger is from a round in which the engine's test had less
than 90% of its cores (its cpu_share): another process took one, and llama.cpp's run beside it
likely shared the machine too.

--llama-bench PATH runs upstream llama.cpp's own `llama-bench -m GGUF -t T -p PROMPT -n GEN -r REPS
-o jsonl ... --progress` instead of lbench (the median of its samples_ts; --progress shows on the
terminal when its untimed depth fill ends and the timed runs begin), for a build of an upstream checkout
(tools/llama_cpp/build_upstream.sh). --size picks the model shape (0.6b, 1.7b, 4b, 8b, 14b,
30b-a3b), --layers N cuts it to N layers (30b-a3b's two q8 files fit in 24 GB of page cache at 12).

The models are the random Qwen3 shape of --size (default 0.6b) under --dir (default build/bench, shared with `make
bench`): the Hugging Face folder and this engine's checkpoints from tools/bench_models.py (as
`make bench` writes them), llama.cpp's GGUF files from tools/make_random_gguf.py, each written
only when missing (a checkpoint also when this engine cannot read it, e.g. an older layout); a
format too large for this machine's memory or disk is skipped with the reason, and with every
format skipped nothing runs (a non-zero exit). Everything the two programs print goes to the log (--log, default DIR/compare.log) as it comes,
between '== round R FORMAT llama T' and '== round R FORMAT engine' lines; the table is made from
the log, so a run cut short still leaves what it measured. Python 3 standard library.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_models  # noqa: E402  (the checkpoints, as `make bench` writes them)
from make_random_gguf import drop_from_page_cache  # noqa: E402
GGUF_TYPE = {"q8": "q8_0", "q4": "q4_0", "bf16": "bf16", "f32": "f32"}
LBENCH_LINE = re.compile(r"^(pp|tg)(\d+)( @ d\d+)? (\d+) t:\s+([\d.]+) ±\s+([\d.]+) tok/s(?:\s+\[([\d., ]*)\])?")
MARK = re.compile(r"^== round (\d+) (\S+) (llama|engine|pages|fresh)")
PAGES_LINE = re.compile(r"^(\S+): [\d.]+ MB, ([\d.]+) GB/s")
PAGE_READ = os.path.join(ROOT, "build", "page_read")


def page_read_tool():
    """tools/page_read.c built into build/page_read (each run, it is small); None, with a note,
    where no C compiler builds it: the rounds then have no page reads and no fresh_pages."""
    cmd = [os.environ.get("CC", "cc"), "-std=gnu11", "-O2", "-march=native", "-o", PAGE_READ,
           os.path.join(ROOT, "tools", "page_read.c")]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        err = None if p.returncode == 0 else p.stderr.strip()[-300:]
    except OSError as e:
        err = str(e)
    if err is not None:
        print(f"compare.py: note: cannot build {PAGE_READ} ({err}); no page reads in this run "
              "(and no drop of the files' pages, which page_read would read back)", file=sys.stderr)
        return None
    return PAGE_READ


def fresh_pages(paths):
    """Drops each file from the page cache, so that page_read, which runs next, reads it back
    (mapped at a 2 MB boundary with MADV_HUGEPAGE: 2 MB folios) and both programs start the round
    from pages of the same kind and age. Left alone, the two files' cached pages differ in ways
    that move decode by more than the engines do (a GGUF cached for hours can sit half in small
    pages and stream measurably slower than after a drop and read back; docs/design.md#bench-roof); both engines map
    their file as the cache holds it and never change the cache themselves."""
    for path in paths:
        drop_from_page_cache(path)


def fail(msg):
    sys.exit(f"compare.py: {msg}")


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def prepare(a, formats):
    """The files the rounds read, written where missing; returns {format: (checkpoint, gguf)}."""
    ckpts = bench_models.ensure(a.dir, formats, a.run, "compare.py", a.size, a.layers)
    if not ckpts:
        fail(f"nothing to compare: {', '.join(formats)} skipped (the reasons above)")
    hf = bench_models.hf_folder(a.dir, a.size, a.layers)
    cut = [] if a.layers is None else ["--layers", str(a.layers)]
    files = {}
    for f in [f for f in formats if f in ckpts]:
        gguf = os.path.join(a.dir, f"qwen3-{bench_models.shape_name(a.size, a.layers)}-{GGUF_TYPE[f]}.gguf")
        if not os.path.exists(gguf) and not os.path.exists(os.path.join(hf, "config.json")):
            bench_models.step([sys.executable, "tools/make_random_qwen3.py", hf, "--size", a.size, "--config-only"]
                              + cut, f"writing {hf}/config.json", "compare.py")
        if not os.path.exists(gguf):
            bench_models.step([sys.executable, "tools/make_random_gguf.py", hf, gguf, "--type", GGUF_TYPE[f]],
                              f"writing {gguf}", "compare.py")
        files[f] = (ckpts[f], gguf)
    return files


def run_showing_progress(cmd, out):
    """Runs cmd with its standard output into the log (out) and its standard error shown on this
    terminal as it comes: there llama-bench's --progress says when its untimed depth fill (an hour
    at depth 32,768 with one thread) ends and the timed runs begin. Returns the exit status and the
    standard error's text, for the message when it fails."""
    err = []
    with subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.PIPE, text=True) as p:
        for line in p.stderr:
            err.append(line)
            print(f"  {line.rstrip()}", file=sys.stderr, flush=True)
    out.flush()
    return p.returncode, "".join(err)


def measure(a, formats, threads, log):
    files = prepare(a, formats)
    formats = [f for f in formats if f in files]
    page_read = page_read_tool()
    with open(log, "w") as out:
        for r in range(1, a.rounds + 1):
            for f in formats:
                ckpt, gguf = files[f]
                # both files read back afresh (fresh_pages), and how fast each program's file
                # streams from its own pages, just before both run
                if page_read and not a.keep_pages:
                    fresh_pages([gguf, ckpt])
                    out.write(f"== round {r} {f} fresh pages: both files dropped from the page cache\n")
                runs = [("pages", [page_read, gguf, ckpt])] if page_read else []
                if a.llama_bench:
                    runs += [(f"llama {t}", [a.llama_bench, "-m", gguf, "-t", str(t), "-p", str(a.prompt), "-n",
                                             str(a.gen), "-r", str(a.reps), "-o", "jsonl"]
                              + (["-d", str(a.depth)] if a.depth else []) + a.llama_args.split() + ["--progress"])
                             for t in threads]
                else:
                    runs += [(f"llama {t}", [a.lbench, gguf, str(t), str(a.prompt), str(a.gen), str(a.reps)]
                             + ([str(a.depth)] if a.depth else [])) for t in threads]
                runs.append(("engine", [a.run, ckpt, "-m", "bench", "--threads", ",".join(map(str, threads)),
                                        "--bench-prompt", str(a.prompt), "--bench-gen", str(a.gen),
                                        "--bench-reps", str(a.reps), "--json"]
                             + (["--bench-depth", str(a.depth), "-c", str(a.depth + max(a.prompt, a.gen))]
                                if a.depth else [])
                             + a.engine_args.split()))
                for who, cmd in runs:
                    print(f"compare.py: round {r}/{a.rounds}, {f}, {who} ({time.strftime('%H:%M:%S')})",
                          file=sys.stderr, flush=True)
                    out.write(f"== round {r} {f} {who} {time.strftime('%H:%M:%S')}\n")
                    out.flush()
                    rc, err = run_showing_progress(cmd, out)
                    if rc != 0 and who == "pages":  # a note; the tok/s are what counts
                        print(f"compare.py: note: {err.strip()[-300:]}", file=sys.stderr)
                    elif rc != 0:
                        fail(f"{' '.join(cmd)} exited {rc} (what was measured before: {log}):\n{err[-2000:]}")
        out.write(f"== end {time.strftime('%H:%M:%S')}\n")


def read_log(path):
    """{(format, test, threads): {round: {"llama": tok/s, "engine": tok/s, "roof": % or None,
    "own": % or None}}}, and under the key ("pages", format) {round: (GGUF GB/s, checkpoint GB/s)}
    from tools/page_read.c's lines; under ("fresh", format) the rounds whose files were read back
    afresh (fresh_pages)."""
    rows, cur = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = MARK.match(line)
            if m and m[3] == "fresh":
                rows.setdefault(("fresh", m[2]), set()).add(int(m[1]))
            if m:
                cur = (int(m[1]), m[2], m[3])
                continue
            if cur is None:
                continue
            r, fmt, who = cur
            m = PAGES_LINE.match(line)
            if m and who == "pages":
                got = rows.setdefault(("pages", fmt), {}).setdefault(r, [])
                got.append(float(m[2]))  # the GGUF first, then the checkpoint (measure's order)
                continue
            m = LBENCH_LINE.match(line)
            if m and who == "llama":
                cell = rows.setdefault((fmt, m[1] + m[2] + (m[3] or ""), int(m[4])), {}).setdefault(r, {})
                reps = [float(x) for x in (m[7] or "").split(",") if x.strip()]
                cell["llama"] = median(reps) if reps else float(m[5])
            elif line.startswith("{") and who == "llama":  # upstream llama-bench -o jsonl
                j = json.loads(line)
                test = (f"pp{j['n_prompt']}" if j["n_gen"] == 0 else f"tg{j['n_gen']}") + \
                    (f" @ d{j['n_depth']}" if j.get("n_depth") else "")
                cell = rows.setdefault((fmt, test, j["n_threads"]), {}).setdefault(r, {})
                cell["llama"] = median(j["samples_ts"]) if j.get("samples_ts") else j["avg_ts"]
                if "type_k" in j:
                    rows.setdefault(("cache", "llama.cpp"), set()).add(f"{j['type_k']}/{j.get('type_v', '?')}")
            elif line.startswith("{") and who == "engine":
                j = json.loads(line)
                test = j["test"] + (f" @ d{j['depth']}" if j.get("depth") else "")
                cell = rows.setdefault((fmt, test, j["threads"]), {}).setdefault(r, {})
                cell["engine"] = j["tokens_per_s"]
                if j.get("kv_cache"):
                    rows.setdefault(("cache", "this engine"), set()).add(j["kv_cache"])
                cell["roof"] = j.get("roof_pct")
                cell["own"] = j.get("roof_pct_weights")
                cell["compute"] = j.get("compute_roof_pct")
                cell["share"] = j.get("cpu_share")
    return rows


# Below this CPU share (CPU time / (wall time x threads)) the engine's test did not have its cores
# (cli/bench.c's SHARE_LOW, which notes it): another process took them, and llama.cpp's run of that
# round, minutes beside it, likely met the same; or the model was too small to keep them busy.
BUSY_SHARE = 0.9


def unpaired(rows, formats, threads):
    """The (format, threads) asked for that no test of the log has from both programs, in order."""
    paired = {(k[0], k[2]) for k in rows if k[0] not in ("pages", "fresh", "cache")
              and any({"llama", "engine"} <= set(c) for c in rows[k].values())}
    return [(f, t) for f in formats for t in threads if (f, t) not in paired]


def table(rows, formats=None):
    """The markdown table: a row per format, thread count and test, each cell its rounds'
    figures joined by ' / ' (a ratio marked where the engine's test had less than BUSY_SHARE of
    its cores); then the lowest ratio of each test, the marked ones left out where others remain."""
    order = {f: i for i, f in enumerate(formats or ["q8", "q4", "bf16", "f32"])}
    lines = ["| weights | threads | test | llama.cpp tok/s | this engine tok/s | ratio | % of roof | % of own read "
             "| % of compute |", "|---|---|---|---|---|---|---|---|---|"]
    lowest = {}
    pages = {k[1]: rows[k] for k in rows if k[0] == "pages"}
    fresh = {k[1]: rows[k] for k in rows if k[0] == "fresh"}
    caches = {k[1]: rows[k] for k in rows if k[0] == "cache"}
    for key in sorted((k for k in rows if k[0] not in ("pages", "fresh", "cache")),
                      key=lambda k: (order.get(k[0], len(order)), k[0], k[2], k[1])):
        fmt, test, t = key
        rounds = [rows[key][r] for r in sorted(rows[key]) if {"llama", "engine"} <= set(rows[key][r])]
        if not rounds:
            continue
        ratios = [c["engine"] / c["llama"] for c in rounds]
        busy = [c.get("share") is not None and c["share"] < BUSY_SHARE for c in rounds]
        kind = test[:2]
        lowest.setdefault(kind, []).extend(zip(ratios, busy))
        roof, own, compute = (" / ".join("-" if c.get(k) is None else f"{c[k]:.0f}%" for c in rounds)
                              for k in ("roof", "own", "compute"))
        llama = " / ".join(f"{c['llama']:.1f}" for c in rounds)
        engine = " / ".join(f"{c['engine']:.1f}" for c in rounds)
        ratio = " / ".join(f"{x:.2f}" + ("†" if b else "") for x, b in zip(ratios, busy))
        lines.append(f"| {fmt} | {t} | {test} | {llama} | {engine} | {ratio} | {roof} | {own} | {compute} |")
    if lowest:
        lines.append("")
    if any(b for pairs in lowest.values() for _, b in pairs):
        lines.append(f"† the engine's CPU share was below {BUSY_SHARE:.0%} (another process took a core): "
                     "llama.cpp's run of that round likely shared it too, so the ratio says little")
    for kind, name in (("pp", "prefill"), ("tg", "decode")):
        if kind in lowest:
            calm = [x for x, b in lowest[kind] if not b]
            low = min(calm or [x for x, _ in lowest[kind]])
            lines.append(f"lowest {name} ratio (this engine / llama.cpp): {low:.2f}"
                         + ("" if calm else "†") + (" († rounds left out)" if calm and len(calm) < len(lowest[kind]) else ""))
    if caches:
        lines.append("KV cache: " + "; ".join(f"{who} {', '.join(sorted(caches[who]))}" for who in
                                              ("this engine", "llama.cpp") if who in caches))
    cells = {f: [f"{v[0]:.1f} / {v[1]:.1f}" + ("*" if r in fresh.get(f, ()) else "")
                 for r, v in sorted(pages[f].items()) if len(v) == 2] for f in pages}
    shown = [f for f in sorted(pages, key=lambda f: order.get(f, len(order)))
             if cells[f] and (formats is None or f in formats)]
    if shown:
        # the memory behind each file (tools/page_read.c, one thread): on a VM it can differ
        lines.append("")
        lines.append("each file's pages, one thread's streaming read, GB/s per round (llama.cpp's GGUF / "
                     "this engine's checkpoint):")
        for f in shown:
            lines.append(f"  {f}: " + ", ".join(cells[f]))
        if any(c.endswith("*") for f in shown for c in cells[f]):
            lines.append("  (* both files dropped from the page cache and read back just before)")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lbench", default=os.path.join(ROOT, "build", "llama_cpp", "native", "lbench"),
                    help="llama.cpp's bench harness (tools/llama_cpp/build.sh); default %(default)s")
    ap.add_argument("--llama-bench", help="upstream llama.cpp's llama-bench, used instead of --lbench")
    ap.add_argument("--size", default="0.6b", choices=sorted(bench_models.SIZES),
                    help="the model shape; default %(default)s")
    ap.add_argument("--layers", type=int, help="the shape with fewer layers (smaller files; both "
                    "programs' files of a format have to fit in the page cache together)")
    ap.add_argument("--run", default=os.path.join(ROOT, "run"), help="this engine; default ./run")
    ap.add_argument("--dir", default=os.path.join(ROOT, "build", "bench"),
                    help="where the models are (written when missing); default build/bench")
    ap.add_argument("--formats", default="q8,q4,bf16,f32", help="default %(default)s")
    ap.add_argument("--threads", default="1,2", help="default %(default)s")
    ap.add_argument("--rounds", type=int, default=2, help="default %(default)s")
    ap.add_argument("--prompt", type=int, default=512, help="prefill tokens; default %(default)s")
    ap.add_argument("--gen", type=int, default=128, help="decode tokens; default %(default)s")
    ap.add_argument("--reps", type=int, default=3, help="reps per test; default %(default)s")
    ap.add_argument("--depth", type=int, default=0,
                    help="positions in the KV cache before each test (llama-bench -d); default 0")
    ap.add_argument("--engine-args", default="",
                    help="more options for this engine's bench, e.g. --engine-args='--kv-cache f16' "
                         "(llama.cpp's cache is f16 by default)")
    ap.add_argument("--llama-args", default="",
                    help="more options for llama-bench (with --llama-bench), e.g. --llama-args='-fa on -ctk q8_0 "
                         "-ctv q8_0' beside --engine-args='--kv-cache q8'")
    ap.add_argument("--keep-pages", action="store_true",
                    help="leave both files' page cache as it is (default: drop both before each format "
                         "in each round and read them back, so both programs start from fresh pages)")
    ap.add_argument("--log", help="the raw output; default DIR/compare.log")
    ap.add_argument("--table", metavar="LOG", help="only print the table of an earlier run's log")
    a = ap.parse_args()

    formats = list(dict.fromkeys(f for f in a.formats.split(",") if f))  # each once, in order
    if not formats:
        fail(f"--formats {a.formats!r}: no format (give some of {', '.join(GGUF_TYPE)})")
    bad = [f for f in formats if f not in GGUF_TYPE]
    if bad:
        fail(f"unknown format {bad[0]!r} (the formats are {', '.join(GGUF_TYPE)})")
    if a.table:
        if not os.path.exists(a.table):
            fail(f"{a.table}: no such log")
        rows = read_log(a.table)
        counts = sorted({k[2] for k in rows if k[0] in GGUF_TYPE})
        if len(unpaired(rows, formats, counts)) == len(formats) * len(counts):  # nothing paired
            fail(f"{a.table}: no result of both programs for {', '.join(formats)} (not a compare.py log?)")
        print(table(rows, formats))
        return
    try:
        threads = list(dict.fromkeys(int(t) for t in a.threads.split(",")))
    except ValueError:
        fail(f"--threads {a.threads!r}: a list of thread counts such as 1,2")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if threads and max(threads) > cpus:
        fail(f"--threads {max(threads)}: this process may use {cpus} CPU{'s' if cpus > 1 else ''} (this engine "
             "would run fewer threads than llama.cpp)")
    if a.rounds < 1 or a.prompt < 1 or a.gen < 1 or a.reps < 1 or min(threads) < 1 or a.depth < 0 \
            or (a.layers is not None and a.layers < 1):
        fail("--rounds, --prompt, --gen, --reps, --threads and --layers must be positive, --depth not negative")
    if a.llama_bench and not (os.path.isfile(a.llama_bench) and os.access(a.llama_bench, os.X_OK)):
        fail(f"{a.llama_bench}: " + ("not an executable file; --llama-bench is llama.cpp's llama-bench program"
                                     if os.path.exists(a.llama_bench) else "no llama-bench there"))
    if a.llama_args and not a.llama_bench:
        fail("--llama-args are llama-bench's options: give --llama-bench too")
    if not a.llama_bench and not os.access(a.lbench, os.X_OK):
        fail(f"{a.lbench}: no llama.cpp bench harness there; build it with "
             "tools/llama_cpp/build.sh (or give --lbench)")
    if not os.access(a.run, os.X_OK):
        fail(f"{a.run}: no engine there; build it with make (or give --run)")
    log = a.log or os.path.join(a.dir, "compare.log")
    os.makedirs(a.dir, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    try:
        measure(a, formats, threads, log)
    except KeyboardInterrupt:
        if os.path.exists(log):
            print(table(read_log(log), formats))
        fail(f"interrupted; the table above has what was measured (raw output in {log})")
    print(f"compare.py: raw output in {log}", file=sys.stderr)
    rows = read_log(log)
    print(table(rows, formats))
    missing = unpaired(rows, formats, threads)
    if missing:
        fail("no result of both programs for " + ", ".join(f"{f} with {t} thread{'s' if t > 1 else ''}"
                                                           for f, t in missing) + f" (their output: {log})")


if __name__ == "__main__":
    main()
