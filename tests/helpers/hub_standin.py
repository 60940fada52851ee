"""A stand-in for the HuggingFace hub's HTTP API on 127.0.0.1, for the requests ``huggingface_hub`` makes to create
a model repository and commit a folder to it: ``/api/repos/create``, ``/api/validate-yaml`` (a model card's metadata),
``/api/models/REPO/preupload/REV`` and ``/api/models/REPO/commit/REV`` (files sent inline, base64). It refuses a
request without a token (401), a card whose metadata the hub would refuse (400), a commit to a repository not
created; anything else is 404. What was committed is kept: ``hub.repos[REPO][PATH] = bytes``."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

#: A few of the hub's pipeline tags (the model card's ``pipeline_tag`` must be one of the hub's).
PIPELINE_TAGS = {"text-classification", "feature-extraction", "fill-mask", "token-classification", "sentence-similarity"}


def card_errors(content: str) -> list[str]:
    """What the hub would refuse in a README's metadata block (the YAML between its first two ``---`` lines)."""
    if not content.startswith("---\n"):
        return []
    block = content[4:].partition("\n---")[0]
    try:
        metadata = yaml.safe_load(block) or {}
    except yaml.YAMLError as error:
        return [f"invalid YAML: {error}"]
    if not isinstance(metadata, dict):
        return ["metadata is not a mapping"]
    errors = []
    if not isinstance(metadata.get("library_name", ""), str):
        errors.append("library_name must be a string")
    tags = metadata.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        errors.append("tags must be a list of strings")
    if "pipeline_tag" in metadata and metadata["pipeline_tag"] not in PIPELINE_TAGS:
        errors.append(f"pipeline_tag {metadata['pipeline_tag']!r} is not a pipeline tag")
    return errors


class StandInHub:
    """Started on a free port of 127.0.0.1 (``url``) in a thread; :meth:`close` stops it."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.tokens: list[str | None] = []
        self.cards: list[str] = []  # the model cards validated
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def answer(self, status: int, document: dict) -> None:
                body = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self.answer(404, {"error": f"{self.path}: not in the stand-in"})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                token = self.headers.get("Authorization")
                hub.tokens.append(token)
                if not token:
                    return self.answer(401, {"error": "Invalid credentials in Authorization header"})
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts == ["api", "repos", "create"]:
                    request = json.loads(body)
                    repo = f"{request['organization']}/{request['name']}"
                    if repo in hub.repos:
                        return self.answer(409, {"error": "You already created this model repo", "url": hub.url + "/" + repo})
                    hub.repos[repo] = {}
                    return self.answer(200, {"url": f"{hub.url}/{repo}", "name": repo})
                if parts == ["api", "validate-yaml"]:
                    hub.cards.append(json.loads(body)["content"])
                    errors = card_errors(hub.cards[-1])
                    return self.answer(400 if errors else 200, {"errors": [{"message": e} for e in errors], "warnings": []})
                if len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] in ("preupload", "commit"):
                    repo = f"{parts[2]}/{parts[3]}"
                    if repo not in hub.repos:
                        return self.answer(404, {"error": f"Repository not found: {repo}"})
                    if parts[4] == "preupload":
                        files = json.loads(body)["files"]
                        return self.answer(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                           for f in files]})
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            hub.repos[repo][item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                    return self.answer(200, {"commitUrl": f"{hub.url}/{repo}/commit/{'0' * 40}", "commitOid": "0" * 40})
                return self.answer(404, {"error": f"{self.path}: not in the stand-in"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
