"""Tessera: submit the open .blend to a Tessera render farm from Blender.

A "Tessera" panel in the render properties. It submits the open file
(saved first) by running the `tessera` command line, which scans the
file's dependencies, uploads what the farm lacks and queues the job:
`tessera submit FILE --json ...`, with the coordinator's client ticket from
the add-on preferences passed in the TESSERA_TICKET environment variable,
never on a command line. `tessera status JOB --json` gives the job's
progress; once it is done, `tessera wait JOB --output DIR` fetches the
frames into the scene's output folder (the folder of Render Properties >
Output), named as Blender would name them.

Nothing here waits on Blender's UI thread: every `tessera` command runs as
a background process (`subprocess.Popen`, its output in temporary files),
and a `bpy.app.timers` timer (`_poll`) looks at it without waiting --
harvests the answer of one that ended, shows the last line a failing one
wrote on stderr, starts the next status poll. The operators only start or
stop processes. `draw()` runs nothing.

A Blender 4.2+ extension (`blender_manifest.toml`) and, for Blender 3.x,
a legacy add-on (`bl_info`). In the `bpy` module (4.5) and in background
mode no timer runs: call `_poll()` (or `bpy.ops.tessera.refresh()`), as
the tests do.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import shutil
import atexit

import bpy

bl_info = {
    "name": "Tessera",
    "author": "Tessera",
    "version": (0, 2, 0),
    "blender": (3, 4, 0),
    "location": "Properties > Render > Tessera",
    "description": "Render the open file on a Tessera render farm",
    "category": "Render",
}

# How often the panel's timer asks the farm for the job's progress.
POLL_SECONDS = 2.0
# How often the timer looks at a running `tessera` process (a look never
# waits: it is `Popen.poll()` and a read of a small temporary file).
WATCH_SECONDS = 0.2
FINAL_STATES = ("done", "failed", "canceled")


def _prefs(context):
    addon = context.preferences.addons.get(__package__ or __name__)
    return addon.preferences if addon else None


class TesseraError(Exception):
    """A message for the user: what went wrong and what to do."""


def tessera_binary(prefs):
    path = bpy.path.abspath(prefs.tessera_path) if prefs.tessera_path else "tessera"
    found = shutil.which(path) or (path if os.path.isfile(path) else None)
    if not found:
        raise TesseraError(
            f"the tessera program `{path}` was not found: set its path in the add-on preferences"
        )
    return found


def _tail(f, limit=8192):
    """The last `limit` bytes of the temporary file `f`, as text."""
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - limit))
    return f.read().decode("utf-8", "replace")


class Child:
    """One `tessera` command running in the background: its stdout and
    stderr go to temporary files, so it never blocks on a full pipe and
    nothing here ever waits on it."""

    def __init__(self, kind, cmd, env, **extra):
        self.kind = kind
        self.extra = extra
        self.started = time.monotonic()
        self.out = tempfile.TemporaryFile()
        self.err = tempfile.TemporaryFile()
        posix = os.name == "posix"
        self.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=self.out, stderr=self.err,
            # Its own process group, so that stopping it stops what it runs
            # (the dependency scan's Blender) too.
            start_new_session=posix,
        )

    @property
    def pid(self):
        return self.proc.pid

    def running(self):
        return self.proc.poll() is None

    def last_error_line(self):
        lines = [l.strip() for l in _tail(self.err).splitlines() if l.strip()]
        return lines[-1] if lines else ""

    def result(self):
        """(answer, error) of an ended command: its JSON answer (the last
        line of stdout), or the reason it failed (the last line it wrote on
        stderr)."""
        lines = [l for l in _tail(self.out, 1 << 20).splitlines() if l.strip()]
        answer = None
        if lines:
            try:
                answer = json.loads(lines[-1])
            except ValueError:
                answer = None
        code = self.proc.returncode
        if answer is None:
            reason = self.last_error_line()
            if code != 0:
                return None, reason or f"tessera {self.kind} exited with {code}"
            return None, reason or f"tessera {self.kind} printed no JSON"
        return answer, None

    def stop(self):
        """Stops the command and what it runs; does not wait for it (the
        next look reaps it)."""
        if not self.running():
            return
        try:
            if os.name == "posix":
                os.killpg(self.proc.pid, signal.SIGTERM)
            else:
                self.proc.terminate()
        except OSError:
            pass

    def close(self):
        self.out.close()
        self.err.close()


# The commands running now, by kind: "submit", "status", "fetch", "cancel".
# At most one of each.
RUNNING = {}


def _env(prefs):
    ticket = (prefs.ticket or "").strip()
    if not ticket:
        raise TesseraError(
            "no coordinator ticket: paste the client ticket (DATA_DIR/client.ticket) in the add-on preferences"
        )
    env = dict(os.environ)
    env["TESSERA_TICKET"] = ticket
    # The dependency scan must read the file with the Blender that saved
    # it: this one.
    if bpy.app.binary_path and os.path.basename(bpy.app.binary_path).startswith("blender"):
        env.setdefault("TESSERA_BLENDER", bpy.app.binary_path)
    else:
        env.setdefault("TESSERA_BLENDER_PYTHON", sys.executable)
    return env


def start(prefs, kind, args, **extra):
    """Starts `tessera ARGS` in the background as `kind`; returns at once."""
    if kind in RUNNING and RUNNING[kind].running():
        raise TesseraError(f"a {kind} is already running")
    cmd = [tessera_binary(prefs)] + list(args)
    try:
        child = Child(kind, cmd, _env(prefs), **extra)
    except OSError as e:
        raise TesseraError(f"could not run {cmd[0]}: {e}")
    RUNNING[kind] = child
    _ensure_timer()
    return child


def stop_all():
    for child in list(RUNNING.values()):
        child.stop()


# Blender quitting stops the commands it started.
atexit.register(stop_all)


def asset_roots(prefs):
    """The preferences' asset roots: folders separated by `;`."""
    return [r.strip() for r in (prefs.asset_roots or "").split(";") if r.strip()]


def submit_args(settings, blend, roots=()):
    """The `tessera submit` command line for the panel's settings; `roots`
    are the studio's asset roots (files the scene uses there are uploaded;
    `tessera submit` refuses one outside them and the file's folder)."""
    args = ["submit", blend, "--json",
            "--tiles", f"{settings.tiles_cols}x{settings.tiles_rows}",
            "--sample-ranges", str(settings.sample_ranges),
            "--priority", str(settings.priority)]
    frames = settings.frames.strip()
    if frames:
        args += ["--frames", frames]
    if settings.budget_usd > 0:
        args += ["--budget-usd", f"{settings.budget_usd:.2f}"]
    for root in roots:
        args += ["--asset-root", root]
    return args


def output_folder(scene):
    """The folder of the scene's output path (Render Properties > Output)."""
    path = bpy.path.abspath(scene.render.filepath or "//")
    if path.endswith(("/", "\\")) or os.path.isdir(path):
        return os.path.normpath(path)
    return os.path.dirname(path) or "."


def apply_status(settings, status):
    settings.state = status.get("state", "")
    settings.frames_done = int(status.get("frames_done") or 0)
    settings.frames_total = int(status.get("frames_total") or 0)
    done, total = status.get("tasks_done") or 0, status.get("tasks_total") or 0
    settings.progress = (100.0 * done / total) if total else 0.0
    settings.message = status.get("error") or status.get("blocked") or ""


def _ended(settings, child):
    """Takes in the answer of a command that ended."""
    answer, error = child.result()
    child.close()
    if child.kind == "submit":
        if child.extra.get("stopped"):
            settings.state = "canceled"
            settings.message = "submission canceled: nothing was queued"
        elif error:
            settings.state = "failed"
            settings.message = error
        else:
            settings.job_id = int(answer["id"])
            apply_status(settings, answer)
    elif child.kind == "status":
        if error:
            settings.message = error
        elif int(answer.get("id") or settings.job_id) == settings.job_id:
            fetched_message = settings.message if settings.fetched else ""
            apply_status(settings, answer)
            settings.message = settings.message or fetched_message
    elif child.kind == "fetch":
        if error:
            settings.fetch_failed = True
            settings.message = error
        else:
            apply_status(settings, answer)
            if answer.get("state") == "done":
                settings.fetched = child.extra["folder"]
                files = answer.get("files") or []
                settings.message = f"{len(files)} frames in {settings.fetched}"
    elif child.kind == "cancel":
        settings.message = error or f"job {settings.job_id} canceled"


def _activity(child, now):
    seconds = int(now - child.started)
    what = {
        "submit": "Scanning and uploading",
        "fetch": "Fetching frames (when the job is done)",
        "cancel": "Canceling",
    }.get(child.kind)
    if what is None:
        return ""
    line = child.last_error_line()
    return f"{what}: {seconds} s" + (f" — {line}" if line else "")


_LAST_STATUS = [0.0]


def _poll():
    """The panel's timer (and `refresh`'s first step): takes in the answers
    of commands that ended, shows what runs, starts the next status poll
    and the fetch of a done job. Never waits. Returns when to look again, or
    None once nothing runs and the job is final."""
    scene = bpy.context.scene
    if scene is None:
        return None
    settings = scene.tessera
    now = time.monotonic()
    for kind, child in list(RUNNING.items()):
        if not child.running():
            del RUNNING[kind]
            _ended(settings, child)
    settings.activity = " · ".join(
        a for a in (_activity(c, now) for c in RUNNING.values()) if a
    )
    prefs = _prefs(bpy.context)
    job_live = settings.job_id and settings.state not in FINAL_STATES
    try:
        if (prefs is not None and job_live and "status" not in RUNNING
                and now - _LAST_STATUS[0] >= POLL_SECONDS):
            _start_status(prefs, settings)
        if (prefs is not None and settings.state == "done" and not settings.fetched
                and "fetch" not in RUNNING and not settings.fetch_failed):
            _start_fetch(prefs, scene)
    except TesseraError as e:
        settings.message = str(e)
    screen = bpy.context.screen
    for area in screen.areas if screen else []:
        area.tag_redraw()
    if RUNNING:
        return WATCH_SECONDS
    if settings.job_id and settings.state not in FINAL_STATES:
        return POLL_SECONDS
    return None


def _start_status(prefs, settings):
    _LAST_STATUS[0] = time.monotonic()
    return start(prefs, "status", ["status", str(settings.job_id), "--json"])


def _start_fetch(prefs, scene):
    folder = output_folder(scene)
    settings = scene.tessera
    return start(prefs, "fetch",
                 ["wait", str(settings.job_id), "--json", "--output", folder], folder=folder)


def _ensure_timer():
    if bpy.app.background:
        return  # no timers run: the caller polls
    if not bpy.app.timers.is_registered(_poll):
        bpy.app.timers.register(_poll, first_interval=WATCH_SECONDS)


class TesseraPreferences(bpy.types.AddonPreferences):
    bl_idname = __package__ or __name__

    ticket: bpy.props.StringProperty(
        name="Client ticket",
        description="The coordinator's client ticket (the line in DATA_DIR/client.ticket)",
        subtype="PASSWORD",
    )
    tessera_path: bpy.props.StringProperty(
        name="tessera program",
        description="The tessera command line program (default: tessera on the PATH)",
        subtype="FILE_PATH",
        default="tessera",
    )
    asset_roots: bpy.props.StringProperty(
        name="Asset roots",
        description=(
            "Folders of shared assets (textures, libraries) outside the .blend's folder that "
            "scenes may use, separated by ';'. Submit refuses any other file outside the "
            ".blend's folder, naming it (TESSERA_ASSET_ROOTS and the client config count too)"
        ),
    )

    def draw(self, context):
        self.layout.prop(self, "ticket")
        self.layout.prop(self, "tessera_path")
        self.layout.prop(self, "asset_roots")


class TesseraSettings(bpy.types.PropertyGroup):
    frames: bpy.props.StringProperty(
        name="Frames",
        description="Frames to render: 1-250, 1,5,9 or a mix (empty: the scene's range)",
    )
    tiles_cols: bpy.props.IntProperty(name="Tiles X", default=1, min=1, max=64)
    tiles_rows: bpy.props.IntProperty(name="Tiles Y", default=1, min=1, max=64)
    sample_ranges: bpy.props.IntProperty(
        name="Sample ranges",
        description="Split each tile's samples into this many tasks, merged exactly",
        default=1, min=1, max=1024,
    )
    priority: bpy.props.IntProperty(name="Priority", description="Higher runs first", default=0)
    budget_usd: bpy.props.FloatProperty(
        name="Budget (USD)",
        description="Stop the job when it has cost this much (0: no budget)",
        default=0.0, min=0.0,
    )
    job_id: bpy.props.IntProperty(name="Job", default=0)
    state: bpy.props.StringProperty(name="State")
    progress: bpy.props.FloatProperty(name="Progress", subtype="PERCENTAGE", min=0, max=100)
    frames_done: bpy.props.IntProperty()
    frames_total: bpy.props.IntProperty()
    message: bpy.props.StringProperty()
    activity: bpy.props.StringProperty()
    fetched: bpy.props.StringProperty(name="Fetched into")
    fetch_failed: bpy.props.BoolProperty()


class TESSERA_OT_submit(bpy.types.Operator):
    """Save the file and render it on the Tessera farm (uploads in the background)"""

    bl_idname = "tessera.submit"
    bl_label = "Submit to Tessera"

    def execute(self, context):
        settings = context.scene.tessera
        prefs = _prefs(context)
        try:
            if "submit" in RUNNING:
                raise TesseraError("a submission is already running: cancel it first")
            if not bpy.data.filepath:
                raise TesseraError("save the file first: the farm renders the saved .blend")
            bpy.ops.wm.save_mainfile()
            args = submit_args(settings, bpy.data.filepath, asset_roots(prefs))
            start(prefs, "submit", args)
        except TesseraError as e:
            settings.message = str(e)
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        settings.job_id = 0
        settings.state = "submitting"
        settings.fetched = ""
        settings.fetch_failed = False
        settings.message = ""
        settings.progress = 0.0
        settings.frames_done = settings.frames_total = 0
        self.report({"INFO"}, "Tessera: scanning and uploading in the background")
        return {"FINISHED"}


class TESSERA_OT_refresh(bpy.types.Operator):
    """Ask the farm how the job is doing (in the background)"""

    bl_idname = "tessera.refresh"
    bl_label = "Refresh"

    def execute(self, context):
        settings = context.scene.tessera
        _poll()
        if not settings.job_id:
            if "submit" in RUNNING:
                return {"FINISHED"}
            self.report({"ERROR"}, "no Tessera job submitted from this file yet")
            return {"CANCELLED"}
        if "status" not in RUNNING:
            try:
                _start_status(_prefs(context), settings)
            except TesseraError as e:
                settings.message = str(e)
                self.report({"WARNING"}, str(e))
                return {"CANCELLED"}
        return {"FINISHED"}


class TESSERA_OT_fetch(bpy.types.Operator):
    """Download the job's frames into the scene's output folder, in the
    background (of a running job: once it is done)"""

    bl_idname = "tessera.fetch"
    bl_label = "Fetch frames"

    def execute(self, context):
        settings = context.scene.tessera
        if not settings.job_id:
            self.report({"ERROR"}, "no Tessera job submitted from this file yet")
            return {"CANCELLED"}
        if "fetch" in RUNNING:
            return {"FINISHED"}
        try:
            settings.fetched = ""
            settings.fetch_failed = False
            _start_fetch(_prefs(context), context.scene)
        except TesseraError as e:
            settings.message = str(e)
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        return {"FINISHED"}


class TESSERA_OT_cancel(bpy.types.Operator):
    """Stop the running submission (its upload), or cancel the job on the farm"""

    bl_idname = "tessera.cancel"
    bl_label = "Cancel"

    def execute(self, context):
        settings = context.scene.tessera
        submitting = RUNNING.get("submit")
        if submitting is not None:
            submitting.extra["stopped"] = True
            submitting.stop()
            settings.activity = "Stopping the submission"
            return {"FINISHED"}
        if not settings.job_id:
            self.report({"ERROR"}, "nothing to cancel")
            return {"CANCELLED"}
        fetching = RUNNING.get("fetch")
        if fetching is not None:
            fetching.stop()
        try:
            start(_prefs(context), "cancel", ["cancel", str(settings.job_id)])
        except TesseraError as e:
            settings.message = str(e)
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        return {"FINISHED"}


class RENDER_PT_tessera(bpy.types.Panel):
    bl_label = "Tessera"
    bl_space_type = "PROPERTIES"
    bl_region_type = "WINDOW"
    bl_context = "render"

    def draw(self, context):
        # Reads properties only: no process, no file but a stat.
        layout = self.layout
        settings = context.scene.tessera
        prefs = _prefs(context)
        if prefs is not None and not prefs.ticket:
            layout.label(text="Set the client ticket in the add-on preferences", icon="ERROR")
        layout.prop(settings, "frames")
        row = layout.row(align=True)
        row.prop(settings, "tiles_cols")
        row.prop(settings, "tiles_rows")
        layout.prop(settings, "sample_ranges")
        layout.prop(settings, "priority")
        layout.prop(settings, "budget_usd")
        layout.operator("tessera.submit", icon="RENDER_ANIMATION")
        if settings.activity:
            layout.label(text=settings.activity, icon="TIME")
        if settings.job_id or settings.state or settings.message:
            box = layout.box()
            if settings.job_id:
                box.label(text=f"Job {settings.job_id}: {settings.state} — "
                               f"{settings.frames_done}/{settings.frames_total} frames, "
                               f"{settings.progress:.0f}% of tasks")
            if settings.message:
                icon = "ERROR" if settings.state in ("failed",) else "INFO"
                box.label(text=settings.message, icon=icon)
            row = box.row()
            row.operator("tessera.refresh", icon="FILE_REFRESH")
            row.operator("tessera.fetch", icon="IMPORT")
            row.operator("tessera.cancel", icon="CANCEL")
            if settings.fetched:
                box.label(text=f"Frames in {settings.fetched}")
        layout.label(text=f"Frames land in {output_folder(context.scene)}")


CLASSES = (
    TesseraPreferences,
    TesseraSettings,
    TESSERA_OT_submit,
    TESSERA_OT_refresh,
    TESSERA_OT_fetch,
    TESSERA_OT_cancel,
    RENDER_PT_tessera,
)


def register():
    for cls in CLASSES:
        bpy.utils.register_class(cls)
    bpy.types.Scene.tessera = bpy.props.PointerProperty(type=TesseraSettings)


def unregister():
    # The commands this add-on started end with it.
    stop_all()
    if bpy.app.timers.is_registered(_poll):
        bpy.app.timers.unregister(_poll)
    del bpy.types.Scene.tessera
    for cls in reversed(CLASSES):
        bpy.utils.unregister_class(cls)
