# Tessera render session. Runs inside Blender on a worker:
#
#   blender -b --factory-startup --disable-autoexec JOB_DIR/<main>.blend \
#       --python-exit-code 3 --python-expr <this source> -- SESSION.json
#
# SESSION.json:
#   {"job_dir": "/abs/job", "artist_blend": "/home/artist/proj/shot.blend",
#    "files": {"<absolute path on the artist's machine>": "<path relative to job_dir>"},
#    "device": "CPU" | "CUDA" | "OPTIX" | "HIP" | "METAL" | "ONEAPI",
#    "gpu_index": null | N,            # index among Cycles' devices of that type
#    "gpu_pci_bus_id": "0000:41:00.0", # optional, wins over gpu_index (NVML's busId)
#    "persistent_data": true,          # optional, default true
#    "file_format": "JPEG"}            # optional: JPEG, PNG or OPEN_EXR instead of the file's
#
# Setup: every external reference (images incl. sequences and UDIM tiles,
# libraries at any depth and the data inside them, fonts, sounds, movie clips,
# volumes, caches, sequencer strips, IES files) is pointed at the job folder's
# copy. A reference's artist-side absolute path is computed against the artist
# location of the file that owns it and looked up in "files". Files that link
# libraries are rewritten (opened, remapped, saved) into a private folder
# JOB_DIR/.tessera-session-<pid>/ and the main file is reopened from there, so
# data inside linked libraries is remapped too; the job files are not modified.
#
# Then one JSON command per stdin line, one reply line per command on stdout:
#   {"op":"render","frame":3,"tile":[x,y,w,h]|null,"samples":[start,end]|null,
#    "total":N (the full render's sample count),"out":"/abs/path","raw":false}
#     "passes":true renders the scene's passes only: no compositor, no denoising, the
#     denoising data (albedo, normal) kept, as float multilayer OpenEXR ("raw" and
#     "layers" then apply): a tile of a frame that ends with a finishing task.
#   {"op":"finish","frame":3,"passes":"/abs/passes.exr","out":"/abs/path"}
#     the finishing task: the scene's compositor and denoising run on the whole
#     frame's stitched passes, and Blender writes the scene's own output (format,
#     codec, dither, metadata) as after a full render. It rebuilds the compositor,
#     so the worker ends the session afterwards.
#   {"op":"ping"}   -> {"ok":true,"pong":true,"setup_ms":..,"blender_version":..,"warnings":[..]}
#   {"op":"quit"}   -> exit 0 (so does EOF)
# Replies: "@@TESSERA@@ " + JSON, e.g. {"ok":true,"out":..,"width":w,"height":h,"ms":123,
# "samples":n,"engine":"CYCLES","crop":[x,y,w,h]|null,"evidence":{"width":..,"height":..,
# "channels":..,"frame":3,"samples":{"ViewLayer":64}}} (evidence: read back from the
# written file; crop: the output is the whole frame, the tile is that rectangle of it)
# or {"ok":false,"error":"one line","unsupported":bool}. A render counts only when Blender's
# render_complete handler fired and render_cancel did not.
#
# raw:true output: a float tile (protocol/src/float_tile.rs; write_float_tile
# below) of premultiplied scene-linear RGBA exactly as Blender writes it to a
# 32-bit float EXR.
#
# Test hook: with TESSERA_TEST_FAIL_FIRST_RENDER=/abs/marker in the environment, the
# first render anywhere (marker absent) fails, and that session refuses every later
# render, so a worker that kept a failed session could never finish its job.
# Test hook: with TESSERA_TEST_STALL_RENDER=1 a render command hangs without printing
# anything (a stalled renderer, for the worker's stall window).
#
# Self-contained (stdlib + bpy): embedded in the worker binary.

import json
import os
import re
import shutil
import struct
import sys
import tempfile
import time

import bpy

PREFIX = "@@TESSERA@@ "
_SEQ_RE = re.compile(r"^(.*?)(\d+)(\D*)$")
# A file Blender ships, by its path: what follows an installation's
# X.Y/datafiles/ (see Remapper.unshared).
_DATAFILES_RE = re.compile(r"(?:^|/)\d{1,3}\.\d{1,3}/datafiles/(.+)$")
_UDIM_TOKENS = ("<UDIM>", "<UVTILE>")


def log(msg):
    sys.stderr.write("tessera-session: %s\n" % msg)
    sys.stderr.flush()


def _flush_c_stdout():
    """Blender's own progress lines go through C stdio; flush them before we
    write a reply so the two never share a line."""
    try:
        import ctypes
        ctypes.CDLL(None).fflush(None)
    except Exception:
        pass


def reply(obj):
    _flush_c_stdout()
    sys.stdout.flush()
    sys.stdout.write(PREFIX + json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def one_line(e):
    s = "%s: %s" % (type(e).__name__, e) if not isinstance(e, str) else e
    return " ".join(s.split())[:1000]



def strips_of(editor):
    """Every strip of a sequence editor (Blender 5 renamed them)."""
    strips = getattr(editor, "strips_all", None)
    return strips if strips is not None else editor.sequences_all


# ---------------------------------------------------------------------------
# path remapping


class Remapper:
    def __init__(self, cfg):
        self.job_dir = os.path.normpath(os.path.abspath(cfg["job_dir"]))
        self.artist_blend = os.path.normpath(cfg["artist_blend"])
        self.fmap = {}    # artist abs path -> job abs path
        for art, rel in cfg.get("files", {}).items():
            if os.path.isabs(rel) or "\x00" in rel:
                raise ValueError("job path must be relative: %r" % rel)
            job = os.path.normpath(os.path.join(self.job_dir, rel))
            if not job.startswith(self.job_dir + os.sep):
                raise ValueError("job path escapes the job folder: %r" % rel)
            self.fmap[os.path.normpath(art)] = job
        self.rev = {v: k for k, v in self.fmap.items()}  # job path -> artist path
        self.by_dir = {}  # job dir -> [job paths], for sequences
        for j in self.rev:
            self.by_dir.setdefault(os.path.dirname(j), []).append(j)
        self.art_by_dir = {}  # artist dir -> [artist paths]
        for a in self.fmap:
            self.art_by_dir.setdefault(os.path.dirname(a), []).append(a)
        self.warnings = []
        self.remapped = 0
        self.work = None
        self.lib_out = {}   # artist lib path -> rewritten copy path

    # -- lookups ---------------------------------------------------------------

    @staticmethod
    def _abs(path, start):
        if os.sep == "/" and path.startswith("//") and "\\" in path:
            path = path.replace("\\", "/")
        if path.startswith("//"):
            path = os.path.join(start, path[2:])
        return os.path.normpath(path)

    def lookup(self, path, a_dir, j_dir):
        """Job path for a single file reference, or None."""
        art = self._abs(path, a_dir)
        if art in self.fmap:
            return self.fmap[art]
        job = self._abs(path, j_dir)
        if job in self.rev:   # already points into the job folder
            return job
        return None

    def artist_of(self, path, a_dir, j_dir):
        art = self._abs(path, a_dir)
        if art in self.fmap:
            return art
        job = self._abs(path, j_dir)
        return self.rev.get(job)

    def lookup_sequence(self, path, a_dir, j_dir):
        hit = self.lookup(path, a_dir, j_dir)
        if hit:
            return hit
        base = os.path.basename(path)
        m = _SEQ_RE.match(base)
        if not m:
            return None
        pat = re.compile(r"^%s\d+%s$" % (re.escape(m.group(1)), re.escape(m.group(3))))
        art = self._abs(path, a_dir)
        for a in self.art_by_dir.get(os.path.dirname(art), []):
            if pat.match(os.path.basename(a)):
                return os.path.join(os.path.dirname(self.fmap[a]), base)
        job = self._abs(path, j_dir)
        for j in self.by_dir.get(os.path.dirname(job), []):
            if pat.match(os.path.basename(j)):
                return os.path.join(os.path.dirname(j), base)
        return None

    def lookup_udim(self, path, tiles, a_dir, j_dir):
        if not any(t in path for t in _UDIM_TOKENS):
            path = re.sub(r"1\d{3}(?=\D*$)", "<UDIM>", path, count=1)
        for num in tiles:
            u, v = (num - 1001) % 10, (num - 1001) // 10
            p = path.replace("<UDIM>", "%d" % num).replace("<UVTILE>", "u%d_v%d" % (u + 1, v + 1))
            hit = self.lookup(p, a_dir, j_dir)
            if hit:
                return os.path.join(os.path.dirname(hit), os.path.basename(path))
        return None

    def lookup_dir(self, path, a_dir, j_dir):
        art = self._abs(path, a_dir).rstrip(os.sep)
        for a, j in self.fmap.items():
            if a.startswith(art + os.sep):
                rel = a[len(art):]
                if j.endswith(rel):
                    return j[: len(j) - len(rel)]
        job = self._abs(path, j_dir).rstrip(os.sep)
        if os.path.isdir(job) and job.startswith(self.job_dir):
            return job
        return None

    # -- one file ----------------------------------------------------------------

    def unshared(self, path, is_dir=False):
        """Where a reference the job does not carry points here: the file
        Blender ships, when it names one (this Blender's own copy), else a
        place in the job folder that does not exist, so that it renders as
        missing, as it did where it was submitted. Never a file of this
        machine's own: a submitted scene must not read the worker's disk."""
        m = _DATAFILES_RE.search(path.replace("\\", "/"))
        if m:
            try:
                own = os.path.normpath(bpy.utils.system_resource("DATAFILES"))
            except Exception:
                own = None
            if own:
                mine = os.path.normpath(os.path.join(own, m.group(1)))
                if mine.startswith(own + os.sep) and os.path.exists(mine):
                    return mine
        base = os.path.basename(path.replace("\\", "/").rstrip("/")) or "missing"
        gone = os.path.join(self.job_dir, "_not_shared", base)
        return gone + os.sep if is_dir else gone

    def _set(self, owner, attr, new, what, is_dir=False):
        if new is None:
            old = getattr(owner, attr)
            new = self.unshared(old, is_dir)
            if not new.startswith(self.job_dir + os.sep):
                self.warnings.append("%s: %s is Blender's own, read from this worker's Blender" % (what, old))
            else:
                self.warnings.append("%s: %s not in the job (rendered as missing)" % (what, old))
        if getattr(owner, attr) != new:
            setattr(owner, attr, new)
            self.remapped += 1

    def remap_open_file(self, artist_file):
        """Remap every local reference of the currently open file, whose artist
        location is `artist_file`. Returns the artist paths of its libraries."""
        a_dir = os.path.dirname(artist_file)
        j_dir = os.path.dirname(os.path.normpath(bpy.data.filepath))
        local = lambda idb: idb.library is None

        for img in bpy.data.images:
            if not local(img) or img.source not in {"FILE", "SEQUENCE", "MOVIE", "TILED"}:
                continue
            if img.packed_file is not None or len(img.packed_files) > 0 or not img.filepath:
                continue
            what = "Image '%s'" % img.name
            if img.source == "TILED" or any(t in img.filepath for t in _UDIM_TOKENS):
                new = self.lookup_udim(img.filepath, [t.number for t in img.tiles], a_dir, j_dir)
            elif img.source == "SEQUENCE":
                new = self.lookup_sequence(img.filepath, a_dir, j_dir)
            else:
                new = self.lookup(img.filepath, a_dir, j_dir)
            self._set(img, "filepath", new, what)

        simple = [(bpy.data.fonts, "Font", None), (bpy.data.sounds, "Sound", None),
                  (bpy.data.movieclips, "MovieClip", lambda c: c.source == "SEQUENCE"),
                  (bpy.data.volumes, "Volume", lambda v: v.is_sequence),
                  (bpy.data.cache_files, "CacheFile", lambda c: c.is_sequence)]
        for coll, label, is_seq in simple:
            for idb in coll:
                fp = idb.filepath
                if not local(idb) or not fp or fp == "<builtin>" or getattr(idb, "packed_file", None) is not None:
                    continue
                if is_seq and is_seq(idb):
                    new = self.lookup_sequence(fp, a_dir, j_dir)
                else:
                    new = self.lookup(fp, a_dir, j_dir)
                self._set(idb, "filepath", new, "%s '%s'" % (label, idb.name))

        for scene in bpy.data.scenes:
            if not local(scene) or scene.sequence_editor is None:
                continue
            for s in strips_of(scene.sequence_editor):
                what = "Strip '%s'" % s.name
                if s.type == "IMAGE" and len(s.elements):
                    hit = self.lookup(os.path.join(s.directory, s.elements[0].filename), a_dir, j_dir)
                    self._set(s, "directory", os.path.dirname(hit) + os.sep if hit else None, what,
                              is_dir=True)
                elif s.type == "MOVIE":
                    self._set(s, "filepath", self.lookup(s.filepath, a_dir, j_dir), what)

        for ob in bpy.data.objects:
            if not local(ob):
                continue
            for md in ob.modifiers:
                what = "Object '%s' modifier '%s'" % (ob.name, md.name)
                if md.type == "MESH_CACHE" and md.filepath:
                    self._set(md, "filepath", self.lookup(md.filepath, a_dir, j_dir), what)
                elif md.type == "FLUID" and md.fluid_type == "DOMAIN":
                    new = self.lookup_dir(md.domain_settings.cache_directory, a_dir, j_dir)
                    if new is not None:
                        self._set(md.domain_settings, "cache_directory", new, what)

        trees = [m.node_tree for m in bpy.data.materials if local(m) and m.node_tree]
        trees += [l.node_tree for l in bpy.data.lights if local(l) and l.node_tree]
        trees += [w.node_tree for w in bpy.data.worlds if local(w) and w.node_tree]
        trees += [g for g in bpy.data.node_groups if local(g)]
        for nt in trees:
            for node in nt.nodes:
                if node.bl_idname == "ShaderNodeTexIES" and node.mode == "EXTERNAL" and node.filepath:
                    self._set(node, "filepath", self.lookup(node.filepath, a_dir, j_dir),
                              "IES node '%s'" % node.name)

        libs = []
        for lib in bpy.data.libraries:
            if lib.packed_file is not None:
                continue
            art = self.artist_of(lib.filepath, a_dir, j_dir)
            if art is None:
                # Blender's own (a brush library), or rendered as missing.
                self._set(lib, "filepath", None, "Library '%s'" % lib.name)
                continue
            if art not in self.lib_out:
                self.lib_out[art] = os.path.join(
                    self.work, "%03d_%s" % (len(self.lib_out), os.path.basename(art)))
                libs.append(art)
            self._set(lib, "filepath", self.lib_out[art], "Library '%s'" % lib.name)
        return libs

    def run(self):
        """Remap the loaded main file; rewrite files as needed. Leaves the
        remapped main file open."""
        main_job = os.path.normpath(bpy.data.filepath)
        if not bpy.data.libraries:
            self.remap_open_file(self.artist_blend)
            return
        try:
            self.work = tempfile.mkdtemp(prefix=".tessera-session-%d-" % os.getpid(), dir=self.job_dir)
        except OSError:  # read-only job folder
            self.work = tempfile.mkdtemp(prefix="tessera-session-%d-" % os.getpid())
        queue = self.remap_open_file(self.artist_blend)
        main_out = os.path.join(self.work, os.path.basename(main_job))  # libs are NNN_-prefixed
        save(main_out)
        done = set()
        while queue:
            art = queue.pop(0)
            if art in done:
                continue
            done.add(art)
            job = self.fmap[art]
            if not os.path.isfile(job):
                self.warnings.append("library %s missing from the job folder" % job)
                continue
            bpy.ops.wm.open_mainfile(filepath=job, load_ui=True, use_scripts=False)
            queue.extend(self.remap_open_file(art))
            save(self.lib_out[art])
        bpy.ops.wm.open_mainfile(filepath=main_out, load_ui=True, use_scripts=False)

    def cleanup(self):
        if self.work:
            shutil.rmtree(self.work, ignore_errors=True)


def save(path):
    bpy.ops.wm.save_as_mainfile(filepath=path, compress=False, relative_remap=True, copy=False)


# ---------------------------------------------------------------------------
# device


def _pci(s):
    m = re.search(r"([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)", s or "")
    return tuple(int(g, 16) for g in m.groups()) if m else None


def configure_device(scene, device, gpu_index, pci_bus_id=None):
    device = (device or "CPU").upper()
    cprefs = bpy.context.preferences.addons["cycles"].preferences
    if device == "CPU":
        cprefs.compute_device_type = "NONE"
        scene.cycles.device = "CPU"
        return "CPU"
    try:
        cprefs.compute_device_type = device
    except TypeError:
        raise RuntimeError("Cycles in this Blender has no %s support" % device)
    cprefs.refresh_devices()
    devs = [d for d in cprefs.devices if d.type == device]
    if not devs:
        raise RuntimeError("no %s device found" % device)
    if pci_bus_id:
        # Cycles' device ids end in the PCI location, e.g. "CUDA_NVIDIA H100_0000:41:00"
        want = _pci(pci_bus_id)
        chosen = [d for d in devs if want is not None and _pci(d.id.rsplit("_", 1)[-1]) == want]
        if not chosen:
            raise RuntimeError("no %s device at PCI %s (found: %s)" % (
                device, pci_bus_id, ", ".join(d.id for d in devs)))
    elif gpu_index is not None:
        if not 0 <= gpu_index < len(devs):
            raise RuntimeError("%s device index %d out of range (%d found)" % (device, gpu_index, len(devs)))
        chosen = [devs[gpu_index]]
    else:
        chosen = devs
    ids = {d.id for d in chosen}
    for d in cprefs.devices:
        d.use = d.type == device and d.id in ids
    scene.cycles.device = "GPU"
    return ", ".join("%s %s" % (d.type, d.name) for d in chosen)


# ---------------------------------------------------------------------------
# raw float output: parse Blender's uncompressed float EXR


def read_exr_none(path):
    """(width, height, {channel: list-of-rows}) of a scanline EXR with
    compression NONE and FLOAT/HALF channels."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x76\x2f\x31\x01":
        raise ValueError("not an EXR file")
    if data[5] & 0x1A:  # tiled, deep or multi-part (long names are fine)
        raise ValueError("unsupported EXR layout")
    pos = 8
    attrs = {}
    while data[pos] != 0:
        e = data.index(b"\0", pos)
        name = data[pos:e].decode()
        pos = e + 1
        e = data.index(b"\0", pos)
        pos = e + 1
        size = struct.unpack_from("<i", data, pos)[0]
        pos += 4
        attrs[name] = data[pos:pos + size]
        pos += size
    pos += 1
    if attrs["compression"][0] != 0:
        raise ValueError("EXR is compressed")
    chans = []
    cl, p = attrs["channels"], 0
    while cl[p] != 0:
        e = cl.index(b"\0", p)
        cname = cl[p:e].decode()
        ptype = struct.unpack_from("<i", cl, e + 1)[0]
        chans.append((cname, ptype))
        p = e + 1 + 16
    x0, y0, x1, y1 = struct.unpack("<iiii", attrs["dataWindow"])
    w, h = x1 - x0 + 1, y1 - y0 + 1
    offsets = struct.unpack_from("<%dQ" % h, data, pos)
    rows = {c: [None] * h for c, _ in chans}
    for off in offsets:
        y, _size = struct.unpack_from("<ii", data, off)
        q = off + 8
        for cname, ptype in chans:
            if ptype == 2:
                rows[cname][y - y0] = struct.unpack_from("<%df" % w, data, q)
                q += 4 * w
            elif ptype == 1:
                rows[cname][y - y0] = struct.unpack_from("<%de" % w, data, q)
                q += 2 * w
            else:
                raise ValueError("unsupported EXR pixel type %d" % ptype)
    return w, h, rows


def write_raw_rows(w, h, rows, out, samples):
    import array
    one = (1.0,) * w
    zero = (0.0,) * w
    pick = lambda c, y, dflt: rows[c][y] if c in rows else dflt
    buf = array.array("f")
    for y in range(h):  # EXR scanlines are stored top to bottom
        r, g, b, a = (pick("R", y, zero), pick("G", y, zero), pick("B", y, zero), pick("A", y, one))
        row = array.array("f", bytes(16 * w))
        row[0::4] = array.array("f", r)
        row[1::4] = array.array("f", g)
        row[2::4] = array.array("f", b)
        row[3::4] = array.array("f", a)
        buf.extend(row)
    write_float_tile(out, w, h, samples, buf)
    return w, h


def write_float_tile(out, w, h, samples, rgba):
    """Writes the float tile format of protocol/src/float_tile.rs: b"TFLT",
    u32 width, height, channels (4) and samples, then w*h*4 float32 RGBA,
    all little endian, rows top to bottom. `rgba` is an array.array("f")."""
    import array
    if sys.byteorder != "little":
        rgba = array.array("f", rgba)
        rgba.byteswap()
    tmp = out + ".part"
    with open(tmp, "wb") as f:
        f.write(b"TFLT" + struct.pack("<IIII", w, h, 4, samples))
        f.write(rgba.tobytes())
    os.replace(tmp, out)


# ---------------------------------------------------------------------------
# GPU context probe (Eevee / Workbench)

_GPU_PROBE = """import bpy
s = bpy.context.scene
names = {e.identifier for e in s.render.bl_rna.properties['engine'].enum_items}
# Blender 4.2 to 4.5 call it Eevee Next; earlier and later ones, Eevee.
s.render.engine = 'BLENDER_EEVEE_NEXT' if 'BLENDER_EEVEE_NEXT' in names else 'BLENDER_EEVEE'
s.render.resolution_x = s.render.resolution_y = 4
s.eevee.taa_render_samples = 1
for o in list(bpy.data.objects):
    if o.type == 'MESH':
        bpy.data.objects.remove(o)
bpy.ops.render.render()
print('TESSERA_GPU_OK')
"""
_gpu_probe_result = None


def _blender_command(script):
    """argv running Python `script` in a fresh Blender like this one: the
    executable, or this interpreter when Blender is the bpy module."""
    if bpy.app.binary_path:
        return [bpy.app.binary_path, "-b", "--factory-startup", "--disable-autoexec",
                "--python-exit-code", "3", "--python-expr", script]
    return [sys.executable, "-I", "-B", "-c", "import bpy\n" + script]


def _die_with_parent():
    """In a child, before exec: SIGKILL it when this session dies (the
    worker kills the session's process group on a cancel, and the kernel
    this child if the session dies any other way)."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except Exception:
        pass


def gpu_context_error():
    """None when Blender can get an OpenGL context here, else a one-line reason.
    Without one, Blender 3.4 aborts the whole process (SIGABRT in libepoxy) the
    moment Eevee starts, which Python cannot catch, so ask a throwaway Blender
    first (once per session)."""
    global _gpu_probe_result
    if _gpu_probe_result is None:
        import subprocess
        try:
            p = subprocess.run(
                _blender_command(_GPU_PROBE),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                timeout=300, preexec_fn=_die_with_parent)
            out = p.stdout.decode("utf-8", "replace")
            if p.returncode == 0 and "TESSERA_GPU_OK" in out:
                _gpu_probe_result = ""
            else:
                lines = [l for l in out.splitlines() if l.strip() and not l.startswith("Fra:")]
                how = ("signal %d" % -p.returncode) if p.returncode < 0 else ("exit %d" % p.returncode)
                _gpu_probe_result = "no GPU/OpenGL context for %s (probe Blender %s: %s)" % (
                    bpy.context.scene.render.engine, how, lines[-1] if lines else "no output")
        except Exception as e:
            _gpu_probe_result = "GPU context probe failed: %s" % one_line(e)
    return _gpu_probe_result or None


# ---------------------------------------------------------------------------
# rendering


def set_sample_subset(c, samples, total):
    """Render samples [start, end) of a `total`-sample render. Blender 4.5
    and later render them as a subset of the full render's own sampling
    pattern (its blue-noise and Sobol patterns depend on the total count, so
    an offset alone would not add up to the full render); older ones render
    `end - start` samples from `sample_offset`. True when a subset is used:
    Cycles then stamps the full render's count into the file."""
    has_subset = hasattr(c, "use_sample_subset")
    if samples is None:
        if has_subset:
            c.use_sample_subset = False
        return False
    start, end = samples
    whole = isinstance(total, int) and not isinstance(total, bool) and [start, end] == [0, total]
    if has_subset and isinstance(total, int) and not isinstance(total, bool) and end <= total and not whole:
        c.samples = total
        c.use_sample_subset = True
        c.sample_offset = start
        c.sample_subset_length = end - start
        return True
    else:
        if has_subset:
            c.use_sample_subset = False
        c.sample_offset = start
        c.samples = end - start
        return False


class Unsupported(Exception):
    """The scene needs something this Blender lacks: every attempt on this
    worker would fail the same way."""


def adaptive_margin(scene, samples):
    """Pixels a border must grow by so that Cycles' adaptive sampling gives
    its inner pixels exactly the samples of a full-frame render.

    Cycles checks convergence at fixed sample numbers (every `adaptive_step`
    = 16 samples once past `min_samples`; `AdaptiveSampling::align_samples`
    makes every render stop at those, whatever its speed). Each check is per
    pixel, then `film_adaptive_sampling_filter_x`/`_y` mark the neighbours of
    every unconverged pixel unconverged too. At a border's edge the pixels
    outside are missing, so an edge pixel may stop early where the full render
    kept sampling it; that difference can move inward by at most one pixel per
    check. A margin of one pixel per check (plus one) keeps the tile exact."""
    c = scene.cycles
    if not c.use_adaptive_sampling:
        return 0
    threshold = c.adaptive_threshold
    if threshold <= 0.0:
        threshold = max(0.001, 1.0 / max(1, samples))
    if c.adaptive_min_samples == 0:
        min_samples = max(4, int(-(-16.0 // (threshold ** 0.3))))
    else:
        min_samples = max(4, c.adaptive_min_samples)
    step = 16
    # Checks followed by more samples (one after the last sample changes nothing).
    checks = sum(1 for s in range(samples - 1) if s > min_samples and s % step == step - 1)
    return checks + 1 if checks else 0


def set_border(scene, W, H, x, y, w, h):
    """Border-render the rectangle (x, y, w, h) of a W x H frame (y from the
    top) without cropping: Blender writes the whole frame with only the
    border rendered. Dither is a function of a pixel's position in the image
    written, so only an uncropped border gives the full render's pixels."""
    r = scene.render
    # Blender truncates border*size to pixels and measures y from the
    # bottom: put each edge half a pixel in so truncation is exact.
    yb = H - (y + h)
    r.border_min_x = (x + 0.5) / W
    r.border_max_x = min(1.0, (x + w + 0.5) / W)
    r.border_min_y = (yb + 0.5) / H
    r.border_max_y = min(1.0, (yb + h + 0.5) / H)
    r.use_border = (w, h) != (W, H)
    r.use_crop_to_border = False


def missing_feature(scene):
    """A one-line reason when the scene needs a feature this Blender was
    built without, else None. Checked before every render: Blender 3.4 fails
    the first render with "Build without OpenImageDenoiser" and then returns
    an empty image on the next one."""
    r = scene.render
    version = bpy.app.version_string
    if r.engine == "CYCLES":
        import _cycles
        c = scene.cycles
        if c.use_denoising:
            denoiser = getattr(c, "denoiser", "") or ""
            if denoiser in ("", "OPENIMAGEDENOISE") and not getattr(_cycles, "with_openimagedenoise", False):
                return ("the scene denoises with OpenImageDenoise (Render Properties > Sampling > "
                        "Denoise), but this worker's Blender %s is built without it: turn "
                        "denoising off, or render on workers whose Blender has OpenImageDenoise"
                        % version)
        if getattr(c, "shading_system", False) and not getattr(_cycles, "with_osl", True):
            return ("the scene uses Open Shading Language (Render Properties > Open Shading "
                    "Language), but this worker's Blender %s is built without it" % version)
    return None


# -- evidence: what the written file says Blender rendered ----------------------


def png_info(data):
    """(width, height, channels, {tEXt key: value}) of a PNG."""
    import zlib
    w, h = struct.unpack(">II", data[16:24])
    ctype = data[25]
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(ctype, 0)
    meta = {}
    pos = 8
    while pos + 8 <= len(data):
        n = struct.unpack(">I", data[pos:pos + 4])[0]
        tag = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if tag == b"tEXt" and b"\0" in body:
            k, v = body.split(b"\0", 1)
            meta[k.decode("latin-1")] = v.decode("latin-1")
        elif tag == b"zTXt" and b"\0" in body:
            k, v = body.split(b"\0", 1)
            try:
                meta[k.decode("latin-1")] = zlib.decompress(v[1:]).decode("latin-1")
            except Exception:
                pass
        elif tag == b"IEND":
            break
        pos += 12 + n
    return w, h, channels, meta


def exr_info(data):
    """(width, height, channel names, {string attribute: value}) of a
    single-part EXR header."""
    pos = 8
    meta, chans, size = {}, [], (0, 0)
    while pos < len(data) and data[pos] != 0:
        e = data.index(b"\0", pos)
        name = data[pos:e].decode("latin-1")
        e2 = data.index(b"\0", e + 1)
        kind = data[e + 1:e2].decode("latin-1")
        n = struct.unpack_from("<i", data, e2 + 1)[0]
        val = data[e2 + 5:e2 + 5 + n]
        if kind == "string":
            meta[name] = val.decode("utf-8", "replace")
        elif name == "dataWindow":
            x0, y0, x1, y1 = struct.unpack("<iiii", val)
            size = (x1 - x0 + 1, y1 - y0 + 1)
        elif name == "channels":
            p = 0
            while p < len(val) and val[p] != 0:
                q = val.index(b"\0", p)
                chans.append(val[p:q].decode("latin-1"))
                p = q + 1 + 16
        pos = e2 + 5 + n
    return size[0], size[1], chans, meta


def jpeg_info(data):
    """(width, height, channels, metadata) of a JPEG; Blender writes its
    stamp as "Blender:Key:Value" comment markers."""
    pos, w, h, nch, meta = 2, 0, 0, 0, {}
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        n = struct.unpack(">H", data[pos + 2:pos + 4])[0]
        body = data[pos + 4:pos + 2 + n]
        if marker in (0xC0, 0xC1, 0xC2) and len(body) >= 6:
            h, w = struct.unpack(">HH", body[1:5])
            nch = body[5]
        elif marker == 0xFE:
            text = body.rstrip(b"\0").decode("latin-1")
            if text.startswith("Blender:") and ":" in text[8:]:
                k, v = text[8:].split(":", 1)
                meta[k] = v
        elif marker == 0xDA:
            break
        pos += 2 + n
    return w, h, nch, meta


def evidence(path):
    """What the image at `path` says about its render: size, channels, and
    the stamp Blender writes into PNG, JPEG and EXR files (frame; Cycles'
    samples per view layer). Other formats carry no stamp: Blender reads
    their size back, and `stamped` is false."""
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    stamped, passes = True, None
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        with open(path, "rb") as f:
            w, h, nch, meta = png_info(f.read())
        channels = nch
    elif head[:4] == b"\x76\x2f\x31\x01":
        w, h, chans, meta = exr_info(head)
        channels = len(chans)
        # Its passes: channel names less the channel (`ViewLayer.Depth.Z`).
        passes = sorted({c.rsplit(".", 1)[0] for c in chans if "." in c})
    elif head[:2] == b"\xff\xd8":
        with open(path, "rb") as f:
            w, h, channels, meta = jpeg_info(f.read())
    else:
        img = bpy.data.images.load(path, check_existing=False)
        try:
            w, h = img.size[:]
            channels = img.channels
        finally:
            bpy.data.images.remove(img)
        meta, stamped = {"Frame": str(bpy.context.scene.frame_current)}, False
    samples = {}
    for k, v in meta.items():
        if k.startswith("cycles.") and k.endswith(".samples"):
            try:
                samples[k[len("cycles."):-len(".samples")]] = int(v)
            except ValueError:
                pass
    frame = meta.get("Frame")
    try:
        frame = int(frame) if frame is not None else None
    except ValueError:
        frame = None
    return {"width": w, "height": h, "channels": channels, "frame": frame, "samples": samples,
            "stamped": stamped, "passes": passes}


# A view layer's pass switches and the name Blender gives each pass in a
# multilayer OpenEXR (Cycles).
_PASS_SWITCHES = (
    ("use_pass_combined", "Combined"), ("use_pass_z", "Depth"), ("use_pass_mist", "Mist"),
    ("use_pass_normal", "Normal"), ("use_pass_position", "Position"), ("use_pass_uv", "UV"),
    ("use_pass_object_index", "IndexOB"), ("use_pass_material_index", "IndexMA"),
    ("use_pass_emit", "Emit"), ("use_pass_environment", "Env"),
    ("use_pass_ambient_occlusion", "AO"),
    ("use_pass_diffuse_direct", "DiffDir"), ("use_pass_diffuse_indirect", "DiffInd"),
    ("use_pass_diffuse_color", "DiffCol"), ("use_pass_glossy_direct", "GlossDir"),
    ("use_pass_glossy_indirect", "GlossInd"), ("use_pass_glossy_color", "GlossCol"),
    ("use_pass_transmission_direct", "TransDir"), ("use_pass_transmission_indirect", "TransInd"),
    ("use_pass_transmission_color", "TransCol"),
)
_CRYPTO_SWITCHES = (("use_pass_cryptomatte_object", "CryptoObject"),
                    ("use_pass_cryptomatte_material", "CryptoMaterial"),
                    ("use_pass_cryptomatte_asset", "CryptoAsset"))


def asked_passes(scene):
    """The passes (`ViewLayer.Depth`) the scene's view layers ask a
    multilayer OpenEXR to hold, from their pass switches; None where this
    is not known (other formats and engines, stereo views). The evidence
    check compares them with what the file holds: a pass the scene asks for
    and the file lacks is a render that did not do what was asked."""
    r = scene.render
    if (r.engine != "CYCLES" or r.image_settings.file_format != "OPEN_EXR_MULTILAYER"
            or r.use_multiview):
        return None
    layers = [vl for vl in scene.view_layers if vl.use]
    if r.use_single_layer:
        layers = [bpy.context.view_layer]
    asked = []
    for vl in layers:
        for switch, name in _PASS_SWITCHES:
            if getattr(vl, switch, False):
                asked.append("%s.%s" % (vl.name, name))
        if not r.use_motion_blur and getattr(vl, "use_pass_vector", False):
            asked.append("%s.Vector" % vl.name)
        levels = getattr(vl, "pass_cryptomatte_depth", 6)
        for switch, name in _CRYPTO_SWITCHES:
            if getattr(vl, switch, False):
                asked += ["%s.%s%02d" % (vl.name, name, i) for i in range((levels + 1) // 2)]
        if getattr(vl.cycles, "denoising_store_passes", False):
            asked += ["%s.Denoising Normal" % vl.name, "%s.Denoising Albedo" % vl.name]
    return sorted(asked)


def crop_exr(src, out, x, y, w, h, extra):
    """Writes the (x, y, w, h) rectangle of the uncompressed scanline EXR
    `src` to `out`: every channel in its own pixel type, every header
    attribute kept (windows made the tile's), plus the string attributes in
    `extra`. Lossless: the samples are copied, not converted."""
    with open(src, "rb") as f:
        data = f.read()
    if data[:4] != b"\x76\x2f\x31\x01" or data[5] & 0x1A:
        raise ValueError("not a single-part scanline EXR")
    pos, attrs = 8, []
    while data[pos] != 0:
        e = data.index(b"\0", pos)
        e2 = data.index(b"\0", e + 1)
        n = struct.unpack_from("<i", data, e2 + 1)[0]
        attrs.append((data[pos:e], data[e + 1:e2], data[e2 + 5:e2 + 5 + n]))
        pos = e2 + 5 + n
    pos += 1
    a = {k: v for k, _t, v in attrs}
    if a[b"compression"] != b"\0":
        raise ValueError("EXR is compressed")
    sizes, cl, p = [], a[b"channels"], 0
    while cl[p] != 0:
        q = cl.index(b"\0", p)
        ptype = struct.unpack_from("<i", cl, q + 1)[0]
        sizes.append(2 if ptype == 1 else 4)
        p = q + 1 + 16
    x0, y0, x1, y1 = struct.unpack("<iiii", a[b"dataWindow"])
    W, H = x1 - x0 + 1, y1 - y0 + 1
    if x + w > W or y + h > H:
        raise RuntimeError("Blender wrote a %dx%d image, expected the whole frame" % (W, H))
    offsets = struct.unpack_from("<%dQ" % H, data, pos)
    window = struct.pack("<iiii", 0, 0, w - 1, h - 1)
    head = bytearray(data[:8])
    for k, t, v in attrs:
        if k in (b"dataWindow", b"displayWindow"):
            v = window
        head += k + b"\0" + t + b"\0" + struct.pack("<i", len(v)) + v
    for k, v in sorted(extra.items()):
        v = v.encode()
        head += k.encode() + b"\0string\0" + struct.pack("<i", len(v)) + v
    head += b"\0"
    line = sum(s * w for s in sizes)
    table = len(head) + 8 * h
    body = bytearray()
    for row in range(h):
        off = offsets[y + row]
        q = off + 8
        body += struct.pack("<ii", row, line)
        for s in sizes:
            body += data[q + x * s:q + (x + w) * s]
            q += W * s
    offs = b"".join(struct.pack("<Q", table + row * (8 + line)) for row in range(h))
    tmp = out + ".part"
    with open(tmp, "wb") as f:
        f.write(bytes(head) + offs + bytes(body))
    os.replace(tmp, out)


def crop_raw(exr_path, x, y, w, h):
    """Rows of the (x, y, w, h) rectangle of an uncropped float EXR."""
    W, H, rows = read_exr_none(exr_path)
    if x + w > W or y + h > H:
        raise RuntimeError("Blender wrote a %dx%d image, expected the %dx%d frame" % (W, H, W, H))
    return w, h, {c: [rows[c][yy][x:x + w] for yy in range(y, y + h)] for c in rows}


def set_passes_only(scene):
    """What a tile of a frame with a finishing task renders: the render
    layers without the compositor or denoising, with the denoising data
    (albedo, normal) stored, every pass in a 32-bit float multilayer
    OpenEXR. Returns a function that puts the scene back."""
    r, c, im = scene.render, scene.cycles, scene.render.image_settings
    saved = (r.use_compositing, c.use_denoising, im.file_format, im.color_depth, im.exr_codec,
             [(vl, vl.cycles.denoising_store_passes) for vl in scene.view_layers])
    r.use_compositing = False
    c.use_denoising = False
    for vl in scene.view_layers:
        vl.cycles.denoising_store_passes = True
    im.file_format = "OPEN_EXR_MULTILAYER"
    im.color_depth = "32"
    im.exr_codec = "ZIP"  # the stitched passes: lossless

    def restore():
        r.use_compositing, c.use_denoising = saved[0], saved[1]
        im.file_format, im.color_depth, im.exr_codec = saved[2], saved[3], saved[4]
        for vl, stored in saved[5]:
            vl.cycles.denoising_store_passes = stored
    return restore


def denoises(cycles, layer):
    """Whether Cycles (`scene.cycles`, None for other engines) denoises
    view layer `layer`'s render."""
    return bool(cycles is not None and cycles.use_denoising and layer is not None
                and getattr(layer.cycles, "use_denoising", True))


def denoised(t, cycles, layer, outs):
    """The Combined output of an Image node of the stitched passes (`outs`,
    its outputs by name), denoised as Cycles denoises view layer `layer`'s
    render (the scene's denoising passes, prefilter and quality); None
    where Cycles does not denoise that layer."""
    if not denoises(cycles, layer):
        return None
    dn = t.nodes.new("CompositorNodeDenoise")
    dn.prefilter = cycles.denoising_prefilter
    if hasattr(dn, "quality"):
        dn.quality = cycles.denoising_quality
    dn.use_hdr = True
    t.links.new(outs["Combined"], dn.inputs["Image"])
    wants = getattr(cycles, "denoising_input_passes", "RGB_ALBEDO_NORMAL")
    if "ALBEDO" in wants:
        t.links.new(outs["Denoising Albedo"], dn.inputs["Albedo"])
    if "NORMAL" in wants:
        t.links.new(outs["Denoising Normal"], dn.inputs["Normal"])
    return dn.outputs["Image"]


def stitched_layer(t, image, layer_name):
    """An Image node of view layer `layer_name` of the stitched passes, and
    its outputs by name."""
    src = t.nodes.new("CompositorNodeImage")
    src.image = image
    src.layer = layer_name
    outs = {o.name: o for o in src.outputs if o.enabled}
    if "Combined" not in outs:
        raise RuntimeError("the stitched passes lack view layer %r's Combined pass (%s)" % (
            layer_name, image.type))
    return outs


def finishing_compositor(scene, passes):
    """Rebuilds the scene's compositor to run on the stitched passes
    (a multilayer OpenEXR at `passes`) instead of a render: each Render
    Layers node becomes an Image node of its view layer, its Image output
    denoised as Cycles would have (the scene's denoising passes, prefilter
    and quality). A scene without a compositor gets Image -> Denoise ->
    Composite. With no Render Layers node left Blender renders nothing: it
    composites and writes the scene's output, with its dither and stamp.
    Returns the stitched passes' image, whether the scene composites, and
    the denoised Combined output of each view layer it denoised."""
    r = scene.render
    if not hasattr(scene, "node_tree"):
        raise Unsupported("the finishing step drives the compositor of Blender 4.x; "
                          "Blender %s keeps it elsewhere" % bpy.app.version_string)
    comp = scene.node_tree if scene.use_nodes else None
    compositing = bool(r.use_compositing and comp and len(comp.nodes) > 0)
    if not compositing:
        scene.use_nodes = True
        t = scene.node_tree
        for n in list(t.nodes):
            t.nodes.remove(n)
        rl = t.nodes.new("CompositorNodeRLayers")
        rl.layer = bpy.context.view_layer.name
        t.links.new(rl.outputs["Image"], t.nodes.new("CompositorNodeComposite").inputs["Image"])
    r.use_compositing = True
    t = scene.node_tree
    image = bpy.data.images.load(passes, check_existing=False)
    cycles = scene.cycles if r.engine == "CYCLES" else None
    done = {}
    for rl in [n for n in t.nodes if n.bl_idname == "CompositorNodeRLayers"]:
        layer = scene.view_layers.get(rl.layer)
        outs = stitched_layer(t, image, rl.layer)
        if rl.layer not in done:
            done[rl.layer] = denoised(t, cycles, layer, outs)
        image_out = done[rl.layer] or outs["Combined"]
        for sock in rl.outputs:
            if not sock.links:
                continue
            if sock.name == "Image":
                src_sock = image_out
            elif sock.name == "Noisy Image":
                src_sock = outs["Combined"]
            elif sock.name in outs:
                src_sock = outs[sock.name]
            else:
                raise RuntimeError("the compositor reads pass %r of view layer %r, which the "
                                   "stitched passes lack" % (sock.name, rl.layer))
            for link in list(sock.links):
                t.links.new(src_sock, link.to_socket)
        t.nodes.remove(rl)
    return image, compositing, {k: v for k, v in done.items() if v is not None}


def finishing_layers(scene, image, done, base_path):
    """For a multilayer OpenEXR output: a File Output node writes the
    Combined pass of every view layer Cycles denoises, denoised, to one
    float multilayer OpenEXR at `base_path` (`ViewLayer.Combined.R`, …),
    and returns the plan that completes the finished frame with the
    stitched passes (coordinator/src/exr/finish.rs): the scene's codec and
    precision, the denoising data the tiles kept for this step only, and
    the layers whose noisy Combined is also their Noisy Image."""
    r, im, t = scene.render, scene.render.image_settings, scene.node_tree
    cycles = scene.cycles if r.engine == "CYCLES" else None
    layers = [bpy.context.view_layer] if r.use_single_layer else [
        vl for vl in scene.view_layers if vl.use]
    # The layers Blender writes: a Render Layers node of another one
    # composites, but its Combined is not in the file.
    done = {vl.name: done[vl.name] for vl in layers if vl.name in done}
    for vl in layers:
        if vl.name not in done and denoises(cycles, vl):
            done[vl.name] = denoised(t, cycles, vl, stitched_layer(t, image, vl.name))
    if done:
        fo = t.nodes.new("CompositorNodeOutputFile")
        fo.format.file_format = "OPEN_EXR_MULTILAYER"
        fo.format.color_depth = "32"
        fo.format.exr_codec = "NONE"
        fo.base_path = base_path
        fo.layer_slots.clear()
        for name, sock in sorted(done.items()):
            fo.layer_slots.new(name + ".Combined")
            t.links.new(sock, fo.inputs[-1])
    drop = ["%s.%s" % (vl.name, p) for vl in layers
            if not getattr(vl.cycles, "denoising_store_passes", False)
            for p in ("Denoising Normal", "Denoising Albedo", "Denoising Depth")]
    return {"codec": im.exr_codec, "half": im.color_depth == "16", "drop": drop,
            "noisy": sorted(done)}


def exr_parts(path):
    """(header attributes as (name, type, value) bytes, [(channel name,
    bytes per sample, chlist entry tail)], width, height, scanline offsets,
    file bytes) of an uncompressed single-part scanline EXR."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x76\x2f\x31\x01" or data[5] & 0x1A:
        raise ValueError("%s is not a single-part scanline EXR" % path)
    pos, attrs = 8, []
    while data[pos] != 0:
        e = data.index(b"\0", pos)
        e2 = data.index(b"\0", e + 1)
        n = struct.unpack_from("<i", data, e2 + 1)[0]
        attrs.append((data[pos:e], data[e + 1:e2], data[e2 + 5:e2 + 5 + n]))
        pos = e2 + 5 + n
    pos += 1
    a = {k: v for k, _t, v in attrs}
    if a[b"compression"] != b"\0":
        raise ValueError("%s is compressed" % path)
    chans, cl, p = [], a[b"channels"], 0
    while cl[p] != 0:
        q = cl.index(b"\0", p)
        ptype = struct.unpack_from("<i", cl, q + 1)[0]
        chans.append((cl[p:q], 2 if ptype == 1 else 4, cl[q + 1:q + 17]))
        p = q + 17
    x0, y0, x1, y1 = struct.unpack("<iiii", a[b"dataWindow"])
    w, h = x1 - x0 + 1, y1 - y0 + 1
    return attrs, chans, w, h, struct.unpack_from("<%dQ" % h, data, pos), data


def merge_exr(sources, out, extra):
    """Writes to `out` one uncompressed scanline EXR of the channels that
    `keep(name)` picks from each `(path, keep)` of `sources` (uncompressed
    scanline EXRs of one size), samples copied as they are, with the first
    source's header attributes plus the string attributes `extra`."""
    parts = [exr_parts(path) for path, _keep in sources]
    w, h = parts[0][2], parts[0][3]
    picked = []
    for k, ((_path, keep), (_a, chans, pw, ph, _o, _d)) in enumerate(zip(sources, parts)):
        if (pw, ph) != (w, h):
            raise RuntimeError("Blender wrote a %dx%d and a %dx%d image" % (w, h, pw, ph))
        start = 0
        for name, size, tail in chans:
            if keep(name.decode("utf-8", "replace")):
                picked.append((name, k, start, size, tail))
            start += size * w
    picked.sort()
    chlist = b"".join(name + b"\0" + tail for name, _k, _s, _z, tail in picked) + b"\0"
    version = struct.unpack_from("<I", parts[0][5], 4)[0]
    if any(len(name) > 31 for name, *_rest in picked):
        version |= 0x400  # long names
    head = bytearray(b"\x76\x2f\x31\x01") + struct.pack("<I", version)
    for name, kind, value in parts[0][0]:
        if name == b"channels":
            value = chlist
        head += name + b"\0" + kind + b"\0" + struct.pack("<i", len(value)) + value
    for name, value in sorted(extra.items()):
        value = value.encode()
        head += name.encode() + b"\0string\0" + struct.pack("<i", len(value)) + value
    head += b"\0"
    line = sum(size * w for _n, _k, _s, size, _t in picked)
    table = len(head) + 8 * h
    body = bytearray()
    first = parts[0]
    for row in range(h):
        body += struct.pack("<ii", struct.unpack_from("<i", first[5], first[4][row])[0], line)
        for _name, k, start, size, _tail in picked:
            q = parts[k][4][row] + 8 + start
            body += parts[k][5][q:q + size * w]
    offs = b"".join(struct.pack("<Q", table + row * (8 + line)) for row in range(h))
    tmp = out + ".part"
    with open(tmp, "wb") as f:
        f.write(bytes(head) + offs + bytes(body))
    os.replace(tmp, out)


class Session:
    def __init__(self, cfg):
        self.cfg = cfg
        self.scratch = None
        scene = bpy.context.scene
        c = scene.cycles if scene.render.engine == "CYCLES" else None
        self.base_samples = c.samples if c else None
        self.base_offset = c.sample_offset if c else 0
        self.base_eevee = scene.eevee.taa_render_samples
        im = scene.render.image_settings
        self.base_image = (im.file_format, im.color_depth, im.color_mode, im.exr_codec)
        self.base_filepath = scene.render.filepath
        self.base_ext = scene.render.use_file_extension
        # Blender's own word on how each render ended.
        self.events = []
        ev = self.events

        @bpy.app.handlers.persistent
        def on_complete(*_a):
            ev.append("complete")

        @bpy.app.handlers.persistent
        def on_cancel(*_a):
            ev.append("cancel")

        bpy.app.handlers.render_complete.append(on_complete)
        bpy.app.handlers.render_cancel.append(on_cancel)
        # Test hook: the first render of the farm (marker file absent) fails.
        fail = os.environ.get("TESSERA_TEST_FAIL_FIRST_RENDER", "")
        self.fail_marker = fail if os.path.isabs(fail) else None
        self.poisoned = False

    def render(self, cmd):
        if os.environ.get("TESSERA_TEST_STALL_RENDER") == "1":
            while True:
                time.sleep(3600)
        scene = bpy.context.scene
        r = scene.render
        frame = cmd.get("frame")
        if not isinstance(frame, int) or isinstance(frame, bool):
            raise ValueError("frame must be an integer")
        out = cmd.get("out")
        if not isinstance(out, str) or not os.path.isabs(out) or "\x00" in out:
            raise ValueError("out must be an absolute path")
        raw = bool(cmd.get("raw", False))
        W = r.resolution_x * r.resolution_percentage // 100
        H = r.resolution_y * r.resolution_percentage // 100

        tile = cmd.get("tile")
        if tile is None:
            x, y, w, h = 0, 0, W, H
        else:
            if (not isinstance(tile, list) or len(tile) != 4
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in tile)):
                raise ValueError("tile must be [x, y, w, h] integers")
            x, y, w, h = tile
            if w <= 0 or h <= 0 or x < 0 or y < 0 or x + w > W or y + h > H:
                raise ValueError("tile %s outside the %dx%d frame" % (tile, W, H))
        whole = (x, y, w, h) == (0, 0, W, H)

        samples = cmd.get("samples")
        if samples is not None and (
                not isinstance(samples, list) or len(samples) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in samples)
                or not 0 <= samples[0] < samples[1]):
            raise ValueError("samples must be [start, end] with 0 <= start < end")
        n_samples = 0
        margin = 0
        subset = False
        if r.engine == "CYCLES":
            c = scene.cycles
            if samples is None:
                c.samples, c.sample_offset = self.base_samples, self.base_offset
                set_sample_subset(c, None, None)
            else:
                subset = set_sample_subset(c, samples, cmd.get("total"))
            n_samples = c.samples if samples is None else samples[1] - samples[0]
            if not whole:
                margin = adaptive_margin(scene, c.samples)
        else:
            # Eevee and Workbench render whole frames; a sample count
            # [0, N] (the job's) is Eevee's render samples, Workbench has none.
            if samples is not None and samples[0] != 0:
                raise ValueError("sample ranges need Cycles (engine is %s)" % r.engine)
            if not whole:
                raise ValueError("tiles need Cycles (engine is %s)" % r.engine)
            if r.engine in {"BLENDER_EEVEE", "BLENDER_EEVEE_NEXT"}:
                scene.eevee.taa_render_samples = samples[1] if samples else self.base_eevee
                n_samples = scene.eevee.taa_render_samples
            err = gpu_context_error()
            if err:
                raise RuntimeError(err)
        if whole:
            r.use_border = False
            r.use_crop_to_border = False
        else:
            bx, by = max(0, x - margin), max(0, y - margin)
            bw, bh = min(W, x + w + margin) - bx, min(H, y + h + margin) - by
            set_border(scene, W, H, bx, by, bw, bh)

        passes_only = bool(cmd.get("passes", False))
        if passes_only and not (raw and cmd.get("layers") and r.engine == "CYCLES"):
            raise ValueError("passes are rendered by Cycles as raw multilayer OpenEXR tiles")
        restore = set_passes_only(scene) if passes_only else None
        try:
            return self._render_task(scene, cmd, frame, out, raw, x, y, w, h, whole, n_samples,
                                     subset)
        finally:
            if restore:
                restore()

    def _render_task(self, scene, cmd, frame, out, raw, x, y, w, h, whole, n_samples, subset):
        r = scene.render
        missing = missing_feature(scene)
        if missing:
            raise Unsupported(missing)
        asked = asked_passes(scene)

        parent = os.path.dirname(out)
        if parent:
            os.makedirs(parent, exist_ok=True)
        scene.frame_set(frame)
        im = r.image_settings
        t0 = time.monotonic()
        if self.poisoned:
            raise RuntimeError("this session already failed a render (test hook)")
        if self.fail_marker and not os.path.exists(self.fail_marker):
            # Test hook: fail the first render, and refuse every later one in
            # the same process, so a worker that reuses a failed session
            # never finishes its job.
            open(self.fail_marker, "w").close()
            self.poisoned = True
            raise RuntimeError("injected first-render failure (test hook)")
        if self.scratch is None:
            self.scratch = tempfile.mkdtemp(prefix="tessera-out-")
        if raw and cmd.get("layers") and im.file_format in {"OPEN_EXR", "OPEN_EXR_MULTILAYER"}:
            # A tile of an OpenEXR frame: the scene's own EXR (every layer,
            # pass and Cryptomatte layer, its precision) uncompressed, cut
            # to the tile; the stitched frame gets the scene's codec.
            exr = os.path.join(self.scratch, "tile.exr")
            result = self._render(scene, write_still=False)
            codec = im.exr_codec
            im.exr_codec = "NONE"
            try:
                result.save_render(exr, scene=scene)
            finally:
                im.exr_codec = codec
            ev = evidence(exr)
            crop_exr(exr, out, x, y, w, h, {"tessera.compression": codec})
            os.unlink(exr)
            ev.update(width=w, height=h)
            crop = None
        elif raw:
            exr = os.path.join(self.scratch, "tile.exr")
            result = self._render(scene, write_still=False)
            im.file_format, im.color_depth, im.color_mode, im.exr_codec = "OPEN_EXR", "32", "RGBA", "NONE"
            try:
                result.save_render(exr, scene=scene)
            finally:
                im.file_format, im.color_depth, im.color_mode, im.exr_codec = self.base_image
            ev = evidence(exr)
            cw, ch, rows = crop_raw(exr, x, y, w, h)
            write_raw_rows(cw, ch, rows, out, n_samples)
            os.unlink(exr)
            ev.update(width=cw, height=ch)
            crop = None
        else:
            # Blender writes the whole frame (borders are not cropped); the
            # worker cuts the tile out of it.
            full = os.path.join(self.scratch, "frame")
            r.filepath = full
            r.use_file_extension = False
            if r.is_movie_format:
                im.file_format = "PNG"   # a movie cannot be written per tile: PNG frames
            try:
                self._render(scene, write_still=True)
            finally:
                r.filepath, r.use_file_extension = self.base_filepath, self.base_ext
                im.file_format = self.base_image[0]
            if not os.path.isfile(full):
                raise RuntimeError("Blender wrote no image")
            ev = evidence(full)
            os.replace(full, out)
            crop = None if whole else [x, y, w, h]
        ms = int((time.monotonic() - t0) * 1000)
        if ev is None:
            raise RuntimeError("Blender wrote an image this worker cannot read back")
        return {"ok": True, "out": out, "width": w, "height": h, "ms": ms, "samples": n_samples,
                "subset": subset, "engine": r.engine, "crop": crop, "evidence": ev,
                "asked_passes": asked}

    def finish(self, cmd):
        """The finishing task: composites (and denoises) the whole frame's
        stitched passes and writes the scene's own output."""
        scene = bpy.context.scene
        r = scene.render
        frame = cmd.get("frame")
        if not isinstance(frame, int) or isinstance(frame, bool):
            raise ValueError("frame must be an integer")
        for key in ("out", "passes"):
            v = cmd.get(key)
            if not isinstance(v, str) or not os.path.isabs(v) or "\x00" in v:
                raise ValueError("%s must be an absolute path" % key)
        out, passes = cmd["out"], cmd["passes"]
        if not os.path.isfile(passes):
            raise ValueError("no stitched passes at %s" % passes)
        if r.is_movie_format:
            raise ValueError("a movie output cannot be finished frame by frame")
        W = r.resolution_x * r.resolution_percentage // 100
        H = r.resolution_y * r.resolution_percentage // 100
        missing = missing_feature(scene)
        if missing:
            raise Unsupported(missing)
        r.use_border = False
        r.use_crop_to_border = False
        if r.engine == "CYCLES":
            set_sample_subset(scene.cycles, None, None)
        image, compositing, done = finishing_compositor(scene, passes)
        if self.scratch is None:
            self.scratch = tempfile.mkdtemp(prefix="tessera-out-")
        im = r.image_settings
        multilayer = im.file_format == "OPEN_EXR_MULTILAYER"
        if multilayer:
            # Blender writes what this step made (the composite, each
            # denoised layer's Combined) in float; the coordinator completes
            # it with the stitched passes, in the scene's codec and depth.
            layers_dir = os.path.join(self.scratch, "layers")
            shutil.rmtree(layers_dir, ignore_errors=True)
            os.makedirs(layers_dir)
            plan = finishing_layers(scene, image, done, os.path.join(layers_dir, "layers_"))
            codec = im.exr_codec
            im.color_depth, im.exr_codec = "32", "NONE"
        parent = os.path.dirname(out)
        if parent:
            os.makedirs(parent, exist_ok=True)
        scene.frame_set(frame)
        full = os.path.join(self.scratch, "frame")
        r.filepath = full
        r.use_file_extension = False
        t0 = time.monotonic()
        self._render(scene, write_still=True)
        if not os.path.isfile(full):
            raise RuntimeError("Blender wrote no image")
        if multilayer:
            # The step's own render result holds the composite; its view
            # layers rendered nothing.
            sources = [(full, lambda c: compositing and c.startswith("Composite."))]
            sources += [(os.path.join(layers_dir, f), lambda c: True)
                        for f in sorted(os.listdir(layers_dir))]
            merge_exr(sources, full, {"tessera.compression": codec,
                                      "tessera.finish": json.dumps(plan, sort_keys=True)})
        ev = evidence(full)
        os.replace(full, out)
        return {"ok": True, "out": out, "width": W, "height": H,
                "ms": int((time.monotonic() - t0) * 1000), "samples": 0, "subset": False,
                "engine": r.engine, "crop": None, "evidence": ev, "asked_passes": None,
                "finished": True}

    def _render(self, scene, write_still):
        self.events.clear()
        res = bpy.ops.render.render(write_still=write_still, scene=scene.name)
        if "FINISHED" not in res:
            raise RuntimeError("render did not finish: %s" % ",".join(sorted(res)))
        if "cancel" in self.events or "complete" not in self.events:
            raise RuntimeError("Blender did not complete the render (%s)" % (
                ", ".join(self.events) or "no render events"))
        result = bpy.data.images.get("Render Result")
        if result is None:
            raise RuntimeError("no render result")
        return result

    def cleanup(self):
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


# The formats a job may write its frames in instead of the file's own.
_FILE_FORMATS = ("JPEG", "PNG", "OPEN_EXR")


def set_file_format(scene, fmt):
    """The job's format for whole frames (an OpenJD template's
    --render-format), as `blender --render-format` sets it; None keeps the
    file's own. Tiles still travel in float and finishing tasks write this."""
    if fmt is None:
        return
    if fmt not in _FILE_FORMATS:
        raise ValueError("file_format must be one of %s" % ", ".join(_FILE_FORMATS))
    scene.render.image_settings.file_format = fmt


def main():
    t_setup = time.monotonic()
    argv = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    if len(argv) != 1:
        log("error: usage: ... --python-expr <session.py> -- SESSION.json")
        sys.exit(2)
    if not bpy.data.filepath:
        log("error: no .blend file was loaded")
        sys.exit(4)
    with open(argv[0]) as f:
        cfg = json.load(f)
    remap = Remapper(cfg)
    sess = None
    try:
        remap.run()
        scene = bpy.context.scene
        device = "n/a"
        if scene.render.engine == "CYCLES":
            device = configure_device(scene, cfg.get("device"), cfg.get("gpu_index"),
                                      cfg.get("gpu_pci_bus_id"))
        scene.render.use_persistent_data = bool(cfg.get("persistent_data", True))
        set_file_format(scene, cfg.get("file_format"))
        sess = Session(cfg)
        setup_ms = int((time.monotonic() - t_setup) * 1000)
        for w in remap.warnings:
            log("warning: " + w)
        log("ready: %d references remapped, device %s, %d ms" % (remap.remapped, device, setup_ms))
        while True:
            line = sys.stdin.readline()
            if not line:
                break
            line = line.strip()
            if not line:
                continue
            try:
                cmd = json.loads(line)
                if not isinstance(cmd, dict):
                    raise ValueError("command must be a JSON object")
                op = cmd.get("op")
                if op == "quit":
                    break
                elif op == "ping":
                    reply({"ok": True, "pong": True, "setup_ms": setup_ms,
                           "blender_version": bpy.app.version_string, "device": device,
                           "remapped": remap.remapped, "warnings": remap.warnings})
                elif op == "render":
                    reply(sess.render(cmd))
                elif op == "finish":
                    reply(sess.finish(cmd))
                else:
                    raise ValueError("unknown op %r" % (op,))
            except Exception as e:
                unsupported = isinstance(e, Unsupported)
                reply({"ok": False, "error": one_line(str(e) if unsupported else e),
                       "unsupported": unsupported})
    finally:
        if sess:
            sess.cleanup()
        remap.cleanup()


try:
    main()
except SystemExit:
    raise
except BaseException as e:  # setup failure: one line, never Blender's "script failed, expr: <source>"
    log("error: " + one_line(e))
    sys.stdout.flush()
    sys.exit(4)
