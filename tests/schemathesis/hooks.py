"""schemathesis hooks for Tessera's contract test (see schemathesis.toml)."""

import json

import schemathesis


@schemathesis.deserializer("application/x-ndjson")
def ndjson(ctx, response):
    # A stream's lines, each an Event; the empty keep-alive lines skipped.
    lines = response.content.decode("utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]
