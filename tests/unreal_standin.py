#!/usr/bin/env python3
"""A STAND-IN for Unreal's UnrealEditor-Cmd running Movie Render Queue.

Unreal cannot be installed where Tessera's tests run, so the tests drive
this script instead. It is not Unreal and renders nothing real. It does what
the Unreal adapter relies on, as Epic documents it:

- It accepts exactly the arguments of the documented MRQ command line and
  refuses any other (exit 2, naming it):
  PROJECT.uproject [MAP] -game -LevelSequence=... -MoviePipelineConfig=...
  [-MoviePipelineLocalExecutorClass=/Script/MovieRenderPipelineCore.MoviePipelinePythonHostExecutor
   -ExecutorPythonClass=...] [-windowed] [-resx=N] [-resy=N]
  [-RenderOffscreen] [-Unattended] [-StdOut] [-log] [-graphicsadapter=N]
  (https://dev.epicgames.com/documentation/en-us/unreal-engine/using-command-line-rendering-with-move-render-queue-in-unreal-engine,
  https://dev.epicgames.com/documentation/en-us/unreal-engine/command-line-arguments-in-unreal-engine;
  -graphicsadapter sets r.GraphicsAdapter,
  https://dev.epicgames.com/documentation/unreal-engine/API/Plugins/DisplayClusterConfiguration/UDisplayClusterConfigurationClus-_1/GraphicsAdapter).
- Its machine's GPUs are TESSERA_TEST_STANDIN_GPU (comma-separated names; default one
  GPU, gpu0); -graphicsadapter=N renders on the Nth (a missing one is an
  error, as Unreal falls back to none), otherwise on the first.
- With TESSERA_TEST_STANDIN_SEEN naming a folder, it records there what it saw (its
  adapter, the GPU it rendered on, CUDA_VISIBLE_DEVICES, its frames) as one
  JSON file per process; with TESSERA_TEST_STANDIN_SEEN_TOGETHER=K it then waits (at most
  20 s) until K processes have recorded, so a test sees them run at once.
- Without an executor class it renders the whole level sequence, shot after
  shot, into PROJECT/Saved/MovieRenders (MRQ's default output folder): the
  "continuous render" the tests compare against.
- With the Python host executor and Tessera's executor class it does what
  that executor asks (the JSON file named by TESSERA_MRQ_TASK): the frames
  start_frame..end_frame into output_directory, printing the executor's
  `TesseraMRQ:` lines.

Its assets are text files standing in for .uasset/.umap packages:
- the level sequence: `StandInLevelSequence` then `shots=sh010:1-8,...`
  (camera cuts);
- the config: `StandInMoviePipelinePrimaryConfig` then `format=png|exr`,
  `file_name_format=...`, `zero_pad=N`, `engine_warm_up=N`,
  `render_warm_up=N`, `history=N` (frames of temporal history);
- the map: a file whose first line is `StandInMap` (anything may follow).

Pixels depend on the frame and on the temporal history (the last `history`
evaluated frames, averaged, as a temporal effect would): at a camera cut or
at the start of the rendered range the history is filled by the warm-up
(the first frame, engine_warm_up + render_warm_up times). A chunk rendered
from enough frames before its first kept frame therefore equals the
continuous render; one without that warm-up does not.

Markers make it fail the way Unreal does (the adapter reads the log lines):
- a plugin in the .uproject that is neither built in nor under Plugins/:
  "Unable to find plugin '...'";
- a map whose file is missing or not `StandInMap`: "Failed to load map";
- `Content/StandIn/ShaderCompile` (a number of shaders): prints
  "Shaders left to compile N" every 0.2 s until done, unless the derived
  data cache (UE-LocalDataCachePath) already holds them; with
  `Content/StandIn/ShaderCompileCrash` it exits mid-compile;
- `Content/StandIn/Hang`: prints nothing more for a minute;
- `Content/StandIn/DeviceLost` naming a GPU: on a machine whose
  TESSERA_TEST_STANDIN_GPU is that name, VK_ERROR_DEVICE_LOST after the first frame.
"""

import json
import os
import struct
import sys
import time
import zlib

BUILTIN_PLUGINS = {"MovieRenderPipeline", "PythonScriptPlugin"}
HOST_EXECUTOR = "/Script/MovieRenderPipelineCore.MoviePipelinePythonHostExecutor"
TESSERA_EXECUTOR = "/Engine/PythonTypes.TesseraMoviePipelineExecutor"
FLAGS = {"-game", "-windowed", "-renderoffscreen", "-unattended", "-stdout", "-log"}
VALUES = {
    "-levelsequence",
    "-moviepipelineconfig",
    "-moviepipelinelocalexecutorclass",
    "-executorpythonclass",
    "-resx",
    "-resy",
    "-graphicsadapter",
}


def log(line):
    print(line, flush=True)


def fail(line, code=1):
    log(line)
    sys.exit(code)


def parse_args(argv):
    if not argv or not argv[0].endswith(".uproject"):
        fail("StandIn: Error: the first argument must be a .uproject", 2)
    project, rest = argv[0], argv[1:]
    mapname = None
    if rest and not rest[0].startswith("-"):
        mapname, rest = rest[0], rest[1:]
    flags, values = set(), {}
    for a in rest:
        key, eq, value = a.partition("=")
        k = key.lower()
        if not eq and k in FLAGS:
            flags.add(k)
        elif eq and k in VALUES and value:
            values[k] = value
        else:
            fail("StandIn: Error: undocumented argument " + repr(a), 2)
    if "-game" not in flags:
        fail("StandIn: Error: Movie Render Queue from the command line needs -game", 2)
    for need in ("-levelsequence", "-moviepipelineconfig"):
        if need not in values:
            fail("StandIn: Error: missing " + need, 2)
    return project, mapname, flags, values


def content_file(project_dir, path, ext):
    if not path.startswith("/Game/"):
        return None
    pkg = path[len("/Game/"):]
    head, _, last = pkg.rpartition("/")
    last = last.split(".")[0]
    return os.path.join(project_dir, "Content", head, last + "." + ext)


def read_asset(project_dir, path, kind):
    f = content_file(project_dir, path, "uasset")
    if not f or not os.path.isfile(f):
        return None
    lines = open(f).read().splitlines()
    if not lines or lines[0] != kind:
        return None
    return dict(l.split("=", 1) for l in lines[1:] if "=" in l)


def content(seq, frame, x, y):
    h = (len(seq) * 131 + frame * 2654435761 + x * 40503 + y * 9973) & 0xFFFFFFFF
    h ^= h >> 13
    return ((h & 255), (h >> 8) & 255, (x * 3 + y * 5 + frame * 11) & 255)


def frame_pixels(window, w, h, seq):
    rows = []
    n = len(window)
    for y in range(h):
        row = bytearray()
        for x in range(w):
            acc = [0, 0, 0]
            for f in window:
                c = content(seq, f, x, y)
                acc[0] += c[0]
                acc[1] += c[1]
                acc[2] += c[2]
            row += bytes(v // n for v in acc)
        rows.append(bytes(row))
    return rows


def png(w, h, rows):
    def chunk(t, d):
        c = t + d
        return struct.pack(">I", len(d)) + c + struct.pack(">I", zlib.crc32(c) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + r for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def exr(w, h, rows):
    # Scanline OpenEXR, no compression, float B, G, R (channels sorted).
    def attr(name, kind, data):
        return name.encode() + b"\0" + kind.encode() + b"\0" + struct.pack("<i", len(data)) + data

    chans = b"".join(c + b"\0" + struct.pack("<iBBBBii", 2, 0, 0, 0, 0, 1, 1) for c in (b"B", b"G", b"R")) + b"\0"
    box = struct.pack("<iiii", 0, 0, w - 1, h - 1)
    header = (b"\x76\x2f\x31\x01" + struct.pack("<i", 2)
              + attr("channels", "chlist", chans) + attr("compression", "compression", b"\0")
              + attr("dataWindow", "box2i", box) + attr("displayWindow", "box2i", box)
              + attr("lineOrder", "lineOrder", b"\0") + attr("pixelAspectRatio", "float", struct.pack("<f", 1.0))
              + attr("screenWindowCenter", "v2f", struct.pack("<ff", 0, 0))
              + attr("screenWindowWidth", "float", struct.pack("<f", 1.0)) + b"\0")
    lines = []
    for y, r in enumerate(rows):
        data = b"".join(struct.pack("<%df" % w, *[r[x * 3 + c] / 255.0 for x in range(w)]) for c in (2, 1, 0))
        lines.append(struct.pack("<ii", y, len(data)) + data)
    offsets, at = [], len(header) + 8 * h
    for l in lines:
        offsets.append(at)
        at += len(l)
    return header + b"".join(struct.pack("<Q", o) for o in offsets) + b"".join(lines)


def file_name(cfg, seq, shot, frame):
    digits = int(cfg.get("zero_pad", "4"))
    name = (cfg.get("file_name_format", "{sequence_name}.{frame_number}")
            .replace("{sequence_name}", seq).replace("{shot_name}", shot)
            .replace("{frame_number}", str(frame).zfill(digits)))
    return name + "." + cfg.get("format", "png")


def main():
    project, mapname, flags, values = parse_args(sys.argv[1:])
    project_dir = os.path.dirname(os.path.abspath(project))
    log("LogInit: Display: Running engine for game: " + os.path.basename(project)[: -len(".uproject")])
    try:
        uproject = json.load(open(project))
    except (OSError, ValueError) as e:
        fail("LogInit: Error: could not read the project: %s" % e)
    for p in uproject.get("Plugins", []):
        name = p.get("Name", "")
        if not p.get("Enabled", True) or name in BUILTIN_PLUGINS:
            continue
        found = any(os.path.isfile(os.path.join(root, name + ".uplugin"))
                    for root, _, _ in os.walk(os.path.join(project_dir, "Plugins")))
        if not found:
            fail("LogPluginManager: Error: Unable to find plugin '%s' (referenced via %s). Install it and "
                 "try again, or remove it from the required plugin list." % (name, os.path.basename(project)))
    executor = values.get("-moviepipelinelocalexecutorclass")
    task = None
    if executor is not None:
        if executor != HOST_EXECUTOR or values.get("-executorpythonclass") != TESSERA_EXECUTOR:
            fail("StandIn: Error: this stand-in knows the Python host executor with Tessera's class only", 2)
        init = os.path.join(project_dir, "Plugins", "TesseraMRQ", "Content", "Python", "init_unreal.py")
        if "class TesseraMoviePipelineExecutor" not in open(init).read():
            fail("LogPython: Error: class TesseraMoviePipelineExecutor not found", 1)
        task = json.load(open(os.environ["TESSERA_MRQ_TASK"]))
        if task["level_sequence"] != values["-levelsequence"] or task["config"] != values["-moviepipelineconfig"]:
            fail("LogPython: TesseraMRQ: error the task file and the command line disagree")
    elif "-executorpythonclass" in values:
        fail("StandIn: Error: -ExecutorPythonClass without -MoviePipelineLocalExecutorClass", 2)
    if mapname:
        mf = content_file(project_dir, mapname, "umap")
        if not mf or not os.path.isfile(mf) or open(mf, "rb").read(11) not in (b"StandInMap\n", b"StandInMap"):
            fail("LogMovieRenderPipeline: Error: Failed to load map " + mapname)
    seq_path = values["-levelsequence"]
    seq = read_asset(project_dir, seq_path, "StandInLevelSequence")
    if seq is None:
        fail("LogMovieRenderPipeline: Error: Could not load level sequence " + seq_path)
    cfg = read_asset(project_dir, values["-moviepipelineconfig"], "StandInMoviePipelinePrimaryConfig")
    if cfg is None:
        fail("LogMovieRenderPipeline: Error: Could not load config " + values["-moviepipelineconfig"])
    shots = []
    for s in seq["shots"].split(","):
        name, _, span = s.partition(":")
        a, _, b = span.partition("-")
        shots.append((name, int(a), int(b)))
    seq_name = seq_path.rsplit("/", 1)[-1].split(".")[0]
    w = int(values.get("-resx", cfg.get("resx", "32")))
    h = int(values.get("-resy", cfg.get("resy", "18")))

    marker = os.path.join(project_dir, "Content", "StandIn")
    shader_file = os.path.join(marker, "ShaderCompile")
    ddc = os.environ.get("UE-LocalDataCachePath")
    cached = ddc and os.path.isfile(os.path.join(ddc, "ShaderCache.ddp"))
    if os.path.isfile(shader_file) and not cached:
        left = int(open(shader_file).read().strip() or "0")
        crash = os.path.isfile(os.path.join(marker, "ShaderCompileCrash"))
        while left > 0:
            log("LogShaderCompilers: Display: Shaders left to compile %d" % left)
            if crash and left < 500:
                fail("LogWindows: Error: === Critical error: === Fatal error!", 3)
            time.sleep(0.2)
            left = max(0, left - 400)
        if ddc:
            os.makedirs(ddc, exist_ok=True)
            open(os.path.join(ddc, "ShaderCache.ddp"), "w").write("compiled\n")
    if os.path.isfile(os.path.join(marker, "Hang")):
        time.sleep(60)  # silent: a hung engine (until the adapter stops it)
    lost_on = None
    lost_file = os.path.join(marker, "DeviceLost")
    if os.path.isfile(lost_file):
        lost_on = open(lost_file).read().strip()
    gpus = os.environ.get("TESSERA_TEST_STANDIN_GPU", "gpu0").split(",")
    adapter = values.get("-graphicsadapter")
    if adapter is not None:
        if not adapter.isdigit() or int(adapter) >= len(gpus):
            fail("LogRHI: Error: -graphicsadapter=%s: no such adapter (this machine has %d)" % (adapter, len(gpus)))
        gpu = gpus[int(adapter)]
    else:
        gpu = gpus[0]
    log("LogRHI: Display: Using adapter %s (%s)" % (adapter or "default", gpu))

    if task is None:
        first, last = shots[0][1], shots[-1][2]
        out_dir = os.path.join(project_dir, "Saved", "MovieRenders")
    else:
        first, last = task["start_frame"], task["end_frame"]
        out_dir = task["output_directory"]
    os.makedirs(out_dir, exist_ok=True)
    seen = os.environ.get("TESSERA_TEST_STANDIN_SEEN")
    if seen:
        os.makedirs(seen, exist_ok=True)
        record = {"adapter": adapter, "gpu": gpu, "frames": [first, last],
                  "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                  "environ": dict(os.environ)}
        tmp = os.path.join(seen, "%d.tmp" % os.getpid())
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.rename(tmp, os.path.join(seen, "%d.json" % os.getpid()))
        together = int(os.environ.get("TESSERA_TEST_STANDIN_SEEN_TOGETHER", "0"))
        deadline = time.time() + 20
        while time.time() < deadline and len([n for n in os.listdir(seen) if n.endswith(".json")]) < together:
            log("LogMovieRenderPipeline: Display: waiting for the other slots")
            time.sleep(0.05)
    history = max(1, int(cfg.get("history", "1")))
    warm = int(cfg.get("engine_warm_up", "0")) + int(cfg.get("render_warm_up", "0"))
    window = []
    written = []
    total = last - first + 1
    for frame in range(first, last + 1):
        shot = next((s for s in shots if s[1] <= frame <= s[2]), None)
        if shot is None:
            fail("LogMovieRenderPipeline: Error: frame %d is outside the sequence" % frame)
        if frame == first or frame == shot[1]:
            # A camera cut, or the start of the range: the shot's warm-up.
            window = [frame] * warm
        window = (window + [frame])[-history:]
        rows = frame_pixels(window, w, h, seq_name)
        kind = cfg.get("format", "png")
        data = png(w, h, rows) if kind == "png" else exr(w, h, rows)
        path = os.path.join(out_dir, file_name(cfg, seq_name, shot[0], frame))
        with open(path, "wb") as f:
            f.write(data)
        written.append((frame, path))
        log("LogMovieRenderPipeline: Display: [%d/%d] frame %d of shot %s" % (frame - first + 1, total, frame, shot[0]))
        if task is not None:
            log("LogPython: TesseraMRQ: progress %d/%d" % (frame - first + 1, total))
        if lost_on is not None and lost_on == gpu:
            fail("LogVulkanRHI: Error: VulkanRHI::vkQueueSubmit failed with VK_ERROR_DEVICE_LOST")
    if task is not None:
        for frame, path in written:
            log("LogPython: TesseraMRQ: wrote %d %s" % (frame, path))
        log("LogPython: TesseraMRQ: finished success=True")
    log("LogMovieRenderPipeline: Display: Render finished")


if __name__ == "__main__":
    main()
