#!/usr/bin/env python3
"""The proxy in front of a prefill/decode pair of vLLM servers whose KV moves through a KV connector
(NixlConnector): what vLLM's own toy proxy does, as a deployment runs it.

  pd_proxy.py --port P --prefill URL --decode URL

Each completion (`/v1/completions`, `/v1/chat/completions`) goes first to the prefill server with
`max_tokens` 1, no stream and `kv_transfer_params` asking it to keep the prompt's KV for a remote
decode; its answer's `kv_transfer_params` (where the blocks are, which engine holds them) then go
with the client's own request to the decode server, which pulls the KV and streams the tokens back
through the proxy. A client that closes its connection closes the decode request with it (vLLM
aborts it: the prefill side's blocks are freed when their lease runs out). Everything else
(`/v1/models`, `/health`, `/metrics`) is the decode server's.

Run with vLLM's virtual environment (aiohttp is one of vLLM's requirements).
"""
import argparse
import json
import sys

import aiohttp
from aiohttp import web

# The prefill request's connector parameters: keep the KV for a decode elsewhere.
REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}
# A request's longest wait on either server; a soak's request timeout is shorter.
TIMEOUT_S = 600


async def completion(request: web.Request) -> web.StreamResponse:
    app = request.app
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return web.json_response({"error": {"message": "the body is not JSON", "code": 400}}, status=400)
    if not isinstance(body, dict):
        return web.json_response({"error": {"message": "the body is not a JSON object", "code": 400}}, status=400)
    first = dict(body, stream=False, max_tokens=1, kv_transfer_params=REMOTE_DECODE)
    first.pop("stream_options", None)
    if "max_completion_tokens" in first:
        first["max_completion_tokens"] = 1
    async with app["session"].post(app["prefill"] + request.path, json=first) as r:
        if r.status != 200:
            return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)
        answer = await r.json()
    then = dict(body, kv_transfer_params=answer.get("kv_transfer_params"))
    async with app["session"].post(app["decode"] + request.path, json=then) as r:
        out = web.StreamResponse(status=r.status, headers={"Content-Type": r.headers.get("Content-Type", "")})
        await out.prepare(request)
        try:
            async for chunk in r.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
        except ConnectionResetError:
            # The client went away (an abort): leaving this block closes the decode request,
            # which vLLM aborts. Nothing to log: a soak aborts on purpose.
            pass
        return out


async def passthrough(request: web.Request) -> web.Response:
    app = request.app
    async with app["session"].request(request.method, app["decode"] + request.path_qs,
                                      data=await request.read()) as r:
        return web.Response(status=r.status, body=await r.read(),
                            headers={"Content-Type": r.headers.get("Content-Type", "application/octet-stream")})


async def open_session(app: web.Application):
    app["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
                                           connector=aiohttp.TCPConnector(limit=256))
    yield
    await app["session"].close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--prefill", required=True, help="the prefill server's base URL")
    p.add_argument("--decode", required=True, help="the decode server's base URL")
    a = p.parse_args()
    app = web.Application(client_max_size=64 << 20)
    app["prefill"], app["decode"] = a.prefill.rstrip("/"), a.decode.rstrip("/")
    app.cleanup_ctx.append(open_session)
    app.router.add_post("/v1/completions", completion)
    app.router.add_post("/v1/chat/completions", completion)
    app.router.add_route("*", "/{tail:.*}", passthrough)
    print(f"pd_proxy: :{a.port} -> prefill {a.prefill}, decode {a.decode}", file=sys.stderr, flush=True)
    web.run_app(app, host=a.host, port=a.port, print=None)


if __name__ == "__main__":
    main()
