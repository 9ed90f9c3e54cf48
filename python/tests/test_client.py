"""The Python client against a real coordinator (started by the Rust e2e
test ``http_api::python_client_drives_every_endpoint_of_a_real_farm``, which
sets TESSERA_TICKET, TESSERA_BIN, TESSERA_TEST_SCENES and two builtin
workers). Every route of the OpenAPI document is called, and each JSON
answer is checked against the document's schema."""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import zipfile

import tessera_client
from tessera_client import Client

HERE = os.path.dirname(os.path.abspath(__file__))
DOC_PATH = os.path.join(HERE, "..", "..", "api", "openapi.json")
SCENE = os.path.join(os.environ.get("TESSERA_TEST_SCENES", ""), "demo.scene.json")
WAIT = 180


def check_schema(doc, schema, value, where="$"):
    """A strict check of ``value`` against an OpenAPI 3.0 schema (the parts
    the document uses: $ref, type, nullable, required, properties, items,
    enum, oneOf, allOf, pattern, min/maxItems)."""
    import re
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return check_schema(doc, doc["components"]["schemas"][name], value, where)
    if value is None:
        assert schema.get("nullable"), "%s: null where %s is wanted" % (where, schema)
        return
    if "allOf" in schema:
        for s in schema["allOf"]:
            check_schema(doc, s, value, where)
    if "oneOf" in schema:
        fits = 0
        for s in schema["oneOf"]:
            try:
                check_schema(doc, s, value, where)
                fits += 1
            except AssertionError:
                pass
        assert fits == 1, "%s: %r fits %d of oneOf" % (where, value, fits)
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool}
    if kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), "%s: %r is not an integer" % (where, value)
        if "minimum" in schema:
            assert value >= schema["minimum"], "%s: %r < minimum" % (where, value)
    elif kind == "number":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), "%s: %r is not a number" % (where, value)
    elif kind in types:
        assert isinstance(value, types[kind]), "%s: %r is not a %s" % (where, value, kind)
    if "enum" in schema:
        assert value in schema["enum"], "%s: %r not in %s" % (where, value, schema["enum"])
    if "pattern" in schema:
        assert re.search(schema["pattern"], value), "%s: %r does not match %s" % (where, value, schema["pattern"])
    if kind == "object":
        for key in schema.get("required", []):
            assert key in value, "%s: no %r in %r" % (where, key, sorted(value))
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                check_schema(doc, sub, value[key], where + "." + key)
        if schema.get("additionalProperties") is False:
            extra = set(value) - set(schema.get("properties", {}))
            assert not extra, "%s: unexpected %s" % (where, extra)
    if kind == "array":
        if "minItems" in schema:
            assert len(value) >= schema["minItems"], where
        if "maxItems" in schema:
            assert len(value) <= schema["maxItems"], where
        for i, item in enumerate(value):
            check_schema(doc, schema.get("items", {}), item, "%s[%d]" % (where, i))


def tessera(*args):
    run = subprocess.run([os.environ["TESSERA_BIN"]] + list(args), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, check=True)
    return run.stdout.decode()


class FarmTest(unittest.TestCase):
    """One farm for every test; a finished 2-frame, 2-tile job to look at."""

    shared = {}

    @classmethod
    def setUpClass(cls):
        if not FarmTest.shared:
            farm = Client()
            with open(DOC_PATH) as f:
                doc = json.load(f)
            done = farm.submit(SCENE, frames="1-2", tiles="2x1", samples=8,
                               name="py-done", priority=2)
            farm.wait(done["id"], timeout=WAIT, check=True)
            FarmTest.shared.update(farm=farm, doc=doc, done=done)
        cls.farm = FarmTest.shared["farm"]
        cls.doc = FarmTest.shared["doc"]
        cls.done = FarmTest.shared["done"]

    def valid(self, schema, value):
        check_schema(self.doc, schema, value)
        return value

    def schema_of(self, path, method, status="200"):
        content = self.doc["paths"][path][method]["responses"][status].get("content", {})
        return next(iter(content.values()))["schema"] if content else None


class Auth(FarmTest):
    def test_missing_or_wrong_bearer_secret_is_refused(self):
        for secret in ("", "wrong", self.farm.ticket.secret + "x", self.farm.ticket.secret[:-1]):
            for method, path in (("GET", "/v1/status"), ("GET", "/metrics"),
                                 ("POST", "/v1/jobs/%d/cancel" % self.done["id"]),
                                 ("GET", "/v1/events")):
                status, headers, body = self.farm.request(method, path, secret=secret)
                self.assertEqual(status, 401, (secret, path, body))
                self.assertEqual(json.loads(body)["kind"], "unauthorized")
        wrong = Client(self.farm.ticket.line.replace("secret=", "secret=0"))
        with self.assertRaises(tessera_client.Unauthorized):
            wrong.status()
        # The job is untouched by the refused cancel.
        self.assertEqual(self.farm.job(self.done["id"])["state"], "done")

    def test_the_certificate_is_pinned_by_the_ticket(self):
        ticket = self.farm.ticket.line
        fp = self.farm.ticket.fingerprint
        other = ticket.replace("fp=" + fp, "fp=" + ("0" if fp[0] != "0" else "1") + fp[1:])
        import ssl
        with self.assertRaises(ssl.SSLError):
            Client(other).status()

    def test_the_document_needs_no_secret_and_is_the_repos(self):
        status, _, body = self.farm.request("GET", "/v1/openapi.json", secret="")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body), self.doc)


class Document(FarmTest):
    def test_every_documented_route_is_served_and_answers_its_schema(self):
        job = self.done["id"]
        worker = self.farm.workers()[0]["id"]
        values = {"{job}": str(job), "{frame}": "1", "{tile}": "0", "{worker}": str(worker + 1000)}
        bodies = {
            ("/v1/jobs", "post"): self.farm.upload(SCENE, frames="1", samples=4, name="py-doc"),
            ("/v1/blobs/missing", "post"): {"digests": ["00" * 32]},
        }
        for path, ops in self.doc["paths"].items():
            for method, op in ops.items():
                concrete = path
                for k, v in values.items():
                    concrete = concrete.replace(k, v)
                if path == "/v1/events":
                    # A done job's stream: its final event alone.
                    with self.farm.events(job=job, timeout=5) as events:
                        self.assertEqual([e["type"] for e in events], ["job.done"])
                    continue
                status, headers, body = self.farm.request(method.upper(), concrete,
                                                          body=bodies.get((path, method)))
                self.assertIn(str(status), op["responses"], (method, concrete, status, body))
                if status >= 400:
                    # An error's kind is its status's (the document's enum).
                    kinds = {404: "not_found", 409: "conflict", 400: "invalid", 401: "unauthorized"}
                    self.assertEqual(json.loads(body).get("kind"), kinds.get(status), (method, concrete, body))
                content = op["responses"][str(status)].get("content", {})
                if "application/json" in content:
                    self.valid(content["application/json"]["schema"], json.loads(body))
                if path == "/v1/jobs/{job}/frames/{frame}":
                    self.assertEqual(status, 200)
                    self.assertTrue(body.startswith(b"\x89PNG"), body[:8])

    def test_routes_outside_the_document_are_not_served(self):
        for method, path in (("GET", "/v1/nothing"), ("DELETE", "/v1/jobs/1"),
                             ("GET", "/v1/jobs/1/cancel"), ("PUT", "/metrics"), ("GET", "/ui/nothing"),
                             ("DELETE", "/")):
            status, _, body = self.farm.request(method, path)
            self.assertIn(status, (404, 405), (method, path, body))


class Jobs(FarmTest):
    def test_submit_with_every_kind_of_option_then_frames_and_tiles(self):
        done = self.farm.job(self.done["id"])
        self.valid(self.schema_of("/v1/jobs/{job}", "get"), done)
        self.assertEqual((done["name"], done["priority"], done["frames_done"]), ("py-done", 2, 2))
        frames = self.valid(self.schema_of("/v1/jobs/{job}/frames", "get"), self.farm.frames(done["id"]))
        self.assertEqual([f["frame"] for f in frames], [1, 2])
        data = self.farm.frame_bytes(done["id"], 1)
        # Multi-chunk BLAKE3 in pure Python agrees with the coordinator's.
        self.assertGreater(len(data), 2048)
        self.assertEqual(tessera_client.blake3_hex(data), frames[0]["digest"])
        tiles = self.valid(self.schema_of("/v1/jobs/{job}/frames/{frame}/tiles", "get"),
                           self.farm.tiles(done["id"], 1))
        self.assertEqual([t["state"] for t in tiles], ["done", "done"])
        preview = self.farm.preview(done["id"], 1)
        self.assertEqual(preview[:8], b"\x89PNG\r\n\x1a\n")
        self.assertEqual(self.farm.tile_preview(done["id"], 1, 1)[:8], b"\x89PNG\r\n\x1a\n")
        # Every frame as one zip: the same bytes, named as `wait --output` names them.
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "frames.zip")
            self.assertGreater(self.farm.frames_zip(done["id"], path), len(data))
            with zipfile.ZipFile(path) as z:
                self.assertEqual(z.namelist(), ["frame_0001.png", "frame_0002.png"])
                self.assertEqual(z.read("frame_0001.png"), data)
        # request_id makes a retried submit idempotent.
        spec = self.farm.upload(SCENE, frames="3", samples=4, name="py-rid", request_id="t14a-rid-1",
                                sample_ranges=2, verify=0, frame_names="frame", allow_missing=True)
        self.assertEqual((spec["sample_ranges"], spec["request_id"]), (2, "t14a-rid-1"))
        first = self.farm.submit_spec(spec)
        again = self.farm.submit_spec(spec)
        self.assertEqual(first["id"], again["id"])
        self.farm.wait(first["id"], timeout=WAIT, check=True)

    def test_a_page_of_jobs_is_the_newest_first(self):
        ids = [j["id"] for j in self.farm.jobs()]
        self.assertEqual(ids, sorted(ids))
        self.assertEqual([j["id"] for j in self.farm.jobs(limit=2)], ids[::-1][:2])
        self.assertEqual([j["id"] for j in self.farm.jobs(limit=2, offset=1)], ids[::-1][1:3])
        with self.assertRaises(tessera_client.Invalid):
            self.farm.jobs(limit=0)

    def test_a_refused_submit_says_why(self):
        spec = self.farm.upload(SCENE, frames="1", samples=4)
        spec["manifest"][0]["digest"] = "ab" * 32
        with self.assertRaises(tessera_client.Invalid) as e:
            self.farm.submit_spec(spec)
        self.assertEqual((e.exception.status, e.exception.kind), (400, "invalid"))
        with self.assertRaises(tessera_client.NotFound) as e:
            self.farm.job(999999)
        self.assertEqual((e.exception.status, e.exception.kind), (404, "not_found"))
        # A request id names one submit: another spec under it is a conflict.
        spec = self.farm.upload(SCENE, frames="1", samples=4, request_id="py-conflict")
        self.farm.submit_spec(spec)
        spec["samples"] = 2
        with self.assertRaises(tessera_client.Conflict) as e:
            self.farm.submit_spec(spec)
        self.assertEqual((e.exception.status, e.exception.kind), (409, "conflict"))

    def test_a_missing_tessera_binary_is_named_with_how_to_get_it(self):
        missing = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no-such-tessera")
        farm = Client(self.farm.ticket.line, tessera=missing)
        with self.assertRaises(tessera_client.TesseraNotInstalled) as e:
            farm.submit(SCENE, frames="1")
        self.assertEqual(e.exception.path, missing)
        self.assertIsInstance(e.exception, FileNotFoundError)
        self.assertIn("TESSERA_BIN", str(e.exception))

    def test_the_package_is_typed(self):
        package = os.path.dirname(tessera_client.__file__)
        self.assertTrue(os.path.isfile(os.path.join(package, "py.typed")))
        hints = tessera_client.Client.submit.__annotations__
        self.assertEqual(hints.get("return"), "Status")

    def test_a_finished_job_is_not_canceled_paused_or_resumed(self):
        for call in (self.farm.cancel, self.farm.pause, self.farm.resume):
            with self.assertRaises(tessera_client.Conflict) as e:
                call(self.done["id"])
            self.assertEqual((e.exception.status, e.exception.kind), (409, "conflict"))
            self.assertIsInstance(e.exception, tessera_client.TesseraError)
        self.assertEqual(self.farm.job(self.done["id"])["state"], "done")
        with self.assertRaises(tessera_client.NotFound):
            self.farm.cancel(999999)

    def test_each_kind_raises_its_own_exception(self):
        # By the body's kind, else (a proxy's answer) by the status.
        from tessera_client import _error
        for kind, status, cls in (("not_found", 404, tessera_client.NotFound),
                                  ("conflict", 409, tessera_client.Conflict),
                                  ("invalid", 400, tessera_client.Invalid),
                                  ("unauthorized", 401, tessera_client.Unauthorized),
                                  ("unavailable", 503, tessera_client.Unavailable),
                                  ("internal", 500, tessera_client.Internal)):
            self.assertIs(tessera_client.ERRORS[kind], cls)
            e = _error(status, json.dumps({"error": "why", "kind": kind}).encode())
            self.assertEqual((type(e), e.status, e.kind, e.message), (cls, status, kind, "why"))
            e = _error(status, b"<html>a proxy</html>")
            self.assertEqual((type(e), e.kind), (cls, None))
        self.assertIs(type(_error(413, b'{"error": "big"}')), tessera_client.TesseraError)

    def test_pause_wait_timeout_resume_cancel(self):
        job = self.farm.submit(SCENE, frames="1-6", samples=512, name="py-long")
        paused = self.farm.pause(job["id"])
        self.assertTrue(paused["paused"])
        self.assertEqual(self.farm.set_priority(job["id"], -9)["priority"], -9)
        with self.assertRaises(tessera_client.Timeout):
            self.farm.wait(job["id"], timeout=1.0)
        self.assertFalse(self.farm.resume(job["id"])["paused"])
        canceled = self.farm.cancel(job["id"])
        self.assertEqual(canceled["state"], "canceled")
        with self.assertRaises(tessera_client.Conflict):
            self.farm.pause(job["id"])
        with self.assertRaises(tessera_client.Conflict):
            self.farm.set_priority(job["id"], 1)
        with self.assertRaises(tessera_client.JobFailed):
            self.farm.wait(job["id"], timeout=WAIT, check=True)

    def test_status_filters(self):
        done_id = self.done["id"]
        by_state = self.farm.status(state="done")
        self.valid(self.schema_of("/v1/status", "get"), by_state)
        self.assertIn(done_id, [j["id"] for j in by_state["jobs"]])
        self.assertTrue(all(j["state"] == "done" for j in by_state["jobs"]))
        self.assertEqual([j["id"] for j in self.farm.jobs(name="py-don?")], [done_id])
        self.assertEqual([j["id"] for j in self.farm.jobs(ids=[done_id])], [done_id])
        later = self.done["submitted_unix_ms"] + 1
        self.assertNotIn(done_id, [j["id"] for j in self.farm.jobs(since=later)])
        self.assertIn(done_id, [j["id"] for j in self.farm.jobs(state=["done", "failed"], since=later - 1)])
        # The CLI's names for several states: `finished`, `active`.
        self.assertIn(done_id, [j["id"] for j in self.farm.jobs(state="finished")])
        self.assertNotIn(done_id, [j["id"] for j in self.farm.jobs(state="active")])
        with self.assertRaises(tessera_client.Invalid) as e:
            self.farm.jobs(state="finishd")
        self.assertEqual(e.exception.status, 400)

    def test_the_cli_http_and_the_client_agree_on_a_jobs_fields_and_filters(self):
        """One finished job as `tessera status --json`, raw HTTP and the
        client show it: the same fields with the same values; and each
        state filter lists the same jobs on all three."""
        job = self.done["id"]
        code, _, raw = self.farm.request("GET", "/v1/jobs/%d" % job)
        self.assertEqual(code, 200)
        http = json.loads(raw)
        client = self.farm.job(job)
        self.assertEqual(client, http)
        # `status --json ID` is the job's detail, its status fields flat.
        cli = json.loads(tessera("status", "--json", str(job)))
        detail = self.farm.detail(job)
        flat = dict(detail.pop("status"), **detail)
        self.assertEqual(sorted(cli), sorted(flat), "the CLI's fields against HTTP's")
        for key, value in flat.items():
            self.assertEqual(cli[key], value, key)
        for key, value in http.items():
            self.assertEqual(cli[key], value, key)
        def ids(jobs):
            return sorted(j["id"] for j in jobs)

        def by_http(state):
            code, _, raw = self.farm.request("GET", "/v1/jobs", query={"state": state})
            self.assertEqual(code, 200, state)
            page = json.loads(raw)
            return ids(page.get("jobs", []) if isinstance(page, dict) else page)

        for state in ("done", "finished", "active", "failed", "queued,running"):
            # Other tests' jobs may change state meanwhile: compared at a
            # moment HTTP shows the same list before and after.
            for _ in range(20):
                before = by_http(state)
                cli = ids(json.loads(tessera("status", "--json", "--state", state))["jobs"])
                client = ids(self.farm.jobs(state=state.split(",")))
                if by_http(state) == before:
                    break
                time.sleep(0.5)
            self.assertEqual(cli, before, state)
            self.assertEqual(client, before, state)

    def test_detail_and_retry(self):
        detail = self.valid(self.schema_of("/v1/jobs/{job}/detail", "get"), self.farm.detail(self.done["id"]))
        self.assertEqual(detail["status"]["id"], self.done["id"])
        with self.assertRaises(tessera_client.Conflict) as e:
            self.farm.retry(self.done["id"])  # not failed
        self.assertEqual(e.exception.status, 409)
        with self.assertRaises(tessera_client.NotFound):
            self.farm.retry(999999)

    def test_logs(self):
        logs = self.valid(self.schema_of("/v1/jobs/{job}/logs", "get"), self.farm.logs(self.done["id"]))
        self.assertEqual(logs, [])
        self.assertEqual(self.farm.logs(self.done["id"], task=0), [])
        with self.assertRaises(tessera_client.NotFound):
            self.farm.logs(999999)

    def test_missing_blobs(self):
        frame = self.farm.frames(self.done["id"])[0]["digest"]
        self.assertEqual(self.farm.missing_blobs([frame, "00" * 32]), ["00" * 32])

    def test_download_frames_as_they_finish(self):
        job = self.farm.submit(SCENE, frames="1-3", samples=8, name="py-dl")
        dest = os.path.join(os.getcwd(), "dl")
        paths = list(self.farm.download_frames(job["id"], dest, timeout=WAIT))
        self.assertEqual(sorted(os.path.basename(p) for p in paths),
                         ["frame_0001.png", "frame_0002.png", "frame_0003.png"])
        for p in paths:
            with open(p, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


class Events(FarmTest):
    def test_events_over_http_and_from_the_cli(self):
        seen, cli_lines = [], []
        started = threading.Event()

        def listen():
            stream = self.farm.events(timeout=WAIT)
            started.set()
            for e in stream:
                seen.append(e)
                if e["type"] == "job.done" and e["job"] == job_id[0]:
                    return

        cli = subprocess.Popen([os.environ["TESSERA_BIN"], "events", "--json"], stdout=subprocess.PIPE)
        job_id = [None]
        t = threading.Thread(target=listen)
        t.start()
        started.wait()
        time.sleep(0.5)  # both streams are open before the job exists
        job = self.farm.submit(SCENE, frames="1", tiles="2x1", samples=8, name="py-events")
        job_id[0] = job["id"]
        self.farm.wait(job["id"], timeout=WAIT, check=True)
        t.join(WAIT)
        self.assertFalse(t.is_alive())
        mine = [e for e in seen if e.get("job") == job["id"]]
        for e in mine:
            check_schema(self.doc, self.doc["components"]["schemas"]["Event"], e)
        kinds = [e["type"] for e in mine]
        self.assertEqual(kinds.count("task.finished"), 2, kinds)
        self.assertEqual(kinds[-1], "job.done", kinds)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            line = cli.stdout.readline()
            self.assertTrue(line, "tessera events ended")
            e = json.loads(line)
            cli_lines.append(e)
            if e["type"] == "job.done" and e["job"] == job["id"]:
                break
        cli.kill()
        cli.wait()
        cli_kinds = [e["type"] for e in cli_lines if e.get("job") == job["id"]]
        self.assertEqual(cli_kinds, kinds)

    def test_one_jobs_stream_ends_with_the_job_over_http_the_client_and_the_cli(self):
        job = self.farm.submit(SCENE, frames="1", samples=8, name="py-one-stream", paused=True)
        seen = []

        def follow():
            for e in self.farm.events(job=job["id"]):  # no timeout: it ends itself
                seen.append(e)

        t = threading.Thread(target=follow)
        t.start()
        cli = subprocess.Popen([os.environ["TESSERA_BIN"], "events", "--json", "--job", str(job["id"])],
                               stdout=subprocess.PIPE)
        time.sleep(0.5)  # both streams are open before the job runs
        self.farm.resume(job["id"])
        t.join(WAIT)
        self.assertFalse(t.is_alive(), "the stream of a finished job did not end")
        out, _ = cli.communicate(timeout=WAIT)
        self.assertEqual(cli.returncode, 0)
        kinds = [e["type"] for e in seen]
        self.assertEqual(kinds[-1], "job.done", kinds)
        self.assertIn("job.resumed", kinds)
        self.assertTrue(all(e["job"] == job["id"] for e in seen), seen)
        cli_events = [json.loads(line) for line in out.decode().splitlines()]
        self.assertEqual([e["type"] for e in cli_events][-1], "job.done", cli_events)
        # A finished job's stream is its final event alone, at its end time,
        # on all three; an unknown job is refused.
        done = self.farm.job(job["id"])
        final = {"type": "job.done", "job": job["id"], "state": "done",
                 "unix_ms": done["finished_unix_ms"]}
        status, _, body = self.farm.request("GET", "/v1/events", query={"job": job["id"]})
        self.assertEqual(status, 200)
        self.assertEqual([json.loads(line) for line in body.decode().splitlines() if line.strip()], [final])
        self.assertEqual(list(self.farm.events(job=job["id"])), [final])
        cli_final = tessera("events", "--json", "--job", str(job["id"]))
        self.assertEqual([json.loads(line) for line in cli_final.splitlines()], [final])
        with self.assertRaises(tessera_client.NotFound):
            next(iter(self.farm.events(job=987654)))
        missing = subprocess.run([os.environ["TESSERA_BIN"], "events", "--job", "987654"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=WAIT)
        self.assertNotEqual(missing.returncode, 0)


class Metrics(FarmTest):
    def test_metrics_parse_and_match_status_json(self):
        from prometheus_client.parser import text_string_to_metric_families
        # A quiet farm: every job final, so nothing moves between the two reads.
        for j in self.farm.jobs(state=["queued", "running"]):
            self.farm.wait(j["id"], timeout=WAIT)
        text = self.farm.metrics()
        status = json.loads(tessera("status", "--json"))
        families = {f.name: f for f in text_string_to_metric_families(text)}

        def value(metric, labels=None, **more):
            labels = dict(labels or {}, **more)
            for fam in families.values():
                for s in fam.samples:
                    if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items()):
                        return s.value
            raise AssertionError("no sample %s %s" % (metric, labels))

        jobs = status["jobs"]
        for state in ("queued", "running", "done", "failed", "canceled"):
            self.assertEqual(value("tessera_jobs", state=state),
                             sum(1 for j in jobs if j["state"] == state), state)
        self.assertEqual(value("tessera_tasks_done_total"), sum(j["tasks_done"] for j in jobs))
        self.assertEqual(value("tessera_tasks_running"), sum(j["tasks_running"] for j in jobs))
        self.assertEqual(value("tessera_queue_depth"), 0)
        # The state is the data dir's SQLite: always reachable, no lease to lose.
        self.assertEqual(value("tessera_state_reachable"), 1)
        self.assertEqual(value("tessera_farm_lease_held"), 1)
        self.assertEqual(value("tessera_bytes_uploaded_total"), sum(j["bytes_uploaded"] for j in jobs))
        self.assertEqual(value("tessera_bytes_to_workers_total"), sum(j["bytes_to_workers"] for j in jobs))
        self.assertAlmostEqual(value("tessera_cost_usd_total"), sum(j["cost_usd"] for j in jobs), places=6)
        self.assertGreater(value("tessera_tasks_done_total"), 0)
        self.assertGreater(value("tessera_dispatch_latency_seconds_count"), 0)
        self.assertGreaterEqual(value("tessera_lease_expiries_total"), 0)
        self.assertGreaterEqual(value("tessera_task_failures_total"), 0)
        self.assertGreater(value("tessera_http_bytes_out_total"), 0)
        workers = status["workers"]
        self.assertEqual(value("tessera_workers"), len(workers))
        for w in workers:
            labels = {"worker": str(w["id"]), "name": w["name"]}
            self.assertEqual(value("tessera_worker_slots", labels), w["slots"])
            self.assertEqual(value("tessera_worker_tasks_done_total", labels), w["tasks_done"])
            self.assertEqual(value("tessera_worker_running", labels), w["running"])
            self.assertEqual(value("tessera_worker_state", labels, state=w["state"]), 1)
            if w.get("telemetry"):
                self.assertGreater(value("tessera_host_memory_total_bytes", labels), 0)
        self.assertEqual(families["tessera_dispatch_latency_seconds"].type, "histogram")


class ZDrain(FarmTest):
    """Last: it sends a worker away."""

    def test_drain_a_worker(self):
        workers = self.valid(self.schema_of("/v1/workers", "get"), self.farm.workers())
        detail = self.valid(self.schema_of("/v1/workers/{worker}", "get"), self.farm.worker(workers[0]["id"]))
        self.assertEqual((detail["status"]["id"], detail["blocklisted_by"], detail["quarantined"]),
                         (workers[0]["id"], [], None))
        with self.assertRaises(tessera_client.NotFound):
            self.farm.revoke(424242)
        self.assertEqual(len(workers), 2)
        with self.assertRaises(tessera_client.NotFound):
            self.farm.drain(424242)
        drained = workers[-1]["id"]
        self.assertEqual(self.farm.drain(drained), {"worker": drained, "draining": True})
        deadline = time.monotonic() + WAIT
        while True:
            left = {w["id"]: w["state"] for w in self.farm.workers()}
            if left.get(drained, "draining") == "draining":
                break
            self.assertLess(time.monotonic(), deadline, "the worker is not draining: %s" % left)
            time.sleep(0.2)


if __name__ == "__main__":
    unittest.main()
