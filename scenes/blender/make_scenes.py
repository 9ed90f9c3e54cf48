# Tessera test-scene generator. Run with Blender (3.4+):
#
#   blender -b --factory-startup --python scenes/blender/make_scenes.py -- \
#       --project DIR --external DIR2 [--exr] [--trap MARKER_PATH]
#
# Writes into DIR:
#   shot.blend            Cycles/CPU, 96x64 @100%, 16 samples, seed 0, adaptive
#                         sampling and denoising off, dither 0, frames 1-6 with
#                         an animated camera and cube; PNG 8-bit RGBA (or
#                         OPEN_EXR float 32 with --exr). References:
#                           //textures/rel.png          (relative)
#                           DIR2/ext.png                (absolute, outside DIR)
#                           //textures/seq/seq_0001..0006.png (image sequence)
#                           //textures/udim/grid.<UDIM>.png   (tiles 1001,1002)
#                           //lib/props.blend           (linked collection "Props")
#   shot_zstd.blend       the same scene saved compressed (zstd in 3.x)
#   lib/props.blend       collection "Props": cube with //tex/lib.png and the
#                         object "DeepBall" linked from //deep/deep.blend
#   lib/deep/deep.blend   object "DeepBall" with //tex/deep.png
#   (the libraries, missing, extras and trap are saved zstd-compressed: an
#   uncompressed .blend is >= 130 KiB of struct definitions alone)
#   missing.blend         like a tiny shot whose texture //textures/nope.png is missing
#   extras.blend          scan coverage only (not rendered): font, sound, movie
#                         clip (image sequence), volume sequence (dummy files)
#   trap.blend            (--trap) a registered text block that would write MARKER_PATH
# and DIR2/ext.png.
#
# Textures are written by a tiny stdlib PNG encoder, so output is deterministic.
# No numpy: Debian's blender package does not pull it in.

import argparse
import math
import os
import struct
import sys
import zlib

import bmesh
import bpy

# --------------------------------------------------------------------------
# helpers


def write_png(path, w, h, pixel):
    """Write an 8-bit RGB PNG; pixel(x, y) -> (r, g, b) ints, y=0 is the top row."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    raw = bytearray()
    for y in range(h):
        raw.append(0)  # filter: none
        for x in range(w):
            raw.extend(bytes(pixel(x, y)))

    def chunk(tag, data):
        c = struct.pack(">I", len(data)) + tag + data
        return c + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n"
    png += chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(bytes(raw), 9))
    png += chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


def reset():
    bpy.ops.wm.read_factory_settings(use_empty=True)
    prefs = bpy.context.preferences.filepaths
    prefs.save_version = 0              # no .blend1 backups
    prefs.file_preview_type = "NONE"    # no 64 KiB thumbnail in every file
    # keep the files small: one workspace instead of eleven
    bpy.data.batch_remove([w for w in bpy.data.workspaces if w.name != "Layout"])
    return bpy.context.scene


def save(path, compress=False, copy=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    bpy.ops.wm.save_as_mainfile(filepath=path, compress=compress, copy=copy,
                                relative_remap=True)


def mesh_object(name, kind, coll, loc=(0, 0, 0), size=1.0):
    me = bpy.data.meshes.new(name)
    bm = bmesh.new()
    if kind == "cube":
        bmesh.ops.create_cube(bm, size=size)
    elif kind == "plane":
        bmesh.ops.create_grid(bm, x_segments=1, y_segments=1, size=size)
    elif kind == "sphere":
        bmesh.ops.create_uvsphere(bm, u_segments=16, v_segments=8, radius=size)
    bm.to_mesh(me)
    bm.free()
    if kind == "sphere":
        for p in me.polygons:
            p.use_smooth = True
    ob = bpy.data.objects.new(name, me)
    ob.location = loc
    coll.objects.link(ob)
    return ob


def image_material(name, image, scale=(1.0, 1.0, 1.0), tiled=False):
    """Principled material whose base colour is `image` sampled at generated coords."""
    mat = bpy.data.materials.new(name)
    mat.use_nodes = True
    nt = mat.node_tree
    bsdf = nt.nodes["Principled BSDF"]
    tex = nt.nodes.new("ShaderNodeTexImage")
    tex.image = image
    tex.interpolation = "Closest"
    tc = nt.nodes.new("ShaderNodeTexCoord")
    mapping = nt.nodes.new("ShaderNodeMapping")
    mapping.inputs["Scale"].default_value = scale
    nt.links.new(tc.outputs["Generated"], mapping.inputs["Vector"])
    nt.links.new(mapping.outputs["Vector"], tex.inputs["Vector"])
    nt.links.new(tex.outputs["Color"], bsdf.inputs["Base Color"])
    bsdf.inputs["Roughness"].default_value = 0.8
    return mat, tex


def load_image(abs_path, relative):
    img = bpy.data.images.load(abs_path, check_existing=False)
    if relative:
        img.filepath = bpy.path.relpath(abs_path)
    return img


def world(scene, color=(0.05, 0.07, 0.1)):
    w = bpy.data.worlds.new("World")
    w.use_nodes = True
    w.node_tree.nodes["Background"].inputs["Color"].default_value = (*color, 1.0)
    scene.world = w


def cycles_settings(scene, exr):
    r = scene.render
    r.engine = "CYCLES"
    r.resolution_x, r.resolution_y, r.resolution_percentage = 96, 64, 100
    r.dither_intensity = 0.0
    r.use_file_extension = True
    r.film_transparent = False
    c = scene.cycles
    c.device = "CPU"
    c.samples = 16
    c.seed = 0
    c.use_animated_seed = False
    c.use_adaptive_sampling = False
    c.use_denoising = False
    c.max_bounces = 4
    c.diffuse_bounces = 2
    c.glossy_bounces = 2
    c.transmission_bounces = 2
    c.volume_bounces = 0
    c.transparent_max_bounces = 4
    c.time_limit = 0.0
    # Blender 4.2-4.4 split sample ranges by offset alone, which adds up to
    # the full render only with the Tabulated Sobol pattern (4.5+ renders
    # subsets of any pattern; 3.x's patterns add up with offsets).
    if (4, 2) <= tuple(bpy.app.version[:2]) < (4, 5):
        c.sampling_pattern = "TABULATED_SOBOL"
    im = r.image_settings
    if exr:
        im.file_format = "OPEN_EXR"
        im.color_depth = "32"
        im.color_mode = "RGBA"
        im.exr_codec = "ZIP"
    else:
        im.file_format = "PNG"
        im.color_depth = "8"
        im.color_mode = "RGBA"
        im.compression = 15
    r.filepath = "//render/frame_"


# --------------------------------------------------------------------------
# textures


def make_textures(project, external):
    tex = {}
    tex["rel"] = os.path.join(project, "textures", "rel.png")
    write_png(tex["rel"], 16, 16, lambda x, y: (230, 40, 30) if ((x // 4) + (y // 4)) % 2 else (240, 235, 220))
    tex["ext"] = os.path.join(external, "ext.png")
    write_png(tex["ext"], 16, 16, lambda x, y: (20, 60, 220) if (x // 2) % 2 else (250, 210, 20))
    tex["lib"] = os.path.join(project, "lib", "tex", "lib.png")
    write_png(tex["lib"], 16, 16, lambda x, y: (20, 40 + 13 * x, 20 + 12 * y))
    tex["deep"] = os.path.join(project, "lib", "deep", "tex", "deep.png")
    write_png(tex["deep"], 8, 8, lambda x, y: (200, 30 + 25 * ((x + y) % 8), 230))
    seq_colors = [(255, 0, 0), (255, 128, 0), (255, 255, 0), (0, 255, 0), (0, 128, 255), (160, 0, 255)]
    for i, col in enumerate(seq_colors):
        p = os.path.join(project, "textures", "seq", "seq_%04d.png" % (i + 1))
        write_png(p, 8, 8, lambda x, y, col=col: col if (x + y) % 2 else (255, 255, 255))
    tex["seq"] = os.path.join(project, "textures", "seq", "seq_0001.png")
    write_png(os.path.join(project, "textures", "udim", "grid.1001.png"), 8, 8,
              lambda x, y: (0, 200, 200) if x % 4 == 0 or y % 4 == 0 else (40, 40, 40))
    write_png(os.path.join(project, "textures", "udim", "grid.1002.png"), 8, 8,
              lambda x, y: (220, 0, 160) if x % 4 == 0 or y % 4 == 0 else (40, 40, 40))
    tex["udim"] = os.path.join(project, "textures", "udim", "grid.<UDIM>.png")
    return tex


# --------------------------------------------------------------------------
# libraries


def make_deep(project, tex):
    scene = reset()
    path = os.path.join(project, "lib", "deep", "deep.blend")
    save(path)  # so relative paths have a base
    coll = bpy.data.collections.new("Deep")
    scene.collection.children.link(coll)
    ball = mesh_object("DeepBall", "sphere", coll, loc=(-1.2, 1.0, 0.45), size=0.45)
    mat, _ = image_material("DeepMat", load_image(tex["deep"], relative=True), scale=(2, 2, 2))
    ball.data.materials.append(mat)
    save(path, compress=True)
    return path


def make_props(project, tex, deep_path):
    scene = reset()
    path = os.path.join(project, "lib", "props.blend")
    save(path)
    coll = bpy.data.collections.new("Props")
    scene.collection.children.link(coll)
    box = mesh_object("PropBox", "cube", coll, loc=(1.3, 0.9, 0.35), size=0.7)
    box.rotation_euler = (0, 0, math.radians(20))
    mat, _ = image_material("PropMat", load_image(tex["lib"], relative=True))
    box.data.materials.append(mat)
    # link (not append) DeepBall from the deeper library, by relative path
    with bpy.data.libraries.load(deep_path, link=True, relative=True) as (src, dst):
        dst.objects = ["DeepBall"]
    coll.objects.link(dst.objects[0])
    save(path, compress=True)
    return path


# --------------------------------------------------------------------------
# the shot


def make_shot(project, tex, props_path, exr):
    scene = reset()
    path = os.path.join(project, "shot.blend")
    save(path)
    cycles_settings(scene, exr)
    scene.frame_start, scene.frame_end = 1, 6
    world(scene)
    root = scene.collection

    ground = mesh_object("Ground", "plane", root, size=3.0)
    mat, _ = image_material("RelMat", load_image(tex["rel"], relative=True))
    ground.data.materials.append(mat)

    cube = mesh_object("ExtCube", "cube", root, loc=(0.0, -0.6, 0.5), size=0.8)
    mat, _ = image_material("ExtMat", load_image(tex["ext"], relative=False))
    cube.data.materials.append(mat)
    cube.rotation_euler = (0, 0, 0)
    cube.keyframe_insert("rotation_euler", frame=1)
    cube.rotation_euler = (0, 0, math.radians(75))
    cube.keyframe_insert("rotation_euler", frame=6)

    # image sequence: one file per frame, follows the scene frame
    seq_ball = mesh_object("SeqBall", "sphere", root, loc=(-1.4, -0.9, 0.4), size=0.4)
    seq_img = load_image(tex["seq"], relative=True)
    seq_img.source = "SEQUENCE"
    mat, node = image_material("SeqMat", seq_img, scale=(3, 3, 3))
    node.image_user.frame_duration = 6
    node.image_user.frame_start = 1
    node.image_user.frame_offset = 0
    node.image_user.use_auto_refresh = True
    seq_ball.data.materials.append(mat)

    # UDIM: two tiles, generated coords scaled to u in [0, 2)
    udim = bpy.data.images.load(tex["udim"].replace("<UDIM>", "1001"), check_existing=False)
    udim.source = "TILED"
    udim.filepath = bpy.path.relpath(tex["udim"])
    if len(udim.tiles) < 2:
        udim.tiles.new(tile_number=1002)
    udim.reload()
    wall = mesh_object("UdimWall", "cube", root, loc=(0.2, 1.6, 0.6), size=1.0)
    wall.scale = (1.6, 0.15, 0.6)
    mat, _ = image_material("UdimMat", udim, scale=(1.999, 1, 1))
    wall.data.materials.append(mat)

    # linked (not appended) collection from the props library, relative path
    with bpy.data.libraries.load(props_path, link=True, relative=True) as (src, dst):
        dst.collections = ["Props"]
    root.children.link(dst.collections[0])

    sun_data = bpy.data.lights.new("Sun", "SUN")
    sun_data.energy = 3.0
    sun = bpy.data.objects.new("Sun", sun_data)
    sun.rotation_euler = (math.radians(40), math.radians(10), math.radians(30))
    root.objects.link(sun)

    cam = bpy.data.objects.new("Camera", bpy.data.cameras.new("Camera"))
    root.objects.link(cam)
    scene.camera = cam
    target = bpy.data.objects.new("CamTarget", None)
    target.location = (0.0, 0.3, 0.3)
    root.objects.link(target)
    track = cam.constraints.new("TRACK_TO")
    track.target = target
    track.track_axis = "TRACK_NEGATIVE_Z"
    track.up_axis = "UP_Y"
    for frame, x in ((1, -1.5), (6, 1.5)):
        cam.location = (x, -5.0, 3.4)
        cam.keyframe_insert("location", frame=frame)
    scene.frame_set(1)
    save(path)
    zpath = os.path.join(project, "shot_zstd.blend")
    save(zpath, compress=True, copy=True)
    return path, zpath


def make_missing(project, exr):
    scene = reset()
    path = os.path.join(project, "missing.blend")
    save(path)
    cycles_settings(scene, exr)
    scene.frame_start, scene.frame_end = 1, 1
    ob = mesh_object("Plane", "plane", scene.collection)
    img = bpy.data.images.new("nope", 4, 4)
    img.source = "FILE"
    img.filepath = "//textures/nope.png"
    mat, _ = image_material("NopeMat", img)
    ob.data.materials.append(mat)
    world(scene)
    add_camera(scene, loc=(0, -0.5, 5))
    save(path, compress=True)
    return path


def add_camera(scene, loc=(0, -6, 2), target=(0, 0, 0)):
    cam = bpy.data.objects.new("Camera", bpy.data.cameras.new("Camera"))
    cam.location = loc
    scene.collection.objects.link(cam)
    aim = bpy.data.objects.new("CamTarget", None)
    aim.location = target
    scene.collection.objects.link(aim)
    c = cam.constraints.new("TRACK_TO")
    c.target = aim
    c.track_axis, c.up_axis = "TRACK_NEGATIVE_Z", "UP_Y"
    scene.camera = cam
    return cam


def make_extras(project, tex, exr):
    """Scan coverage: font, sound, movie clip, volume sequence (dummy .vdb files:
    the volume has no object, so the file still renders)."""
    import wave
    scene = reset()
    path = os.path.join(project, "extras.blend")
    save(path)
    cycles_settings(scene, exr)
    scene.frame_start, scene.frame_end = 1, 1
    world(scene)
    add_camera(scene)
    snd_path = os.path.join(project, "sound", "beep.wav")
    os.makedirs(os.path.dirname(snd_path), exist_ok=True)
    with wave.open(snd_path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(i * 0.3))) for i in range(800)))
    snd = bpy.data.sounds.load(snd_path)
    snd.filepath = bpy.path.relpath(snd_path)
    snd.use_fake_user = True
    clip = bpy.data.movieclips.load(tex["seq"])
    clip.filepath = bpy.path.relpath(tex["seq"])
    clip.use_fake_user = True
    vol = bpy.data.volumes.new("Smoke")
    for i in range(1, 4):
        p = os.path.join(project, "vol", "smoke_%04d.vdb" % i)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(b"not really a vdb %d\n" % i)
    vol.filepath = "//vol/smoke_0001.vdb"
    vol.is_sequence = True
    vol.frame_duration = 3
    vol.use_fake_user = True
    font_file = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    if os.path.exists(font_file):
        font = bpy.data.fonts.load(font_file)
        txt = bpy.data.curves.new("Label", "FONT")
        txt.body = "tessera"
        txt.font = font
        txt.align_x = "CENTER"
        txt.extrude = 0.05
        label = bpy.data.objects.new("Label", txt)
        label.rotation_euler = (math.radians(90), 0, 0)
        scene.collection.objects.link(label)
        sun = bpy.data.objects.new("Sun", bpy.data.lights.new("Sun", "SUN"))
        scene.collection.objects.link(sun)
    save(path, compress=True)
    return path


def make_trap(project, marker, exr):
    scene = reset()
    path = os.path.join(project, "trap.blend")
    save(path)
    cycles_settings(scene, exr)
    scene.frame_start, scene.frame_end = 1, 1
    world(scene, color=(0.3, 0.1, 0.1))
    txt = bpy.data.texts.new("trap.py")
    txt.write("# Written by the Tessera test generator: if this runs, autoexec was on.\n"
              "with open(%r, 'w') as f:\n"
              "    f.write('autoexec ran\\n')\n" % marker)
    txt.use_module = True
    add_camera(scene)
    save(path, compress=True)
    return path


def main():
    argv = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    ap = argparse.ArgumentParser(prog="make_scenes.py")
    ap.add_argument("--project", required=True)
    ap.add_argument("--external", required=True)
    ap.add_argument("--exr", action="store_true")
    ap.add_argument("--trap", metavar="MARKER_PATH")
    a = ap.parse_args(argv)
    project = os.path.abspath(a.project)
    external = os.path.abspath(a.external)
    os.makedirs(project, exist_ok=True)
    os.makedirs(external, exist_ok=True)
    tex = make_textures(project, external)
    deep = make_deep(project, tex)
    props = make_props(project, tex, deep)
    shot, zshot = make_shot(project, tex, props, a.exr)
    made = [deep, props, shot, zshot, make_missing(project, a.exr), make_extras(project, tex, a.exr)]
    if a.trap:
        made.append(make_trap(project, os.path.abspath(a.trap), a.exr))
    for p in made:
        print("tessera-make-scenes: wrote", p)


main()
