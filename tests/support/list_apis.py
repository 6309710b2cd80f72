"""Contract servers for the REST list APIs reconcile reads: Box, Cloudinary, Appwrite.

No emulator of these services exists, so the tests run reconcile against this local aiohttp
server, which answers as the providers' documentation says they do (and checks the requests
the same way: auth headers, pagination parameters):

* Box, developer.box.com "List items in folder" (`GET /folders/{folder_id}/items`) and
  "Marker-based Pagination": `usemarker=true`, `marker` = the previous `next_marker`, the last
  page's `next_marker` null; entries are file and folder objects as in the reference's sample
  (`id`, `type`, `etag`, `sequence_id`, `name`, `sha1`, `file_version`, `size`, ...). Bearer
  token auth.
* Cloudinary, cloudinary.com/documentation "Get resources"
  (`GET /v1_1/:cloud_name/resources/:resource_type/:type`): `max_results` (at most 500),
  `next_cursor`, `prefix`; `{"resources": [...], "next_cursor": ...}`, each resource with
  `asset_id`, `public_id`, `format`, `version`, `resource_type`, `type`, `created_at`,
  `bytes`, `width`, `height`, `url`, `secure_url`. Basic auth (API key, secret).
* Appwrite, appwrite.io/docs Storage "List files" (`GET /v1/storage/buckets/{bucketId}/files`)
  and the Query API's pagination: `queries[]` as the SDKs' JSON (`limit`, `cursorAfter`);
  `{"total": N, "files": [File, ...]}` with the File model's fields. `X-Appwrite-Project` and
  `X-Appwrite-Key` headers.

Box and Cloudinary pages are kept small here (2 items, whatever the limit asked: both APIs
say to follow `next_marker` / `next_cursor`, never to count); Appwrite's honour `limit`
exactly (the tests ask for 2 with `--appwrite-page-size`), so every test walks several
pages. `fail_after` makes a listing fail part-way (the next page answers 400), and
`requests` records every call.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from support.worker import free_port

PAGE = 2
BOX_TOKEN = "box-test-token"
CLOUDINARY_CLOUD, CLOUDINARY_KEY, CLOUDINARY_SECRET = "demo", "123456789012345", "s3cr3t"
APPWRITE_PROJECT, APPWRITE_KEY = "project-1", "standard_key"


@dataclass
class ListApis:
    """What each provider holds (the tests change it behind the stream's back)."""

    port: int = 0
    box_folders: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    cloudinary: list[dict[str, Any]] = field(default_factory=list)
    appwrite: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    fail_after: int | None = None
    """Answer 400 to every page request after this many (a listing failing part-way)."""
    requests: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _count(self, request: web.Request) -> None:
        self.requests.append(str(request.rel_url))
        if self.fail_after is not None and len(self.requests) > self.fail_after:
            raise web.HTTPBadRequest(
                text=json.dumps(
                    {
                        "type": "error",
                        "status": 400,
                        "code": "bad_request",
                        "message": "Invalid marker",
                    }
                ),
                content_type="application/json",
            )

    async def box_items(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {BOX_TOKEN}":
            raise web.HTTPUnauthorized()
        self._count(request)
        query = request.query
        assert query.get("usemarker") == "true", "marker-based pagination needs usemarker=true"
        assert "sha1" in query.get("fields", "").split(","), "ask for sha1 (not in mini files)"
        entries = self.box_folders.get(request.match_info["folder_id"])
        if entries is None:
            raise web.HTTPNotFound()
        limit = min(int(query.get("limit", "100")), PAGE)
        start = int(query["marker"].removeprefix("m")) if query.get("marker") else 0
        page = entries[start : start + limit]
        after = start + limit
        return web.json_response(
            {
                "limit": limit,
                "next_marker": f"m{after}" if after < len(entries) else None,
                "entries": page,
            }
        )

    async def cloudinary_resources(self, request: web.Request) -> web.Response:
        expected = base64.b64encode(f"{CLOUDINARY_KEY}:{CLOUDINARY_SECRET}".encode()).decode()
        if request.headers.get("Authorization") != f"Basic {expected}":
            raise web.HTTPUnauthorized(
                text=json.dumps({"error": {"message": "Invalid credentials"}}),
                content_type="application/json",
            )
        self._count(request)
        info = request.match_info
        assert info["cloud"] == CLOUDINARY_CLOUD
        query = request.query
        assert int(query.get("max_results", "10")) <= 500
        matching = sorted(
            (
                r
                for r in self.cloudinary
                if r["resource_type"] == info["resource_type"]
                and r["type"] == info["type"]
                and r["public_id"].startswith(query.get("prefix", ""))
            ),
            key=lambda r: r["public_id"],
        )
        start = int(query["next_cursor"].removeprefix("c")) if "next_cursor" in query else 0
        limit = min(int(query.get("max_results", "10")), PAGE)
        body: dict[str, Any] = {"resources": matching[start : start + limit]}
        if start + limit < len(matching):
            body["next_cursor"] = f"c{start + limit}"
        return web.json_response(body)

    async def appwrite_files(self, request: web.Request) -> web.Response:
        if (
            request.headers.get("X-Appwrite-Project") != APPWRITE_PROJECT
            or request.headers.get("X-Appwrite-Key") != APPWRITE_KEY
        ):
            raise web.HTTPUnauthorized(
                text=json.dumps({"message": "Project is not accessible", "code": 401}),
                content_type="application/json",
            )
        self._count(request)
        files = self.appwrite.get(request.match_info["bucket"])
        if files is None:
            raise web.HTTPNotFound(
                text=json.dumps(
                    {
                        "message": "Storage bucket with the requested ID could not be found.",
                        "code": 404,
                        "type": "storage_bucket_not_found",
                    }
                ),
                content_type="application/json",
            )
        limit, after = 25, None
        for text in request.query.getall("queries[]", []):
            q = json.loads(text)
            if q["method"] == "limit":
                limit = int(q["values"][0])
            elif q["method"] == "cursorAfter":
                after = q["values"][0]
        ordered = sorted(files, key=lambda f: f["$id"])
        if after is not None:
            ordered = [f for f in ordered if f["$id"] > after]
        served = ordered[:limit]
        return web.json_response({"total": len(files), "files": served})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/box/folders/{folder_id}/items", self.box_items)
        app.router.add_get(
            "/cloudinary/{cloud}/resources/{resource_type}/{type}", self.cloudinary_resources
        )
        app.router.add_get("/appwrite/storage/buckets/{bucket}/files", self.appwrite_files)
        return app


def serve() -> Iterator[ListApis]:
    """Run the contract server in a thread; yields it, stops it after."""
    apis = ListApis(port=free_port())
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(apis.app())
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", apis.port).start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the list API contract server did not start")
    try:
        yield apis
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def box_file(file_id: str, name: str, sha1: str, size: int = 1) -> dict[str, Any]:
    """A file entry as in Box's "List items in folder" sample."""
    return {
        "id": file_id,
        "type": "file",
        "etag": "1",
        "sequence_id": "3",
        "name": name,
        "sha1": sha1,
        "file_version": {"id": f"v{file_id}", "type": "file_version", "sha1": sha1},
        "size": size,
        "modified_at": "2026-11-30T00:08:07-08:00",
    }


def box_folder(folder_id: str, name: str) -> dict[str, Any]:
    return {"id": folder_id, "type": "folder", "etag": "1", "sequence_id": "3", "name": name}


def cloudinary_resource(public_id: str, size: int = 1237) -> dict[str, Any]:
    """A resource as "Get resources" lists it (no etag among the documented fields)."""
    return {
        "asset_id": "eb8fa7e7cb1c9a54243039f53381f4e3",
        "public_id": public_id,
        "format": "png",
        "version": 1618505146,
        "resource_type": "image",
        "type": "upload",
        "created_at": "2021-04-15T16:45:46Z",
        "bytes": size,
        "width": 300,
        "height": 400,
        "url": f"http://res.cloudinary.com/demo/image/upload/v1618505146/{public_id}.png",
        "secure_url": f"https://res.cloudinary.com/demo/image/upload/v1618505146/{public_id}.png",
    }


def appwrite_file(file_id: str, bucket: str, signature: str) -> dict[str, Any]:
    """A File model (appwrite.io/docs/models/file)."""
    return {
        "$id": file_id,
        "bucketId": bucket,
        "$createdAt": "2026-11-30T00:08:07.000+00:00",
        "$updatedAt": "2026-11-30T00:08:07.000+00:00",
        "$permissions": [],
        "name": "Pink.png",
        "signature": signature,
        "mimeType": "image/png",
        "sizeOriginal": 1,
        "chunksTotal": 1,
        "chunksUploaded": 1,
    }
