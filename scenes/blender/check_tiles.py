#!/usr/bin/env python3
# Throwaway checker for the Blender engine scripts (worker/src/engine/blender/
# scan.py and session.py) against real Blender. Plain python3 (stdlib only):
#
#   python3 scenes/blender/check_tiles.py [--work /tmp/tessera-check] [--blender blender]
#
# It generates the test scenes with make_scenes.py, then shows:
#  a) 3x3 border tiles (raw:false) through session.py stitched == `blender -b
#     shot.blend -f N` PNG, pixel for pixel, for every frame 1-6
#  b) 2 sample ranges (raw:true) merged by sample-count-weighted average vs a
#     full-sample raw render (max abs diff), and 2x2 tiles x 2 ranges vs
#     Blender's own EXR frame of the --exr project
#  c) the session in a job folder (mirrored layout and a scrambled one) with
#     the project and the external texture folder renamed away
#  d) the autoexec trap
#  e) the zstd copy renders the same pixels
#  f) timings: cold start + load vs per-tile time in one session
import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ENGINE = os.path.join(ROOT, "worker", "src", "engine", "blender")
SCAN = os.path.join(ROOT, "scan", "src", "blender")
BASE = ["-b", "--factory-startup", "--disable-autoexec"]
PREFIX = "@@TESSERA@@ "

results = []


def report(name, ok, detail):
    results.append((name, ok, detail))
    print("%s %s: %s" % ("PASS" if ok else "FAIL", name, detail), flush=True)


# ---------------------------------------------------------------------------
# image decoding (stdlib)


def decode_png(path):
    """-> (w, h, channels, list of rows of ints). 8/16-bit, colour types 0,2,4,6."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, idat = 8, b""
    while pos < len(data):
        n = struct.unpack(">I", data[pos:pos + 4])[0]
        tag = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if tag == b"IHDR":
            w, h, depth, ctype, _c, _f, interlace = struct.unpack(">IIBBBBB", body)
        elif tag == b"IDAT":
            idat += body
        pos += 12 + n
    assert interlace == 0
    ch = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]
    bpp = ch * depth // 8
    stride = w * bpp
    raw = zlib.decompress(idat)
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pr) & 255
        rows.append(list(line) if depth == 8 else list(struct.unpack(">%dH" % (stride // 2), line)))
        prev = line
    return w, h, ch, rows


def decode_exr(path):
    """Scanline EXR, compression NONE/ZIPS/ZIP, FLOAT/HALF -> (w, h, {chan: rows})."""
    d = open(path, "rb").read()
    assert d[:4] == b"\x76\x2f\x31\x01"
    pos, attrs = 8, {}
    while d[pos] != 0:
        e = d.index(b"\0", pos); name = d[pos:e].decode(); pos = e + 1
        e = d.index(b"\0", pos); pos = e + 1
        n = struct.unpack_from("<i", d, pos)[0]; pos += 4
        attrs[name] = d[pos:pos + n]; pos += n
    pos += 1
    comp = attrs["compression"][0]
    lines_per_block = {0: 1, 2: 1, 3: 16}[comp]
    chans, cl, p = [], attrs["channels"], 0
    while cl[p] != 0:
        e = cl.index(b"\0", p)
        chans.append((cl[p:e].decode(), struct.unpack_from("<i", cl, e + 1)[0]))
        p = e + 17
    x0, y0, x1, y1 = struct.unpack("<iiii", attrs["dataWindow"])
    w, h = x1 - x0 + 1, y1 - y0 + 1
    nblocks = (h + lines_per_block - 1) // lines_per_block
    offsets = struct.unpack_from("<%dQ" % nblocks, d, pos)
    rows = {c: [None] * h for c, _ in chans}
    for off in offsets:
        y, size = struct.unpack_from("<ii", d, off)
        blk = d[off + 8:off + 8 + size]
        nl = min(lines_per_block, y1 - y + 1)
        expect = sum(w * (4 if t == 2 else 2) for _, t in chans) * nl
        if comp != 0 and size < expect:
            t = bytearray(zlib.decompress(blk))
            for i in range(1, len(t)):
                t[i] = (t[i - 1] + t[i] - 128) & 255
            half = (len(t) + 1) // 2
            out = bytearray(len(t))
            out[0::2] = t[:half]
            out[1::2] = t[half:]
            blk = bytes(out)
        q = 0
        for li in range(nl):
            for c, t in chans:
                fmt, sz = ("f", 4) if t == 2 else ("e", 2)
                rows[c][y - y0 + li] = struct.unpack_from("<%d%s" % (w, fmt), blk, q)
                q += w * sz
    return w, h, rows


def read_tflt(path):
    d = open(path, "rb").read()
    assert d[:4] == b"TFLT"
    w, h, ch, n = struct.unpack("<IIII", d[4:20])
    px = struct.unpack("<%df" % (w * h * ch), d[20:])
    return w, h, ch, n, px


# ---------------------------------------------------------------------------
# Blender driving


def blender(args, log=None, env=None, check=True):
    t0 = time.monotonic()
    p = subprocess.run([BLENDER] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=env)
    dt = time.monotonic() - t0
    if log:
        with open(log, "w") as f:
            f.write(p.stdout)
    if check and p.returncode != 0:
        sys.exit("blender %s failed (rc %d):\n%s" % (args, p.returncode, p.stdout[-3000:]))
    return p, dt


def scan(blend, out_json):
    src = open(os.path.join(SCAN, "scan.py")).read()
    p, dt = blender(BASE + [blend, "--python-exit-code", "3", "--python-expr", src, "--", out_json])
    return json.load(open(out_json)), dt


class Session:
    def __init__(self, main_blend, cfg, cfg_path):
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=1)
        src = open(os.path.join(ENGINE, "session.py")).read()
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(
            [BLENDER] + BASE + [main_blend, "--python-exit-code", "3", "--python-expr", src, "--", cfg_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.progress_lines = 0
        self.ping = self.cmd({"op": "ping"})
        self.ready_s = time.monotonic() - self.t0

    def cmd(self, c):
        t0 = time.monotonic()
        self.p.stdin.write(json.dumps(c) + "\n")
        self.p.stdin.flush()
        while True:
            line = self.p.stdout.readline()
            if not line:
                err = self.p.stderr.read()
                raise RuntimeError("session died: %s" % err[-2000:])
            if "@@TESSERA" in line and not line.startswith(PREFIX):
                raise RuntimeError("reply interleaved mid-line: %r" % line)
            if line.startswith(PREFIX):
                r = json.loads(line[len(PREFIX):])
                r["_wall_ms"] = (time.monotonic() - t0) * 1000
                return r
            if "| Sample " in line:
                self.progress_lines += 1

    def close(self):
        self.p.stdin.write('{"op":"quit"}\n')
        self.p.stdin.flush()
        out, err = self.p.communicate(timeout=60)
        self.stderr = err
        return self.p.returncode


def crop_png_file(path, x, y, w, h):
    """Cuts (x, y, w, h) out of the PNG at `path` in place, as the worker
    does with the whole frame a tile render writes (borders are uncropped)."""
    data = open(path, "rb").read()
    _W, _H, depth, ctype = struct.unpack(">IIBB", data[16:26])
    _w, _h, ch, rows = decode_png(path)
    bpp = ch * depth // 8
    raw = b"".join(b"\0" + bytes(rows[y + j][x * bpp:(x + w) * bpp]) for j in range(h))

    def chunk(tag, body):
        return (struct.pack(">I", len(body)) + tag + body
                + struct.pack(">I", zlib.crc32(tag + body) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def render(sess, **kw):
    c = {"op": "render", "tile": None, "samples": None, "raw": False}
    c.update(kw)
    r = sess.cmd(c)
    if not r.get("ok"):
        raise RuntimeError("render failed: %s" % r)
    if r.get("crop"):
        crop_png_file(r["out"], *r["crop"])
    return r


def tiles_of(W, H, cols, rows):
    xs = [W * i // cols for i in range(cols + 1)]
    ys = [H * j // rows for j in range(rows + 1)]
    return [(xs[i], ys[j], xs[i + 1] - xs[i], ys[j + 1] - ys[j]) for j in range(rows) for i in range(cols)]


def stitch_png(W, H, parts):
    """parts: [(x, y, path)] -> rows of ints (RGBA 8)"""
    canvas = [[None] * (W * 4) for _ in range(H)]
    for x, y, path in parts:
        w, h, ch, rows = decode_png(path)
        assert ch == 4
        for j in range(h):
            canvas[y + j][x * 4:(x + w) * 4] = rows[j]
    return canvas


def max_diff(a, b):
    return max(abs(p - q) for p, q in zip(a, b))


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


# ---------------------------------------------------------------------------


def main():
    global BLENDER
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/tessera-check")
    ap.add_argument("--blender", default="blender")
    a = ap.parse_args()
    BLENDER = a.blender
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    proj, ext = os.path.join(work, "artist", "proj"), os.path.join(work, "artist", "ext")
    marker = os.path.join(work, "TRAP_MARKER")
    gen = os.path.join(HERE, "make_scenes.py")
    blender(["-b", "--factory-startup", "--python", gen, "--", "--project", proj, "--external", ext,
             "--trap", marker], log=os.path.join(work, "make.log"))
    projx, extx = os.path.join(work, "artistx", "proj"), os.path.join(work, "artistx", "ext")
    blender(["-b", "--factory-startup", "--python", gen, "--", "--project", projx, "--external", extx,
             "--exr"], log=os.path.join(work, "makex.log"))
    shot = os.path.join(proj, "shot.blend")
    W, H = 96, 64

    # --- f) cold reference renders ------------------------------------------
    ref = os.path.join(work, "ref")
    _, cold_one = blender(BASE + [shot, "-o", ref + "/f_####", "-f", "2"], log=os.path.join(work, "ref2.log"))
    _, cold_all = blender(BASE + [shot, "-o", ref + "/f_####", "-a"], log=os.path.join(work, "refall.log"))
    refs = {f: decode_png(os.path.join(ref, "f_%04d.png" % f)) for f in range(1, 7)}
    assert refs[2][:3] == (W, H, 4)

    # --- scan ------------------------------------------------------------------
    sc, scan_s = scan(shot, os.path.join(work, "scan_shot.json"))
    report("scan", len(sc["files"]) == 14 and all(e["exists"] for e in sc["files"])
           and sc["resolution"] == [W, H] and sc["compressed"] is None,
           "%d files (%s), resolution %s, %.2f s" % (len(sc["files"]),
           ", ".join(sorted({e["kind"] for e in sc["files"]})), sc["resolution"], scan_s))
    files = [e["path"] for e in sc["files"]]

    base_cfg = {"job_dir": proj, "artist_blend": shot, "files": {}, "device": "CPU", "gpu_index": None}

    # --- a) 3x3 tiles, raw:false, every frame ------------------------------
    tdir = os.path.join(work, "tiles")
    s = Session(shot, base_cfg, os.path.join(work, "sess_inplace.json"))
    tile_ms, bad = [], []
    for f in range(1, 7):
        parts = []
        for (x, y, w, h) in tiles_of(W, H, 3, 3):
            out = os.path.join(tdir, "f%d_%d_%d.png" % (f, x, y))
            r = render(s, frame=f, tile=[x, y, w, h], out=out)
            tile_ms.append(r["ms"])
            ww, hh, _, _ = decode_png(out)
            if (ww, hh) != (w, h):
                bad.append("tile %s is %dx%d" % ((x, y, w, h), ww, hh))
            parts.append((x, y, out))
        if stitch_png(W, H, parts) != refs[f][3]:
            bad.append("frame %d differs" % f)
    report("a) 3x3 tiles == blender -f (frames 1-6)", not bad,
           "; ".join(bad) or "54 tiles (32/32/32 x 21/21/22), all exact sizes, stitched frames identical to -f output")
    # same file bytes? (informative)
    fr = os.path.join(tdir, "full2.png")
    render(s, frame=2, out=fr)
    same_bytes = sha(fr) == sha(os.path.join(ref, "f_0002.png"))
    f6, f1 = os.path.join(tdir, "full6.png"), os.path.join(tdir, "full1.png")
    render(s, frame=6, out=f6)
    render(s, frame=1, out=f1)  # backwards in time, persistent data on
    report("a') full frames via session == -f", decode_png(fr)[3] == refs[2][3]
           and decode_png(f6)[3] == refs[6][3] and decode_png(f1)[3] == refs[1][3],
           "frames 2, 6, then 1: pixels equal; PNG file bytes %s (metadata text chunks: File, Date, "
           "RenderTime)" % ("identical" if same_bytes else "differ"))

    # --- b) sample ranges raw ------------------------------------------------
    rfull = render(s, frame=2, samples=[0, 16], raw=True, out=os.path.join(tdir, "full.tflt"))
    r0 = render(s, frame=2, samples=[0, 5], raw=True, out=os.path.join(tdir, "s0.tflt"))
    r1 = render(s, frame=2, samples=[5, 16], raw=True, out=os.path.join(tdir, "s1.tflt"))
    rnull = render(s, frame=2, raw=True, out=os.path.join(tdir, "snull.tflt"))
    _, _, _, nf, full = read_tflt(os.path.join(tdir, "full.tflt"))
    _, _, _, n0, a0 = read_tflt(os.path.join(tdir, "s0.tflt"))
    _, _, _, n1, a1 = read_tflt(os.path.join(tdir, "s1.tflt"))
    _, _, _, nn, an = read_tflt(os.path.join(tdir, "snull.tflt"))
    merged = [(n0 * p + n1 * q) / (n0 + n1) for p, q in zip(a0, a1)]
    md = max_diff(merged, full)
    report("b) ranges [0,5)+[5,16) vs [0,16) raw", md <= 1e-5 and (n0, n1, nf, nn) == (5, 11, 16, 16),
           "max abs diff %.3g (sample counts %d+%d vs %d); samples:null identical to [0,16): %s"
           % (md, n0, n1, nf, an == full))
    s.close()

    # b') EXR project: 2x2 tiles x 2 ranges vs Blender's own EXR frame
    shotx = os.path.join(projx, "shot.blend")
    blender(BASE + [shotx, "-o", ref + "/x_####", "-f", "2"], log=os.path.join(work, "refx.log"))
    xw, xh, xrows = decode_exr(os.path.join(ref, "x_0002.exr"))
    sx = Session(shotx, dict(base_cfg, job_dir=projx, artist_blend=shotx), os.path.join(work, "sess_x.json"))
    canvas = [[0.0] * (W * 4) for _ in range(H)]
    for (x, y, w, h) in tiles_of(W, H, 2, 2):
        outs = []
        for rng in ([0, 8], [8, 16]):
            out = os.path.join(tdir, "x_%d_%d_%d.tflt" % (x, y, rng[0]))
            render(sx, frame=2, tile=[x, y, w, h], samples=rng, raw=True, out=out)
            outs.append(read_tflt(out))
        (tw, th, _, na, pa), (_, _, _, nb, pb) = outs
        assert (tw, th) == (w, h)
        for j in range(h):
            for i in range(w * 4):
                k = j * w * 4 + i
                canvas[y + j][x * 4 + i] = (na * pa[k] + nb * pb[k]) / (na + nb)
    xr = render(sx, frame=2, out=os.path.join(tdir, "x_full.exr"))
    sx.close()
    ref_flat, got_flat = [], []
    for j in range(H):
        for i in range(W):
            for c, chn in enumerate("RGBA"):
                ref_flat.append(xrows[chn][j][i])
                got_flat.append(canvas[j][i * 4 + c])
    mdx = max_diff(ref_flat, got_flat)
    _, _, srows = decode_exr(os.path.join(tdir, "x_full.exr"))
    same_exr = all(srows[c] == xrows[c] for c in "RGBA")
    report("b') EXR: 2x2 tiles x 2 ranges merged vs blender -f EXR", mdx <= 1e-5,
           "max abs diff %.3g over %d values; session raw:false full-frame EXR pixels identical to -f: %s"
           % (mdx, len(ref_flat), same_exr))

    # --- c) job folders, artist folders gone ---------------------------------
    def build_job(name, layout, main_name):
        job = os.path.join(work, name)
        os.makedirs(job)
        fmap = {}
        shutil.copy2(shot, os.path.join(job, main_name))
        for p in files:
            rel = layout(p)
            dst = os.path.join(job, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(p, dst)
            fmap[p] = rel
        return job, fmap

    def mirrored(p):
        if p.startswith(proj + os.sep):
            return os.path.relpath(p, proj)
        return "_abs" + p

    dirs = {}

    def scrambled(p):
        d = dirs.setdefault(os.path.dirname(p), "d%02d" % len(dirs))
        return os.path.join("f", d, os.path.basename(p))

    jobs = [build_job("job", mirrored, "shot.blend"), build_job("job2", scrambled, "main.blend")]
    before = {j: {os.path.join(r, n): sha(os.path.join(r, n)) for r, _, ns in os.walk(j) for n in ns}
              for j, _ in jobs}
    moved = []
    for d in (proj, ext):
        os.rename(d, d + ".moved")
        moved.append(d)
    try:
        for (job, fmap), label, main_name in zip(jobs, ("mirrored", "scrambled"), ("shot.blend", "main.blend")):
            cfg = {"job_dir": job, "artist_blend": shot, "files": fmap, "device": "CPU", "gpu_index": None}
            sj = Session(os.path.join(job, main_name), cfg, os.path.join(work, "sess_%s.json" % label))
            parts = []
            for (x, y, w, h) in tiles_of(W, H, 3, 3):
                out = os.path.join(job + "_out", "t_%d_%d.png" % (x, y))
                render(sj, frame=2, tile=[x, y, w, h], out=out)
                parts.append((x, y, out))
            full_out = os.path.join(job + "_out", "full5.png")
            render(sj, frame=5, out=full_out)
            warnings = sj.ping["warnings"]
            remapped = sj.ping["remapped"]
            sj.close()
            ok = stitch_png(W, H, parts) == refs[2][3] and decode_png(full_out)[3] == refs[5][3]
            after = {os.path.join(r, n): sha(os.path.join(r, n)) for r, _, ns in os.walk(job) for n in ns}
            untouched = after == before[job]
            report("c) job folder (%s layout), project + external dir moved away" % label,
                   ok and not warnings and untouched,
                   "3x3 tiles of frame 2 and full frame 5 identical to the original's -f; %d references "
                   "remapped; warnings %s; job files unchanged and no leftovers: %s"
                   % (remapped, warnings, untouched))
        # the original absolutely cannot render now: show what that looks like
        p, _ = blender(BASE + [os.path.join(jobs[0][0], "shot.blend"), "-o", work + "/nomap_####", "-f", "2"],
                       check=False)
        nomap = decode_png(work + "/nomap_0002.png")[3] if os.path.exists(work + "/nomap_0002.png") else None
        report("c') control: job/shot.blend rendered without the session's remapping differs",
               nomap is not None and nomap != refs[2][3],
               "rc %d; warning/error lines in Blender's log: %s (a missing image renders magenta, silently)"
               % (p.returncode, [l for l in p.stdout.splitlines()
                                 if l.startswith(("Error", "Warning")) or "not found" in l.lower()][:3]))
    finally:
        for d in moved:
            os.rename(d + ".moved", d)

    # --- d) trap ---------------------------------------------------------------
    trap = os.path.join(proj, "trap.blend")
    blender(BASE + [trap], log=os.path.join(work, "trap1.log"))
    st = Session(trap, dict(base_cfg, artist_blend=trap), os.path.join(work, "sess_trap.json"))
    rt = render(st, frame=1, out=os.path.join(work, "trap.png"))
    st.close()
    scan(trap, os.path.join(work, "scan_trap.json"))
    no_marker = not os.path.exists(marker)
    p, _ = blender(["-b", "--factory-startup", "-y", trap], log=os.path.join(work, "trap2.log"))
    with_y = os.path.exists(marker)
    skip_line = [l for l in open(os.path.join(work, "trap1.log")) if "skipping" in l]
    report("d) autoexec trap", no_marker and with_y,
           "no marker after --disable-autoexec load, session (render ok) and scan; Blender says %r; "
           "with -y (--enable-autoexec) the marker IS written: %s" % (skip_line[0].strip() if skip_line else None, with_y))

    # --- e) zstd ---------------------------------------------------------------
    zshot = os.path.join(proj, "shot_zstd.blend")
    magic = open(zshot, "rb").read(4)
    blender(BASE + [zshot, "-o", ref + "/z_####", "-f", "2"], log=os.path.join(work, "refz.log"))
    zs, _ = scan(zshot, os.path.join(work, "scan_zstd.json"))
    sz = Session(zshot, dict(base_cfg, artist_blend=zshot), os.path.join(work, "sess_z.json"))
    zparts = []
    for (x, y, w, h) in tiles_of(W, H, 3, 3):
        out = os.path.join(tdir, "z_%d_%d.png" % (x, y))
        render(sz, frame=2, tile=[x, y, w, h], out=out)
        zparts.append((x, y, out))
    sz.close()
    report("e) zstd copy", magic == b"\x28\xb5\x2f\xfd" and zs["compressed"] == "zstd"
           and decode_png(os.path.join(ref, "z_0002.png"))[3] == refs[2][3]
           and stitch_png(W, H, zparts) == refs[2][3],
           "magic %s, scan says %s with %d files; -f 2 and 3x3 session tiles identical to shot.blend's"
           % (magic.hex(), zs["compressed"], len(zs["files"])))

    # --- f) timing ---------------------------------------------------------------
    sp = Session(shot, base_cfg, os.path.join(work, "sess_t.json"))
    tms, walls = [], []
    t16 = tiles_of(W, H, 4, 4)
    t0 = time.monotonic()
    for (x, y, w, h) in t16:
        r = render(sp, frame=2, tile=[x, y, w, h], out=os.path.join(tdir, "p_%d_%d.png" % (x, y)))
        tms.append(r["ms"])
        walls.append(r["_wall_ms"])
    persistent_16 = time.monotonic() - t0
    rf = render(sp, frame=2, out=os.path.join(tdir, "p_full.png"))
    ready = sp.ready_s
    progress = sp.progress_lines
    sp.close()
    # same but without persistent data
    sn = Session(shot, dict(base_cfg, persistent_data=False), os.path.join(work, "sess_np.json"))
    t0 = time.monotonic()
    for (x, y, w, h) in t16:
        render(sn, frame=2, tile=[x, y, w, h], out=os.path.join(tdir, "n_%d_%d.png" % (x, y)))
    nonpersistent_16 = time.monotonic() - t0
    sn.close()
    # cold: one Blender process per tile (via session.py with one command)
    t0 = time.monotonic()
    for (x, y, w, h) in t16[:4]:
        sc1 = Session(shot, base_cfg, os.path.join(work, "sess_c.json"))
        render(sc1, frame=2, tile=[x, y, w, h], out=os.path.join(tdir, "c_%d_%d.png" % (x, y)))
        sc1.close()
    cold_tile = (time.monotonic() - t0) / 4
    report("f) timing", True,
           "cold `blender -b shot.blend -f 2`: %.2f s wall (-a 1-6: %.2f s); session ready (start+load+remap): "
           "%.2f s; in-session full frame: %d ms; 16 tiles (24x16) in one session: %.2f s total, "
           "median %d ms/tile (render+write as reported), wall per command median %.0f ms; same with "
           "persistent_data off: %.2f s; cold process per tile: %.2f s/tile; progress lines seen: %d"
           % (cold_one, cold_all, ready, rf["ms"], persistent_16, sorted(tms)[8], sorted(walls)[8],
              nonpersistent_16, cold_tile, progress))

    # --- h) odd resolution with a percentage ---------------------------------
    odd = os.path.join(proj, "odd.blend")
    blender(BASE + [shot, "--python-expr",
                    "import bpy\nr = bpy.context.scene.render\nr.resolution_x, r.resolution_y, "
                    "r.resolution_percentage = 101, 67, 75\n"
                    "bpy.ops.wm.save_as_mainfile(filepath=%r, copy=True)" % odd])
    blender(BASE + [odd, "-o", ref + "/o_####", "-f", "2"])
    oref = decode_png(os.path.join(ref, "o_0002.png"))
    OW, OH = oref[0], oref[1]
    so = Session(odd, dict(base_cfg, artist_blend=odd), os.path.join(work, "sess_odd.json"))
    oks = []
    for cols, rows in ((3, 3), (7, 5)):
        parts = []
        for (x, y, w, h) in tiles_of(OW, OH, cols, rows):
            out = os.path.join(tdir, "o%dx%d_%d_%d.png" % (cols, rows, x, y))
            render(so, frame=2, tile=[x, y, w, h], out=out)
            assert decode_png(out)[:2] == (w, h), (x, y, w, h)
            parts.append((x, y, out))
        oks.append(stitch_png(OW, OH, parts) == oref[3])
    so.close()
    report("h) 101x67 @ 75%% (= %dx%d): 3x3 and 7x5 tiles == -f" % (OW, OH), all(oks) and (OW, OH) == (75, 50),
           "3x3 %s, 7x5 %s" % tuple("identical" if o else "DIFFERENT" for o in oks))

    # --- g) bad input and corrupt files -----------------------------------------
    sb = Session(shot, base_cfg, os.path.join(work, "sess_bad.json"))
    errs = [sb.cmd(c) for c in (
        {"op": "render", "frame": 2, "tile": [90, 0, 10, 10], "out": work + "/x.png"},
        {"op": "render", "frame": 2, "samples": [5, 5], "out": work + "/x.png"},
        {"op": "render", "frame": "2", "out": work + "/x.png"},
        {"op": "render", "frame": 2, "out": "relative.png"},
        {"op": "nope"})]
    okafter = sb.cmd({"op": "render", "frame": 1, "tile": [0, 0, 8, 8], "out": work + "/after.png", "raw": False})
    rc = sb.close()
    report("g) bad commands", all(not e["ok"] for e in errs) and okafter["ok"] and rc == 0,
           "; ".join(e["error"] for e in errs) + "; next command still renders; quit rc %d" % rc)
    garbage = os.path.join(work, "garbage.blend")
    open(garbage, "wb").write(os.urandom(4096))
    trunc = os.path.join(work, "trunc.blend")
    open(trunc, "wb").write(open(shot, "rb").read()[:20000])
    lines = []
    for g in (garbage, trunc):
        p, _ = blender(BASE + [g, "--python-exit-code", "3", "--python-expr",
                               open(os.path.join(SCAN, "scan.py")).read(), "--", work + "/g.json"], check=False)
        lines.append("rc %d: %s" % (p.returncode, [l for l in p.stdout.splitlines() if l.startswith("Error")]))
    report("g') corrupt .blend", all(l.startswith("rc 1") for l in lines), " | ".join(lines))

    print()
    failed = [n for n, ok, _ in results if not ok]
    print("%d checks, %d failed %s" % (len(results), len(failed), failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
