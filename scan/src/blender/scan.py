# Tessera dependency scan. Runs inside Blender on the submitting machine:
#
#   blender -b --factory-startup --disable-autoexec FILE.blend \
#       --python-exit-code 3 --python-expr <this source> -- OUT.json
#
# Writes OUT.json describing the scene's render settings and every external file
# the .blend needs (images incl. sequences and UDIM tiles, linked libraries
# (indirect ones too), fonts, sounds, movie clips, volumes, caches). Packed data
# is skipped (it is inside the .blend); the main .blend itself is not listed.
# Missing files are listed with "exists": false.
#
# Remote mode (`-- OUT.json --remote ARTIST.blend`), for a farm scan on a
# worker that holds only this one file: paths are resolved against the
# artist's path of the file, nothing is looked up on this disk, and linked
# data is left to the scans of its libraries. Each file carries "check":
# "file", "sequence" (one member named: list its folder), "dir" (take every
# file under it) or "optional" (found by blend_paths: a file if it is one);
# the client does those checks on its own disk.
#
# Self-contained (stdlib + bpy): embedded in the worker/client binary.
# Exit codes: 0 ok; 2 bad arguments / could not write OUT.json; 4 no file
# loaded (Blender itself exits 1 before running this when the .blend is
# unreadable, printing "Error: ..." on stdout).

import json
import os
import re
import sys

import bpy


def strips_of(editor):
    """Every strip of a sequence editor (Blender 5 renamed them)."""
    strips = getattr(editor, "strips_all", None)
    return strips if strips is not None else editor.sequences_all


def _fail(code, msg):
    sys.stderr.write("tessera-scan: error: %s\n" % msg)
    sys.stderr.flush()
    sys.exit(code)


_SEQ_RE = re.compile(r"^(.*?)(\d+)(\D*)$")
# A file Blender ships: under an installation's X.Y/datafiles (brushes,
# fonts, the asset bundles a default 4.x scene references by a path that
# breaks when the file moves). Never listed, never warned about: the
# worker's own Blender has it. The user's own Blender folder
# (~/.config/blender/X.Y) is not an installation, and a file that exists is
# Blender's only in an installation (its X.Y folder holds `scripts`): a
# project's own assets/4.5/datafiles is the artist's. A farm scan leaves
# the call to the client, which has the artist's files. The client applies
# the same rule (share::blender_own).
_BLENDER_OWN_RE = re.compile(r"(^|/)\d{1,3}\.\d{1,3}/datafiles(/|$)")


def blender_own(path):
    m = _BLENDER_OWN_RE.search(path)
    if m is None or "/.config/" in path[:m.start() + 1] or REMOTE is not None:
        return False
    release = path[:m.end()].rstrip("/")
    release = release[: len(release) - len("datafiles")].rstrip("/")
    return not os.path.exists(path) or os.path.isdir(os.path.join(release, "scripts"))
_UDIM_TOKENS = ("<UDIM>", "<UVTILE>")
# The artist's path of the file in remote mode, else None.
REMOTE = None


def linked_elsewhere(idb):
    """In remote mode, data linked from a library: its library's own scan
    lists what it uses (this worker does not hold the library)."""
    return REMOTE is not None and getattr(idb, "library", None) is not None


class Scan:
    def __init__(self):
        self.files = {}       # normalised path -> entry
        self.warnings = []
        self.covered = set()  # every path we resolved ourselves (for the blend_paths cross-check)

    # -- path helpers ------------------------------------------------------

    @staticmethod
    def resolve(path, owner):
        """Absolute, normalised path of `path` as stored in datablock `owner`."""
        if os.sep == "/" and path.startswith("//") and "\\" in path:
            path = path.replace("\\", "/")  # relative path saved on Windows
        lib = getattr(owner, "library", None) if owner is not None else None
        if isinstance(owner, bpy.types.Library):
            lib = None  # Library.filepath is relative to the main file
        if REMOTE is not None:
            start = os.path.dirname(REMOTE)
            return os.path.normpath(bpy.path.abspath(path, start=start))
        return os.path.normpath(bpy.path.abspath(path, library=lib))

    def add(self, path, kind, user, check="file"):
        p = os.path.normpath(path)
        self.covered.add(p)
        if p in self.files or blender_own(p):
            return
        entry = {"path": p, "kind": kind, "user": user, "exists": False}
        if REMOTE is None:
            entry["exists"] = os.path.isfile(p)
        else:
            entry["check"] = check
        self.files[p] = entry

    def add_sequence(self, path, kind, user):
        """`path` names one file of a numbered sequence: add every existing
        member (same directory, same text around the last run of digits)."""
        if REMOTE is not None:
            self.add(path, kind, user, "sequence")
            return
        d, base = os.path.split(path)
        m = _SEQ_RE.match(base)
        found = []
        if m and os.path.isdir(d):
            head, tail = m.group(1), m.group(3)
            pat = re.compile(r"^%s\d+%s$" % (re.escape(head), re.escape(tail)))
            try:
                names = sorted(os.listdir(d))
            except OSError:
                names = []
            found = [os.path.join(d, n) for n in names
                     if pat.match(n) and os.path.isfile(os.path.join(d, n))]
        self.covered.add(os.path.normpath(path))
        if not found:
            self.add(path, kind, user)  # reported missing
            return
        for f in found:
            self.add(f, kind, user)

    def add_udim(self, path, tiles, kind, user):
        for t in tiles:
            num = t.number
            u, v = (num - 1001) % 10, (num - 1001) // 10
            p = path.replace("<UDIM>", "%d" % num).replace("<UVTILE>", "u%d_v%d" % (u + 1, v + 1))
            self.add(p, kind, user)
        self.covered.add(os.path.normpath(path))

    # -- datablocks ----------------------------------------------------------

    def images(self):
        for img in bpy.data.images:
            if linked_elsewhere(img):
                continue
            if img.source not in {"FILE", "SEQUENCE", "MOVIE", "TILED"}:
                continue
            if img.packed_file is not None or len(img.packed_files) > 0 or not img.filepath:
                continue
            user = "Image '%s'" % img.name_full
            path = self.resolve(img.filepath, img)
            if img.source == "TILED" or any(t in path for t in _UDIM_TOKENS):
                if not any(t in path for t in _UDIM_TOKENS):
                    # pre-token tiled path such as tex.1001.png
                    path = re.sub(r"1\d{3}(?=\D*$)", "<UDIM>", path, count=1)
                self.add_udim(path, img.tiles, "image", user)
            elif img.source == "SEQUENCE":
                self.add_sequence(path, "image", user)
            else:
                self.add(path, "image", user)

    def libraries(self):
        for lib in bpy.data.libraries:
            if lib.packed_file is not None:
                continue
            if REMOTE is not None and getattr(lib, "parent", None) is not None:
                continue  # an indirect library: its parent's scan lists it
            # Blender rebases indirect libraries' paths onto the main file at load.
            self.add(self.resolve(lib.filepath, lib), "library", "Library '%s'" % lib.name)

    def simple(self, collection, kind, label, seq_attr=None):
        for idb in collection:
            if linked_elsewhere(idb):
                continue
            fp = idb.filepath
            if not fp or fp == "<builtin>" or getattr(idb, "packed_file", None) is not None:
                continue
            user = "%s '%s'" % (label, idb.name_full)
            path = self.resolve(fp, idb)
            if seq_attr and seq_attr(idb):
                self.add_sequence(path, kind, user)
            else:
                self.add(path, kind, user)

    def strips(self):
        for scene in bpy.data.scenes:
            ed = scene.sequence_editor
            if ed is None or linked_elsewhere(scene):
                continue
            for s in strips_of(ed):
                user = "Strip '%s' (scene '%s')" % (s.name, scene.name_full)
                if s.type == "IMAGE":
                    d = self.resolve(s.directory, scene)
                    for e in s.elements:
                        self.add(os.path.join(d, e.filename), "image", user)
                elif s.type == "MOVIE":
                    self.add(self.resolve(s.filepath, scene), "movieclip", user)

    def modifiers_and_caches(self):
        for ob in bpy.data.objects:
            if linked_elsewhere(ob):
                continue
            for md in ob.modifiers:
                user = "Object '%s' modifier '%s'" % (ob.name_full, md.name)
                if md.type == "MESH_CACHE" and md.filepath:
                    self.add(self.resolve(md.filepath, ob), "cache", user)
                elif md.type == "FLUID" and md.fluid_type == "DOMAIN":
                    d = self.resolve(md.domain_settings.cache_directory, ob)
                    if REMOTE is not None:
                        self.add(d, "cache", user, "dir")
                    elif os.path.isdir(d):
                        for root, _dirs, names in os.walk(d):
                            for n in sorted(names):
                                self.add(os.path.join(root, n), "cache", user)
                        self.covered.add(os.path.normpath(d))
                    else:
                        self.warnings.append("%s: fluid cache directory %s not found" % (user, d))
                        self.covered.add(os.path.normpath(d))
            for ps in getattr(ob, "particle_systems", []):
                pc = ps.point_cache
                if pc.use_disk_cache or pc.use_external:
                    self.warnings.append(
                        "Object '%s' particle system '%s' uses a disk point cache; it is not carried"
                        % (ob.name_full, ps.name))

    def cross_check(self):
        """Anything Blender's own path walker knows and we did not cover."""
        if REMOTE is not None:
            try:
                paths = bpy.utils.blend_paths(absolute=False, packed=False, local=True)
            except Exception as e:  # pragma: no cover
                self.warnings.append("bpy.utils.blend_paths failed: %s" % e)
                return
            for p in paths:
                if any(t in p for t in _UDIM_TOKENS):
                    continue
                n = self.resolve(p, None)
                if n not in self.covered and n not in self.files and not blender_own(n):
                    self.add(n, "other", "unknown (found by bpy.utils.blend_paths)", "optional")
            return
        try:
            paths = bpy.utils.blend_paths(absolute=True, packed=False, local=False)
        except Exception as e:  # pragma: no cover
            self.warnings.append("bpy.utils.blend_paths failed: %s" % e)
            return
        for p in paths:
            if any(t in p for t in _UDIM_TOKENS):
                continue
            n = os.path.normpath(p)
            if n in self.covered or n in self.files or blender_own(n):
                continue
            if os.path.isfile(n):
                self.add(n, "other", "unknown (found by bpy.utils.blend_paths)")
            elif not os.path.isdir(n):
                self.warnings.append("referenced path not found: %s" % n)

    def run(self):
        steps = [
            ("images", self.images),
            ("libraries", self.libraries),
            ("fonts", lambda: self.simple(bpy.data.fonts, "font", "Font")),
            ("sounds", lambda: self.simple(bpy.data.sounds, "sound", "Sound")),
            ("movie clips", lambda: self.simple(bpy.data.movieclips, "movieclip", "MovieClip",
                                                lambda c: c.source == "SEQUENCE")),
            ("volumes", lambda: self.simple(bpy.data.volumes, "volume", "Volume",
                                            lambda v: v.is_sequence)),
            ("cache files", lambda: self.simple(bpy.data.cache_files, "cache", "CacheFile",
                                                lambda c: c.is_sequence)),
            ("sequencer strips", self.strips),
            ("modifiers", self.modifiers_and_caches),
            ("cross-check", self.cross_check),
        ]
        for name, fn in steps:
            try:
                fn()
            except Exception as e:
                self.warnings.append("scan of %s failed: %s: %s" % (name, type(e).__name__, e))
        main = os.path.normpath(REMOTE or bpy.data.filepath)
        self.files.pop(main, None)


def compression(path):
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError:
        return None
    if magic == b"\x28\xb5\x2f\xfd":
        return "zstd"
    if magic[:2] == b"\x1f\x8b":
        return "gzip"
    return None


def output_name(r):
    """The file-name template Blender names frames by: the file-name part of
    the output path, with a #### frame number appended where it has no #
    (Blender's default "/tmp/" gives "####.png"), and the format's
    extension when "File Extensions" is on."""
    base = os.path.basename(r.filepath.replace("\\", "/"))
    if "#" not in base:
        base += "####"
    if r.use_file_extension:
        ext = r.file_extension
        if not base.lower().endswith(ext.lower()):
            base += ext
    return base


def settings(scan):
    scene = bpy.context.scene
    r = scene.render
    im = r.image_settings
    w = (r.resolution_x * r.resolution_percentage) // 100
    h = (r.resolution_y * r.resolution_percentage) // 100
    out = {
        "blender_version": bpy.app.version_string,
        "scene": scene.name,
        "render_engine": r.engine,
        "frame_start": scene.frame_start,
        "frame_end": scene.frame_end,
        "frame_step": scene.frame_step,
        "resolution": [w, h],
        "resolution_percentage": r.resolution_percentage,
        "file_format": im.file_format,
        "color_depth": im.color_depth,
        "color_mode": im.color_mode,
        "dither": r.dither_intensity,
        "film_transparent": r.film_transparent,
        "compressed": compression(bpy.data.filepath),
        "output_name": output_name(r),
    }
    # Settings whose effect depends on how the job is split: the submitting
    # client turns them into warnings only when they apply.
    # Blender 5 keeps the compositor's nodes in `compositing_node_group`.
    comp = getattr(scene, "node_tree", None) if getattr(scene, "use_nodes", True) else None
    comp = comp or getattr(scene, "compositing_node_group", None)
    out.update(time_limit=False, layer_sample_overrides=[],
               compositing=bool(r.use_compositing and comp and len(comp.nodes) > 0),
               stamp_burn_in=bool(r.use_stamp), is_movie=bool(r.is_movie_format))
    if r.engine == "CYCLES":
        c = scene.cycles
        out.update(samples=c.samples, use_adaptive_sampling=c.use_adaptive_sampling,
                   use_denoising=c.use_denoising, seed=c.seed,
                   use_animated_seed=c.use_animated_seed, device=c.device,
                   time_limit=c.time_limit > 0)
        # What the renderer must have: OSL, and OpenImageDenoise unless OptiX denoises.
        out["use_osl"] = bool(c.shading_system)
        out["denoiser"] = getattr(c, "denoiser", "OPENIMAGEDENOISE")
        # Blender 4.2+: blue-noise patterns depend on the total sample count.
        out["sampling_pattern"] = getattr(c, "sampling_pattern", "")
        if c.use_layer_samples != "IGNORE":
            out["layer_sample_overrides"] = [
                "%s (%d)" % (vl.name, vl.samples) for vl in scene.view_layers
                if vl.use and vl.samples > 0]
    elif r.engine in {"BLENDER_EEVEE", "BLENDER_EEVEE_NEXT"}:
        out.update(samples=scene.eevee.taa_render_samples, use_adaptive_sampling=False,
                   use_denoising=False)
    else:
        # Workbench (and any other engine) has no sample count to split.
        out.update(samples=1, use_adaptive_sampling=False, use_denoising=False)
    if r.use_border:
        scan.warnings.append("the scene renders only a border region (render.use_border); "
                             "the farm renders whole frames")
    if r.use_multiview:
        scan.warnings.append("multiview/stereo output is not supported; only the default view is handled")
    py_drivers = 0
    for coll in (bpy.data.objects, bpy.data.meshes, bpy.data.materials, bpy.data.shape_keys,
                 bpy.data.scenes, bpy.data.cameras, bpy.data.lights, bpy.data.node_groups, bpy.data.worlds):
        for idb in coll:
            ad = getattr(idb, "animation_data", None)
            if ad:
                py_drivers += sum(1 for fc in ad.drivers
                                  if fc.driver.type == "SCRIPTED" and not fc.driver.is_simple_expression)
    if py_drivers:
        scan.warnings.append("%d driver(s) use Python expressions, which do not run on the farm "
                             "(scripts are disabled)" % py_drivers)
    if not scene.camera:
        scan.warnings.append("the scene has no camera")
    for lib in bpy.data.libraries if REMOTE is None else []:  # remote: the client checks
        path = Scan.resolve(lib.filepath, lib)
        if lib.packed_file is None and not os.path.isfile(path) and not blender_own(path):
            scan.warnings.append("library %s is missing: data it links in (and its own "
                                 "libraries) cannot be scanned" % Scan.resolve(lib.filepath, lib))
    return out


def main():
    global REMOTE
    argv = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    if len(argv) == 3 and argv[1] == "--remote":
        REMOTE = os.path.normpath(argv[2])
        argv = argv[:1]
    if len(argv) != 1:
        _fail(2, "usage: ... --python-expr <scan.py> -- OUT.json [--remote ARTIST.blend]")
    if not bpy.data.filepath:
        _fail(4, "no .blend file was loaded")
    scan = Scan()
    out = settings(scan)
    scan.run()
    out["files"] = sorted(scan.files.values(), key=lambda e: e["path"])
    out["warnings"] = scan.warnings
    tmp = argv[0] + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(out, f, indent=1)
        os.replace(tmp, argv[0])
    except OSError as e:
        _fail(2, "cannot write %s: %s" % (argv[0], e))
    print("tessera-scan: %d files, %d missing, %d warnings" % (
        len(out["files"]), sum(1 for e in out["files"] if not e["exists"]), len(out["warnings"])))


try:
    main()
except SystemExit:
    raise
except BaseException as e:  # one line, not Blender's "script failed, expr: <whole source>"
    _fail(3, "%s: %s" % (type(e).__name__, str(e).replace("\n", " ")))
