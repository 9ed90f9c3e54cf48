"""Tessera: submit the open .blend to a Tessera render farm from Blender.

A "Tessera" panel in the render properties. It submits the open file
(saved first) by running the `tessera` command line, which scans the
file's dependencies, uploads what the farm lacks and queues the job:
`tessera submit FILE --json ...`, with the coordinator's client ticket from
the add-on preferences passed in the TESSERA_TICKET environment variable,
never on a command line. A timer polls `tessera status JOB --json` for the
job's progress; once it is done, `tessera wait JOB --output DIR` fetches
the frames into the scene's output folder (the folder of Render Properties >
Output), named as Blender would name them.

Works in Blender 3.4 and later, and in the `bpy` module (4.5), where no
timer runs: call `bpy.ops.tessera.refresh()` to poll, as the tests do.
"""

import json
import os
import shutil
import subprocess
import sys

import bpy

bl_info = {
    "name": "Tessera",
    "author": "Tessera",
    "version": (0, 1, 0),
    "blender": (3, 4, 0),
    "location": "Properties > Render > Tessera",
    "description": "Render the open file on a Tessera render farm",
    "category": "Render",
}

# How often the panel's timer asks the farm for the job's progress.
POLL_SECONDS = 2.0
# The longest a `tessera` command the panel runs may take (a submit uploads
# the file's dependencies; a fetch downloads the frames).
COMMAND_TIMEOUT = 3600
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


def run_tessera(prefs, args, timeout=COMMAND_TIMEOUT):
    """Runs `tessera ARGS` with the ticket in TESSERA_TICKET; returns its
    JSON answer (the last line of stdout)."""
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
    cmd = [tessera_binary(prefs)] + list(args)
    try:
        done = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise TesseraError(f"`tessera {args[0]}` took longer than {timeout} s")
    lines = [l for l in done.stdout.splitlines() if l.strip()]
    answer = None
    if lines:
        try:
            answer = json.loads(lines[-1])
        except ValueError:
            answer = None
    if done.returncode != 0 and answer is None:
        reason = done.stderr.strip().splitlines()
        raise TesseraError(reason[-1] if reason else f"tessera exited with {done.returncode}")
    if answer is None:
        raise TesseraError(f"`tessera {args[0]}` printed no JSON")
    return answer


_HELP = {}


def cli_has_option(prefs, option):
    """Whether this `tessera submit` knows `option` (e.g. --budget-usd);
    asked once per program."""
    try:
        binary = tessera_binary(prefs)
    except TesseraError:
        return False
    if binary not in _HELP:
        try:
            out = subprocess.run([binary, "submit", "--help"],
                                 capture_output=True, text=True, timeout=30)
            _HELP[binary] = out.stdout
        except (OSError, subprocess.TimeoutExpired):
            return False
    return option in _HELP[binary]


def asset_roots(prefs):
    """The preferences' asset roots: folders separated by `;`."""
    return [r.strip() for r in (prefs.asset_roots or "").split(";") if r.strip()]


def submit_args(settings, blend, budget_supported, roots=()):
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
    if budget_supported and settings.budget_usd > 0:
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
    fetched: bpy.props.StringProperty(name="Fetched into")


class TESSERA_OT_submit(bpy.types.Operator):
    """Save the file and render it on the Tessera farm"""

    bl_idname = "tessera.submit"
    bl_label = "Submit to Tessera"

    def execute(self, context):
        settings = context.scene.tessera
        prefs = _prefs(context)
        try:
            if not bpy.data.filepath:
                raise TesseraError("save the file first: the farm renders the saved .blend")
            bpy.ops.wm.save_mainfile()
            budget = settings.budget_usd > 0 and cli_has_option(prefs, "--budget-usd")
            roots = asset_roots(prefs)
            if roots and not cli_has_option(prefs, "--asset-root"):
                raise TesseraError("this tessera program has no --asset-root: update it")
            status = run_tessera(prefs, submit_args(settings, bpy.data.filepath, budget, roots))
        except TesseraError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        settings.job_id = int(status["id"])
        settings.fetched = ""
        apply_status(settings, status)
        self.report({"INFO"}, f"Tessera job {settings.job_id} submitted")
        if not bpy.app.background:
            bpy.app.timers.register(_poll, first_interval=POLL_SECONDS)
        return {"FINISHED"}


class TESSERA_OT_refresh(bpy.types.Operator):
    """Ask the farm how the job is doing; fetch its frames once it is done"""

    bl_idname = "tessera.refresh"
    bl_label = "Refresh"

    def execute(self, context):
        settings = context.scene.tessera
        if not settings.job_id:
            self.report({"ERROR"}, "no Tessera job submitted from this file yet")
            return {"CANCELLED"}
        try:
            status = run_tessera(_prefs(context), ["status", str(settings.job_id), "--json"], timeout=60)
        except TesseraError as e:
            settings.message = str(e)
            self.report({"WARNING"}, str(e))
            return {"CANCELLED"}
        apply_status(settings, status)
        return {"FINISHED"}


class TESSERA_OT_fetch(bpy.types.Operator):
    """Download the job's frames into the scene's output folder"""

    bl_idname = "tessera.fetch"
    bl_label = "Fetch frames"

    def execute(self, context):
        settings = context.scene.tessera
        folder = output_folder(context.scene)
        try:
            status = run_tessera(
                _prefs(context),
                ["wait", str(settings.job_id), "--json", "--output", folder],
            )
        except TesseraError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        apply_status(settings, status)
        if status.get("state") != "done":
            self.report({"ERROR"}, f"job {settings.job_id} {status.get('state')}: {settings.message}")
            return {"CANCELLED"}
        settings.fetched = folder
        self.report({"INFO"}, f"{len(status.get('files') or [])} frames in {folder}")
        return {"FINISHED"}


class TESSERA_OT_cancel(bpy.types.Operator):
    """Cancel the job on the farm"""

    bl_idname = "tessera.cancel"
    bl_label = "Cancel job"

    def execute(self, context):
        settings = context.scene.tessera
        prefs = _prefs(context)
        try:
            tessera = tessera_binary(prefs)
            env = dict(os.environ, TESSERA_TICKET=(prefs.ticket or "").strip())
            subprocess.run([tessera, "cancel", str(settings.job_id)], env=env,
                           capture_output=True, timeout=60, check=True)
        except (TesseraError, subprocess.SubprocessError) as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        return bpy.ops.tessera.refresh()


def _poll():
    """The panel's timer: refresh, fetch once done, stop when final."""
    scene = bpy.context.scene
    if scene is None or not scene.tessera.job_id:
        return None
    bpy.ops.tessera.refresh()
    settings = scene.tessera
    for area in bpy.context.screen.areas if bpy.context.screen else []:
        area.tag_redraw()
    if settings.state == "done" and not settings.fetched:
        bpy.ops.tessera.fetch()
    if settings.state in FINAL_STATES:
        return None
    return POLL_SECONDS


class RENDER_PT_tessera(bpy.types.Panel):
    bl_label = "Tessera"
    bl_space_type = "PROPERTIES"
    bl_region_type = "WINDOW"
    bl_context = "render"

    def draw(self, context):
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
        if prefs is not None and cli_has_option(prefs, "--budget-usd"):
            layout.prop(settings, "budget_usd")
        else:
            layout.label(text="Budget: this tessera has no --budget-usd")
        layout.operator("tessera.submit", icon="RENDER_ANIMATION")
        if settings.job_id:
            box = layout.box()
            box.label(text=f"Job {settings.job_id}: {settings.state} — "
                           f"{settings.frames_done}/{settings.frames_total} frames, "
                           f"{settings.progress:.0f}% of tasks")
            if settings.message:
                box.label(text=settings.message, icon="INFO")
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
    if bpy.app.timers.is_registered(_poll):
        bpy.app.timers.unregister(_poll)
    del bpy.types.Scene.tessera
    for cls in reversed(CLASSES):
        bpy.utils.unregister_class(cls)
