"""A Python client for a Tessera render farm's HTTP API (stdlib only).

    import tessera_client
    farm = tessera_client.Client("@/srv/tessera/client.ticket")
    job = farm.submit("shots/sh010.blend", frames="1-24", tiles="2x2")
    for path in farm.download_frames(job["id"], "out/sh010", timeout=3600):
        print("frame on disk:", path)

The client ticket is all it needs: its address and port are where the API
listens (``coordinator --http``), its ``fp=`` pins the coordinator's
certificate, its ``secret=`` is the bearer secret. Scene files are hashed
and uploaded by the ``tessera`` binary (``tessera submit --upload-only``),
which then prints the job spec this client posts: one content-addressed
upload path, the CLI's, with its chunking, dedupe and .blend dependency scan.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.parse
from typing import Any, Dict, Iterable, Iterator, List, Optional, Union

#: A job's status as the API returns it (``id``, ``state``, ``frames_done`` …).
Status = Dict[str, Any]
PathLike = Union[str, "os.PathLike[str]"]

from ._blake3 import blake3_hex

__all__ = [
    "Client", "Ticket", "TesseraError", "Unauthorized", "NotFound", "Conflict",
    "Invalid", "Unavailable", "Internal", "ERRORS",
    "Timeout", "JobFailed", "EventStream", "blake3_hex", "FINAL_STATES",
    "TesseraNotInstalled",
]

#: Job states a job never leaves.
FINAL_STATES = ("done", "failed", "canceled")
#: Frames up to this size are checked against their digest on download
#: (pure-Python BLAKE3 is slow; larger ones come over pinned TLS).
VERIFY_MAX = 8 << 20


class TesseraError(Exception):
    """The farm refused a request: ``status`` is the HTTP status, ``kind``
    the error body's kind (``"not_found"``, ``"conflict"`` …, ``None`` when
    it has none), ``message`` the coordinator's reason. Catch a subclass to
    act on a kind; never match the message's words."""

    def __init__(self, status: int, message: str, kind: Optional[str] = None) -> None:
        super().__init__("%s (HTTP %d)" % (message, status))
        self.status = status
        self.message = message
        self.kind = kind


class TesseraNotInstalled(FileNotFoundError):
    """The ``tessera`` binary, which hashes and uploads scenes, was not
    found. ``path`` is what was looked for."""

    def __init__(self, path: str) -> None:
        super().__init__(
            "the tessera binary %r was not found: install it (cargo install --path . in a "
            "Tessera checkout, or your studio's package) and put it on the PATH, or point "
            "$TESSERA_BIN (or Client(tessera=...)) at it" % path)
        self.path = path


class Unauthorized(TesseraError):
    """A missing or wrong bearer secret (HTTP 401, kind ``unauthorized``)."""


class NotFound(TesseraError):
    """No such job, worker or frame (HTTP 404, kind ``not_found``)."""


class Conflict(TesseraError):
    """The job is in a state that forbids the request: cancel or pause of
    a finished job, retry of one that did not fail, a request id reused for
    another submit (HTTP 409, kind ``conflict``)."""


class Invalid(TesseraError):
    """The request is wrong: a spec out of bounds, a file not uploaded, a
    malformed query or body (HTTP 400, kind ``invalid``)."""


class Unavailable(TesseraError):
    """The farm cannot do it now; asking again later may work (HTTP 503,
    kind ``unavailable``)."""


class Internal(TesseraError):
    """The coordinator failed (its database, its store): not the caller's
    doing (HTTP 500, kind ``internal``)."""


#: The exception for each error kind the API names, and for each status.
ERRORS = {
    "not_found": NotFound, "conflict": Conflict, "invalid": Invalid,
    "unauthorized": Unauthorized, "unavailable": Unavailable, "internal": Internal,
}
_BY_STATUS = {404: NotFound, 409: Conflict, 400: Invalid, 401: Unauthorized,
              503: Unavailable, 500: Internal}


def _error(status, raw):
    """The exception for an error answer: by the body's ``kind``, else by
    the status (a proxy's answer has no kind)."""
    try:
        body = json.loads(raw)
        message, kind = body["error"], body.get("kind")
    except (ValueError, KeyError, TypeError, AttributeError):
        message, kind = raw.decode("utf-8", "replace"), None
    cls = ERRORS.get(kind) or _BY_STATUS.get(status, TesseraError)
    return cls(status, message, kind)


class Timeout(Exception):
    """A wait ran out of time; ``job`` is the last status seen."""

    def __init__(self, message: str, job: Optional[Status] = None) -> None:
        super().__init__(message)
        self.job = job


class JobFailed(Exception):
    """``wait(..., check=True)``: the job failed or was canceled."""

    def __init__(self, job: Status) -> None:
        super().__init__("job %s %s: %s" % (job["id"], job["state"].lower(), job.get("error")))
        self.job = job


class Ticket:
    """A parsed ``tessera://client@HOST:PORT/?fp=…&secret=…`` line."""

    def __init__(self, line):
        line = line.strip()
        if not line.startswith("tessera://"):
            raise ValueError("not a Tessera ticket: it does not start with tessera://")
        rest = line[len("tessera://"):]
        role, _, rest = rest.partition("@")
        addr, _, query = rest.partition("/?")
        if role != "client":
            raise ValueError("this is a %s ticket; the API takes DATA_DIR/client.ticket" % role)
        params = dict(urllib.parse.parse_qsl(query))
        if "fp" not in params or "secret" not in params:
            raise ValueError("not a Tessera ticket: no fp= or secret=")
        self.line = line
        self.addr = addr
        self.fingerprint = params["fp"].lower()
        self.secret = params["secret"]

    @classmethod
    def resolve(cls, value: Optional[str] = None) -> "Ticket":
        """A ticket from ``value`` (a line, or ``@FILE``), else $TESSERA_TICKET."""
        value = value or os.environ.get("TESSERA_TICKET")
        if not value:
            raise ValueError("no ticket: pass one (or @DATA_DIR/client.ticket), or set TESSERA_TICKET")
        if value.startswith("@"):
            with open(value[1:]) as f:
                value = f.read()
        return cls(value)


class _PinnedConnection(http.client.HTTPSConnection):
    """HTTPS to a self-signed certificate, accepted only when its DER hashes
    (BLAKE3) to the ticket's fingerprint."""

    def __init__(self, host, port, fingerprint, timeout):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.set_alpn_protocols(["http/1.1"])
        super().__init__(host, port, timeout=timeout, context=ctx)
        self._fingerprint = fingerprint

    def connect(self):
        super().connect()
        der = self.sock.getpeercert(binary_form=True)
        if der is None or blake3_hex(der) != self._fingerprint:
            self.close()
            raise ssl.SSLError(
                "the coordinator's certificate does not match the ticket's fingerprint "
                "(another server, a ticket of another coordinator, or a coordinator that "
                "serves its own certificate with --http-cert: pass cafile=)")


class _VerifiedConnection(http.client.HTTPSConnection):
    """HTTPS to a coordinator serving an operator's certificate
    (``coordinator --http-cert``), verified as a browser does: its chain
    against ``cafile`` (the system's roots when it is ``"system"``) and its
    name against the URL's host."""

    def __init__(self, host, port, cafile, timeout):
        ctx = ssl.create_default_context(cafile=None if cafile == "system" else cafile)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.set_alpn_protocols(["http/1.1"])
        super().__init__(host, port, timeout=timeout, context=ctx)


_OPTION_FLAGS = {
    # option name -> tessera submit flag, where they differ from --kebab-case
}


def _flags(options):
    """``tessera submit`` flags for keyword options: ``tiles="2x2"`` is
    ``--tiles 2x2``, ``allow_missing=True`` is ``--allow-missing``, a list
    repeats the flag, ``None`` and ``False`` leave it out."""
    out = []
    for key, value in options.items():
        flag = _OPTION_FLAGS.get(key, "--" + key.replace("_", "-"))
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            if key in ("after", "frames", "ids"):
                out += [flag, ",".join(str(v) for v in value)]
            else:
                for v in value:
                    out += [flag, str(v)]
        else:
            out += [flag, str(value)]
    return out


class EventStream:
    """An open event stream (see :meth:`Client.events`)."""

    def __init__(self, conn, response, timeout):
        self._conn, self._response = conn, response
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def __iter__(self) -> "EventStream":
        return self

    def __next__(self) -> Dict[str, Any]:
        while True:
            if self._conn is None:
                raise StopIteration
            if self._deadline is not None:
                left = self._deadline - time.monotonic()
                if left <= 0:
                    self.close()
                    raise StopIteration
                self._conn.sock.settimeout(max(0.05, left))
            try:
                line = self._response.readline()
            except (socket.timeout, OSError):
                line = b""
            if not line:
                self.close()
                raise StopIteration
            line = line.strip()
            if line:
                return json.loads(line)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Client:
    """One coordinator's HTTP API.

    ``ticket``: the client ticket line, ``@FILE``, or None for
    $TESSERA_TICKET. ``url``: where the API listens, when it is not the
    ticket's own address (``coordinator --http HOST:PORT``; also
    $TESSERA_HTTP_URL). ``tessera``: the ``tessera`` binary used for uploads
    (default: $TESSERA_BIN, else ``tessera`` on the PATH). ``cafile``: when
    the coordinator serves the API with an operator's certificate
    (``--http-cert``), the CA file to verify it with, or ``"system"`` for
    the system's roots (also $TESSERA_HTTP_CAFILE); else the coordinator's
    own certificate is pinned by the ticket's fingerprint.
    """

    def __init__(self, ticket: Optional[str] = None, url: Optional[str] = None,
                 tessera: Optional[PathLike] = None, timeout: float = 60.0,
                 cafile: Optional[str] = None) -> None:
        self.ticket = Ticket.resolve(ticket)
        url = url or os.environ.get("TESSERA_HTTP_URL") or "https://" + self.ticket.addr
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "https" or not parsed.hostname or not parsed.port:
            raise ValueError("the API URL must be https://HOST:PORT, not %r" % url)
        self.host, self.port = parsed.hostname, parsed.port
        self.tessera: str = (os.fspath(tessera) if tessera else None) or os.environ.get(
            "TESSERA_BIN") or shutil.which("tessera") or "tessera"
        self.timeout = timeout
        self.cafile = cafile or os.environ.get("TESSERA_HTTP_CAFILE") or None
        self._secret = self.ticket.secret

    # -- transport ---------------------------------------------------------

    def _connection(self, timeout=None):
        timeout = timeout if timeout is not None else self.timeout
        if self.cafile:
            return _VerifiedConnection(self.host, self.port, self.cafile, timeout)
        return _PinnedConnection(self.host, self.port, self.ticket.fingerprint, timeout)

    def _open(self, method, path, body=None, query=None, timeout=None, secret=None):
        if query:
            query = {k: v for k, v in query.items() if v is not None}
            if query:
                path += "?" + urllib.parse.urlencode(query)
        headers = {}
        secret = self._secret if secret is None else secret
        if secret:
            headers["Authorization"] = "Bearer " + secret
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = self._connection(timeout)
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if response.status >= 400:
            raw = response.read()
            conn.close()
            raise _error(response.status, raw)
        return conn, response

    def _json(self, method, path, body=None, query=None):
        conn, response = self._open(method, path, body=body, query=query)
        try:
            return json.loads(response.read())
        finally:
            conn.close()

    def request(self, method: str, path: str, body: Any = None,
                query: Optional[Dict[str, Any]] = None, secret: Optional[str] = None) -> Any:
        """A raw request: ``(status, headers, body bytes)``; no exception on
        an error status. ``secret`` replaces the bearer secret ("" sends none)."""
        try:
            conn, response = self._open(method, path, body=body, query=query, secret=secret)
        except TesseraError as e:
            body = {"error": e.message}
            if e.kind is not None:
                body["kind"] = e.kind
            return e.status, {}, json.dumps(body).encode()
        try:
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    # -- the farm ----------------------------------------------------------

    def openapi(self) -> Dict[str, Any]:
        """The API's OpenAPI 3 document."""
        return self._json("GET", "/v1/openapi.json")

    @staticmethod
    def _filters(state, name, since, ids):
        if isinstance(state, (list, tuple)):
            state = ",".join(state)
        if isinstance(ids, (list, tuple)):
            ids = ",".join(str(i) for i in ids)
        if since is not None:
            since = int(since)
        return {"state": state, "name": name, "since": since, "ids": ids}

    def status(self, state: Union[None, str, List[str]] = None, name: Optional[str] = None,
               since: Optional[float] = None, ids: Union[None, str, List[int]] = None) -> Dict[str, Any]:
        """``{"jobs": [...], "workers": [...]}``, jobs filtered by state
        (``"running"`` or a list), name (a glob), since (unix ms) and ids."""
        return self._json("GET", "/v1/status", query=self._filters(state, name, since, ids))

    def jobs(self, state: Union[None, str, List[str]] = None, name: Optional[str] = None,
             since: Optional[float] = None, ids: Union[None, str, List[int]] = None,
             limit: Optional[int] = None, offset: Optional[int] = None) -> Any:
        """The jobs alone, filtered as in :meth:`status`, oldest first; with
        ``limit`` (1 to 1000), one page of them newest first, ``offset``
        newest skipped."""
        query = self._filters(state, name, since, ids)
        query.update({"limit": limit, "offset": offset})
        return self._json("GET", "/v1/jobs", query=query)

    def job(self, job: int) -> Status:
        return self._json("GET", "/v1/jobs/%d" % job)

    def submit_spec(self, spec: Dict[str, Any]) -> Status:
        """Submits a job spec whose files are uploaded already."""
        return self._json("POST", "/v1/jobs", body=spec)

    def upload(self, scene: PathLike, **options: Any) -> Dict[str, Any]:
        """Hashes and uploads ``scene`` and what it uses with the ``tessera``
        binary; returns the job spec to submit. Options are ``tessera
        submit``'s flags (see :meth:`submit`)."""
        cmd = [self.tessera, "submit", "--upload-only", "--ticket", self.ticket.line]
        cmd += _flags(options) + [os.fspath(scene)]
        try:
            run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except FileNotFoundError:
            raise TesseraNotInstalled(self.tessera) from None
        if run.returncode != 0:
            message = (run.stderr.decode("utf-8", "replace").strip()
                       or "tessera submit --upload-only failed")
            # By the binary's exit code (README): 6 is an unreachable farm.
            if run.returncode == 6:
                raise Unavailable(503, message, "unavailable")
            raise Invalid(400, message, "invalid")
        return json.loads(run.stdout)

    def submit(self, scene: PathLike, **options: Any) -> Status:
        """Submits a ``.blend``, a builtin ``*.scene.json`` or an Unreal
        project. Every ``tessera submit`` option is a keyword: ``frames="1-24"``,
        ``tiles="2x2"``, ``sample_ranges=4``, ``samples=64``, ``verify=10``,
        ``name=…``, ``priority=5``, ``request_id=…``, ``allow_missing=True``,
        ``blender=">=4.2"``, ``blender_python=…``, ``frame_names="frame"``,
        ``frame_files=["cache/fluid_data_####.vdb"]``, Unreal's ``level_sequence=…`` and the rest; an option ``tessera``
        learns later works too (its flag is ``--`` and the name with dashes).
        Files the scene uses outside its folder are uploaded only under
        ``asset_root=["/studio/assets"]`` (or ``TESSERA_ASSET_ROOTS``),
        ``project_root=…`` or ``allow_file=[…]``; any other is refused
        (:class:`TesseraError`, naming each). Returns the job's status."""
        return self.submit_spec(self.upload(scene, **options))

    def cancel(self, job: int) -> Status:
        """Cancels a queued or running job; returns its status. A finished
        job (done, failed or canceled) raises :class:`Conflict`."""
        return self._json("POST", "/v1/jobs/%d/cancel" % job)

    def pause(self, job: int) -> Status:
        """Pauses a queued or running job (:class:`Conflict` once it is
        finished); returns its status."""
        return self._json("POST", "/v1/jobs/%d/pause" % job)

    def resume(self, job: int) -> Status:
        """Resumes a paused job (:class:`Conflict` once it is finished)."""
        return self._json("POST", "/v1/jobs/%d/resume" % job)

    def set_priority(self, job: int, priority: int) -> Status:
        """Gives a queued or running job a new priority (higher goes first;
        :class:`Conflict` once it is finished); returns its status."""
        return self._json("POST", "/v1/jobs/%d/priority" % job, body={"priority": priority})

    def retry(self, job: int) -> Status:
        """Puts a failed job back in the queue (its tasks without a result)."""
        return self._json("POST", "/v1/jobs/%d/retry" % job)

    def detail(self, job: int) -> Status:
        """The job with its frames (runs of one state), latest failed
        attempts and workers, as ``tessera status JOB --json``."""
        return self._json("GET", "/v1/jobs/%d/detail" % job)

    def frames(self, job: int) -> List[Dict[str, Any]]:
        """The job's stitched frames so far: frame, digest, size, format, name."""
        return self._json("GET", "/v1/jobs/%d/frames" % job)

    def frame_bytes(self, job: int, frame: int) -> bytes:
        """One stitched frame's file, checked against its digest when small."""
        conn, response = self._open("GET", "/v1/jobs/%d/frames/%d" % (job, frame))
        try:
            data = response.read()
            digest = response.getheader("X-Tessera-Digest")
        finally:
            conn.close()
        if digest and len(data) <= VERIFY_MAX and blake3_hex(data) != digest:
            raise TesseraError(502, "frame %d of job %d does not match its digest" % (frame, job))
        return data

    def tiles(self, job: int, frame: int) -> Any:
        return self._json("GET", "/v1/jobs/%d/frames/%d/tiles" % (job, frame))

    def preview(self, job: int, frame: int) -> bytes:
        """A stitched frame scaled down to at most 320 pixels a side (PNG)."""
        conn, response = self._open("GET", "/v1/jobs/%d/frames/%d/preview" % (job, frame))
        try:
            return response.read()
        finally:
            conn.close()

    def tile_preview(self, job: int, frame: int, tile: int) -> bytes:
        """A rendered tile at its frame preview's scale (PNG)."""
        conn, response = self._open("GET", "/v1/jobs/%d/frames/%d/tiles/%d/preview" % (job, frame, tile))
        try:
            return response.read()
        finally:
            conn.close()

    def frames_zip(self, job: int, dest: PathLike) -> int:
        """Every frame stitched so far as one zip, written to ``dest``
        (a piece at a time); returns the bytes written."""
        conn, response = self._open("GET", "/v1/jobs/%d/frames.zip" % job)
        written = 0
        try:
            with open(dest, "wb") as out:
                while True:
                    piece = response.read(1 << 20)
                    if not piece:
                        break
                    out.write(piece)
                    written += len(piece)
        finally:
            conn.close()
        return written

    def logs(self, job: int, task: Optional[int] = None) -> Any:
        """The job's failed attempts: task, worker, error and the renderer's log."""
        return self._json("GET", "/v1/jobs/%d/logs" % job, query={"task": task})

    def workers(self) -> Any:
        return self._json("GET", "/v1/workers")

    def worker(self, worker: int) -> Any:
        """One connected worker in detail: status, blocklisted_by,
        quarantined, history (its latest telemetry readings)."""
        return self._json("GET", "/v1/workers/%d" % worker)

    def revoke(self, worker: int) -> Any:
        """Revokes a connected worker's identity: every worker enrolled
        under its name is disconnected and refused from then on."""
        return self._json("POST", "/v1/workers/%d/revoke" % worker)

    def drain(self, worker: int) -> Any:
        """Asks a worker (by id) to finish its tasks and leave."""
        return self._json("POST", "/v1/workers/%d/drain" % worker)

    def missing_blobs(self, digests: Iterable[str]) -> List[str]:
        """Which of these digests (hex) the coordinator lacks."""
        return self._json("POST", "/v1/blobs/missing", body={"digests": list(digests)})["missing"]

    def metrics(self) -> str:
        """The Prometheus text page."""
        conn, response = self._open("GET", "/metrics")
        try:
            return response.read().decode()
        finally:
            conn.close()

    def events(self, job: Optional[int] = None, timeout: Optional[float] = None) -> "EventStream":
        """Farm events from now on, as dicts (``event["type"]``:
        ``task.finished``, ``job.done``, …; see the README), of one job when
        ``job`` is given. The stream is open when this returns, so nothing
        submitted afterwards is missed. Iterate over it; with ``timeout``
        (seconds) it ends then, else when the coordinator closes it. Use it
        as a context manager, or ``close()`` it."""
        conn, response = self._open("GET", "/v1/events", query={"job": job},
                                    timeout=None if timeout is None else min(timeout, 15.0))
        return EventStream(conn, response, timeout)

    def wait(self, job: int, timeout: Optional[float] = None, poll: float = 0.5,
             check: bool = False) -> Status:
        """Waits until the job is done, failed or canceled; returns its
        status. Raises :class:`Timeout` after ``timeout`` seconds, and with
        ``check`` :class:`JobFailed` when it did not finish."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.job(job)
            if status["state"] in FINAL_STATES:
                if check and status["state"] != "done":
                    raise JobFailed(status)
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise Timeout("job %d is still %s after %ss" % (job, status["state"].lower(), timeout), status)
            time.sleep(poll)

    def download_frames(self, job: int, dest: PathLike, timeout: Optional[float] = None,
                        poll: float = 0.5, overwrite: bool = False) -> Iterator[str]:
        """Writes each frame into ``dest`` as soon as it is stitched, and
        yields its path; returns once the job is final and every frame it
        has is on disk (the finished frames of a failed or canceled job
        too). Frames are named as the scene names them, else
        ``frame_NNNN.EXT``. A file there with other bytes is an error
        unless ``overwrite``. Raises :class:`Timeout` after ``timeout``."""
        os.makedirs(dest, exist_ok=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        written = set()
        while True:
            status = self.job(job)
            for f in self.frames(job):
                if f["frame"] in written:
                    continue
                name = f.get("name")
                if not name or os.path.basename(name) != name or name in (".", ".."):
                    name = "frame_%04d.%s" % (f["frame"], {"png": "png", "exr": "exr"}.get(f["format"], "img"))
                path = os.path.join(dest, name)
                data = self.frame_bytes(job, f["frame"])
                if os.path.exists(path) and not overwrite:
                    with open(path, "rb") as existing:
                        if existing.read() != data:
                            raise FileExistsError("%s already exists and holds something else" % path)
                else:
                    tmp = path + ".tessera-part"
                    with open(tmp, "wb") as out:
                        out.write(data)
                    os.replace(tmp, path)
                written.add(f["frame"])
                yield path
            if status["state"] in FINAL_STATES:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise Timeout("job %d is still %s after %ss" % (job, status["state"].lower(), timeout), status)
            time.sleep(poll)
