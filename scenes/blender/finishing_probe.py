# Measures the finishing step for whole-frame effects (issue 10, item 5)
# before the farm is wired to it. Run with a Blender that has
# OpenImageDenoise (the bpy 4.5 runtime):
#
#   $TESSERA_TEST_BPY scenes/blender/finishing_probe.py [OUT_DIR] [--for-farm [--multilayer]]
#
# With --for-farm it only writes what the farm's end-to-end test compares
# (tests/e2e/finishing.rs): OUT_DIR/scene.blend, Blender's own full render
# OUT_DIR/ref.png, and the old per-tile way OUT_DIR/per_tile.png. With
# --multilayer as well, the scene writes a half-float multilayer OpenEXR
# (PIZ) of two view layers (the second in clay) with depth, normal, mist
# and Cryptomatte passes,
# and Blender's own render is OUT_DIR/ref.exr (no per-tile frame).
#
# Builds a small Cycles scene with a compositor (glare, lens distortion,
# colour balance) and OpenImageDenoise denoising, renders Blender's own full
# frame as the reference, and compares with it:
#   - the render layers only (no compositor, no denoising): how far off a
#     frame without the finishing step is;
#   - the finishing step on the whole frame's passes: the passes rendered
#     noisy into a multilayer OpenEXR with the denoising data (albedo,
#     normal), then a finishing scene whose compositor reads them through an
#     Image node in place of the Render Layers node, with a Denoise node
#     (the scene's prefilter and quality) in front of what the Render
#     Layers' image fed. No Render Layers node is left, so Blender does not
#     render: it composites and writes the scene's output;
#   - the old per-tile way, 4x4: each tile composited and denoised alone;
#   - the finishing step on 4 sample ranges of the passes (Cycles' sample
#     subsets), averaged in the compositor.
# For each: PSNR against the reference, and the mean absolute difference
# (in 1/255) of pixels within 2 px of an internal edge of the 4x4 grid
# ("boundary") against all other pixels ("elsewhere"). Exits 1 unless the
# finishing step reaches PSNR >= 45 dB with boundaries no worse than
# elsewhere, both whole and from ranges, and the per-tile way misses that.
import os
import sys

import bpy
import numpy as np

argv = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else sys.argv[1:]
FOR_FARM = "--for-farm" in argv
MULTILAYER = "--multilayer" in argv
argv = [a for a in argv if a not in ("--for-farm", "--multilayer")]
OUT = argv[0] if argv else "/tmp/tessera-finishing-probe"
W, H, G = 128, 96, 4


def build():
    """The probe scene: Cycles, 16 samples, OpenImageDenoise, a compositor
    with glare, lens distortion and colour balance; PNG output."""
    bpy.ops.wm.read_factory_settings(use_empty=True)
    s = bpy.context.scene
    s.render.engine = "CYCLES"
    s.cycles.device = "CPU"
    s.cycles.samples = 16
    s.cycles.use_denoising = True
    s.render.resolution_x, s.render.resolution_y = W, H
    s.render.resolution_percentage = 100
    s.render.image_settings.file_format = "PNG"
    bpy.ops.mesh.primitive_uv_sphere_add(radius=1, location=(0, 0, 1))
    bpy.ops.mesh.primitive_plane_add(size=10)
    bpy.ops.object.light_add(type="POINT", location=(2, -2, 4))
    bpy.context.object.data.energy = 800
    bpy.ops.object.camera_add(location=(0, -6, 2.5), rotation=(1.25, 0, 0))
    s.camera = bpy.context.object
    world = bpy.data.worlds.new("world")
    s.world = world
    world.use_nodes = True
    world.node_tree.nodes["Background"].inputs[1].default_value = 0.3
    s.use_nodes = True
    t = s.node_tree
    for n in list(t.nodes):
        t.nodes.remove(n)
    chain = [t.nodes.new("CompositorNodeRLayers")]
    glare = t.nodes.new("CompositorNodeGlare")
    glare.glare_type = "FOG_GLOW"
    glare.threshold = 0.5
    lens = t.nodes.new("CompositorNodeLensdist")
    lens.inputs["Distortion"].default_value = 0.1
    lens.inputs["Dispersion"].default_value = 0.05
    balance = t.nodes.new("CompositorNodeColorBalance")
    balance.lift = (1.0, 0.95, 1.05)
    chain += [glare, lens, balance, t.nodes.new("CompositorNodeComposite")]
    for a, b in zip(chain, chain[1:]):
        t.links.new(a.outputs["Image"], b.inputs["Image"])
    if MULTILAYER:
        im = s.render.image_settings
        im.file_format, im.color_depth, im.exr_codec = "OPEN_EXR_MULTILAYER", "16", "PIZ"
        s.view_layers[0].use_pass_z = True
        s.view_layers[0].use_pass_cryptomatte_object = True
        clay = bpy.data.materials.new("clay")
        clay.use_nodes = True
        clay.node_tree.nodes["Principled BSDF"].inputs["Base Color"].default_value = (
            0.8, 0.3, 0.2, 1)
        second = s.view_layers.new("Second")  # every object in clay
        second.material_override = clay
        second.use_pass_normal = True
        second.use_pass_mist = True
    return s


def render(s, path):
    s.render.filepath = path
    s.render.use_file_extension = False
    bpy.ops.render.render(write_still=True)


def load(path):
    """RGB in 0..255, rows top to bottom."""
    img = bpy.data.images.load(path, check_existing=False)
    a = np.array(img.pixels[:], dtype=np.float64).reshape(img.size[1], img.size[0], 4)[::-1]
    bpy.data.images.remove(img)
    return a[..., :3] * 255


def edges():
    """Pixels within 2 px of an internal edge of the G x G grid."""
    m = np.zeros((H, W), bool)
    for i in range(1, G):
        x, y = W * i // G, H * i // G
        m[:, max(0, x - 2):x + 2] = True
        m[max(0, y - 2):y + 2, :] = True
    return m


EDGE = edges()


def report(name, a, ref):
    """Prints and returns (PSNR, boundary mean |d|, elsewhere mean |d|)."""
    d = np.abs(a - ref).mean(axis=2)
    mse = ((a - ref) ** 2).mean()
    psnr = 10 * np.log10(255 ** 2 / mse) if mse else float("inf")
    edge, rest = d[EDGE].mean(), d[~EDGE].mean()
    print("%-22s PSNR %6.2f dB  mean|d| boundary %.4f  elsewhere %.4f  max %.0f/255" % (
        name, psnr, edge, rest, d.max()), flush=True)
    return psnr, edge, rest


def holds(figures):
    """The acceptance bar: PSNR >= 45 dB, boundaries no worse than elsewhere."""
    psnr, edge, rest = figures
    return psnr >= 45 and edge <= rest


def passes_only(s):
    """What a tile renders: no compositor, no denoising, the denoising
    data stored, all passes in a float multilayer OpenEXR."""
    s.render.use_compositing = False
    s.cycles.use_denoising = False
    for vl in s.view_layers:
        vl.cycles.denoising_store_passes = True
    im = s.render.image_settings
    im.file_format, im.color_depth, im.exr_codec = "OPEN_EXR_MULTILAYER", "32", "NONE"


def finish(s, exrs):
    """Turns `s` into the finishing scene: each Render Layers node becomes
    the mean of `exrs`' Image nodes (its view layer), denoised."""
    t = s.node_tree
    for rl in [n for n in t.nodes if n.bl_idname == "CompositorNodeRLayers"]:
        images = []
        for p in exrs:
            n = t.nodes.new("CompositorNodeImage")
            n.image = bpy.data.images.load(p)
            n.layer = rl.layer
            images.append(n)

        def mean(name):
            sock = images[0].outputs[name]
            for k, n in enumerate(images[1:], 2):
                mix = t.nodes.new("CompositorNodeMixRGB")
                mix.inputs[0].default_value = 1.0 / k
                t.links.new(sock, mix.inputs[1])
                t.links.new(n.outputs[name], mix.inputs[2])
                sock = mix.outputs[0]
            return sock

        dn = t.nodes.new("CompositorNodeDenoise")
        dn.prefilter = s.cycles.denoising_prefilter
        dn.quality = s.cycles.denoising_quality
        dn.use_hdr = True
        t.links.new(mean("Combined"), dn.inputs["Image"])
        t.links.new(mean("Denoising Normal"), dn.inputs["Normal"])
        t.links.new(mean("Denoising Albedo"), dn.inputs["Albedo"])
        for link in list(rl.outputs["Image"].links):
            t.links.new(dn.outputs["Image"], link.to_socket)
        t.nodes.remove(rl)


def scene():
    bpy.ops.wm.open_mainfile(filepath=OUT + "/scene.blend")
    return bpy.context.scene


def per_tile_way(ref):
    """The old per-tile way: each tile composited and denoised alone
    (uncropped border), pasted into one frame."""
    s = scene()
    old = np.zeros_like(ref)
    r = s.render
    for j in range(G):
        for i in range(G):
            x0, x1, y0, y1 = W * i // G, W * (i + 1) // G, H * j // G, H * (j + 1) // G
            r.border_min_x, r.border_max_x = (x0 + .5) / W, min(1, (x1 + .5) / W)
            r.border_min_y, r.border_max_y = (H - y1 + .5) / H, min(1, (H - y0 + .5) / H)
            r.use_border, r.use_crop_to_border = True, False
            render(s, OUT + "/tile.png")
            old[y0:y1, x0:x1] = load(OUT + "/tile.png")[y0:y1, x0:x1]
    return old


def save_png(rgb, path):
    """Writes 0..255 RGB rows (top to bottom) as an 8-bit PNG."""
    img = bpy.data.images.new("per_tile", W, H, alpha=True)
    rgba = np.ones((H, W, 4))
    rgba[..., :3] = rgb / 255
    img.pixels[:] = rgba[::-1].ravel()
    img.filepath_raw = path
    img.file_format = "PNG"
    img.save()


def main():
    os.makedirs(OUT, exist_ok=True)
    s = build()
    bpy.ops.wm.save_as_mainfile(filepath=OUT + "/scene.blend")
    if MULTILAYER:
        render(s, OUT + "/ref.exr")
        return
    render(s, OUT + "/ref.png")
    ref = load(OUT + "/ref.png")
    if FOR_FARM:
        save_png(per_tile_way(ref), OUT + "/per_tile.png")
        return

    s = scene()
    s.render.use_compositing = False
    s.cycles.use_denoising = False
    render(s, OUT + "/raw.png")
    report("no compositor/denoise", load(OUT + "/raw.png"), ref)

    s = scene()
    passes_only(s)
    render(s, OUT + "/passes.exr")
    s = scene()
    finish(s, [OUT + "/passes.exr"])
    render(s, OUT + "/fin.png")
    whole = report("finishing, whole", load(OUT + "/fin.png"), ref)

    old = per_tile_way(ref)
    per_tile = report("old per-tile %dx%d" % (G, G), old, ref)

    # Four sample ranges of the passes, merged in the finishing compositor.
    s = scene()
    passes_only(s)
    parts = []
    for k in range(4):
        c = s.cycles
        c.use_sample_subset = True
        c.sample_offset, c.sample_subset_length = 4 * k, 4
        parts.append(OUT + "/range%d.exr" % k)
        render(s, parts[-1])
    s = scene()
    finish(s, parts)
    render(s, OUT + "/fin4.png")
    ranges = report("finishing, 4 ranges", load(OUT + "/fin4.png"), ref)
    ok = holds(whole) and holds(ranges) and not holds(per_tile)
    print("the finishing step %s; the old per-tile way fails the bar: %s" % (
        "holds" if holds(whole) and holds(ranges) else "DOES NOT HOLD", not holds(per_tile)))
    sys.exit(0 if ok else 1)


main()
