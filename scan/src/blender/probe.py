# Tessera capability probe. Runs inside a Blender (executable or bpy module)
# once when a worker starts, and prints one line:
#   @@TESSERA@@ {"version":[4,5,4],"version_string":"4.5.4 LTS","oidn":true,
#                "osl":true,"device_types":["CUDA","OPTIX",...],
#                "devices":[["OPTIX","NVIDIA H100 ..."],...],"render":null|{...}}
# Arguments after "--": [DEVICE GPU_INDEX]. With a device, it also renders a
# 16x16 Cycles probe frame on that device (one sample) and reports the device
# Cycles actually used, so a GPU that does not work is found at join, not at
# the first task.
#
# Self-contained (stdlib + bpy): embedded in the worker binary.

import json
import sys

import bpy

PREFIX = "@@TESSERA@@ "


def capabilities():
    import _cycles
    out = {
        "version": list(bpy.app.version),
        "version_string": bpy.app.version_string,
        # Where this Blender was loaded from: a build's copy, not another.
        "path": getattr(bpy, "__file__", None) or bpy.app.binary_path,
        "oidn": bool(getattr(_cycles, "with_openimagedenoise", False)),
        "osl": bool(getattr(_cycles, "with_osl", False)),
    }
    cprefs = bpy.context.preferences.addons["cycles"].preferences
    types = []
    if hasattr(cprefs, "get_device_types"):
        types = [t[0] for t in cprefs.get_device_types(bpy.context) if t[0] != "NONE"]
    devices = []
    for t in types:
        try:
            found = _cycles.available_devices(t)
        except Exception:
            continue
        for d in found:
            if len(d) > 1 and d[1] == t:
                devices.append([t, d[0]])
    out["device_types"] = types
    out["devices"] = devices
    return out


def probe_render(device, gpu_index):
    """Render a tiny frame on `device`; raise if Cycles cannot."""
    import os
    import tempfile
    bpy.ops.wm.read_factory_settings(use_empty=False)
    scene = bpy.context.scene
    scene.render.engine = "CYCLES"
    scene.render.resolution_x = scene.render.resolution_y = 16
    scene.render.resolution_percentage = 100
    scene.cycles.samples = 1
    scene.cycles.use_denoising = False
    cprefs = bpy.context.preferences.addons["cycles"].preferences
    used = "CPU"
    if device != "CPU":
        cprefs.compute_device_type = device
        cprefs.refresh_devices()
        devs = [d for d in cprefs.devices if d.type == device]
        if not devs:
            raise RuntimeError("Cycles found no %s device" % device)
        if gpu_index is not None and not 0 <= gpu_index < len(devs):
            raise RuntimeError("%s device %d not found (%d found)" % (device, gpu_index, len(devs)))
        chosen = devs[gpu_index] if gpu_index is not None else devs[0]
        for d in cprefs.devices:
            d.use = d.id == chosen.id
        scene.cycles.device = "GPU"
        used = "%s %s" % (chosen.type, chosen.name)
    out = os.path.join(tempfile.mkdtemp(prefix="tessera-probe-"), "probe.png")
    scene.render.filepath = out
    res = bpy.ops.render.render(write_still=True)
    if "FINISHED" not in res or not os.path.isfile(out):
        raise RuntimeError("the probe render did not finish on %s" % used)
    os.unlink(out)
    return {"ok": True, "device": used}


def main():
    argv = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    out = capabilities()
    out["render"] = None
    if argv:
        device = argv[0].upper()
        gpu = int(argv[1]) if len(argv) > 1 and argv[1] != "" else None
        try:
            out["render"] = probe_render(device, gpu)
        except Exception as e:
            out["render"] = {"ok": False, "error": " ".join(str(e).split())[:500]}
    sys.stdout.flush()
    sys.stdout.write(PREFIX + json.dumps(out) + "\n")
    sys.stdout.flush()


main()
