"""Pictures (`input_image` parts) through the real gateway, checked at what the engine receives.

The engine is the scripted test double, declared to read pictures (or not); the pixels, the
image tokens and the usage it reports are what a real engine would get and say.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from PIL import Image

from inference import engine as eng
from inference import images
from tests.inference.test_gateway import Gateway, say
from tests.support.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.timeout(60)

QWEN3_SPEC = eng.ImageSpec(token_px=32, min_pixels=4 * 32 * 32, max_pixels=1024 * 1024)


def picture(width: int, height: int, fmt: str = "PNG", seed: int = 0, noise: bool = False) -> bytes:
    """A picture of that size: a seeded smooth pattern (small files), or noise (large ones)."""
    rng = np.random.default_rng(seed)
    if noise:
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    else:
        y, x = np.mgrid[0:height, 0:width]
        a, b, c = rng.uniform(0.01, 0.1, 3)
        pixels = np.stack([np.sin(x * a), np.cos(y * b), np.sin((x + y) * c)], axis=-1)
        pixels = ((pixels + 1) * 127.5).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, fmt)
    return out.getvalue()


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def image_item(*urls: str, detail: str | None = None, text: str | None = None) -> dict:
    content = [{"type": "input_image", "image_url": url, **({"detail": detail} if detail else {})} for url in urls]
    if text:
        content.append({"type": "input_text", "text": text})
    return {"type": "message", "role": "user", "content": content}


async def show(client, *urls: str, detail: str | None = None, text: str | None = None,
               event_id: str = "show") -> dict:
    """The item's `conversation.item.added` (its `.done` taken too), or the `error`."""
    await client.send("conversation.item.create", item=image_item(*urls, detail=detail, text=text), event_id=event_id)
    answer = await client.recv()
    if answer["type"] == "conversation.item.added":
        await client.wait_for("conversation.item.done")
    return answer


async def turn(client) -> dict:
    await client.send("response.create")
    return (await client.until_done())[-1]["response"]


def pictures_read(engine: ScriptedEngine) -> list[eng.UserImage]:
    return [item for item in engine.requests[-1].context if isinstance(item, eng.UserImage)]


# --------------------------------------------------------------------------- accepted


async def test_a_picture_reaches_the_engine_resized_and_counted_in_usage():
    async with Gateway(ScriptedEngine(reads_images=True)) as gw, await gw.client() as c:
        added = await show(c, data_url(picture(640, 360)), detail="low", text="what is this?")
        assert added["type"] == "conversation.item.added"
        part = added["item"]["content"][0]
        assert part["type"] == "input_image" and part["detail"] == "low" and part["image_url"] is None
        item_id = added["item"]["id"]
        response = await turn(c)
        [image] = pictures_read(gw.engine)
        # 640×360 is over the low budget (448×448 pixels): scaled down, sides multiples of 28
        assert image.pixels.dtype == np.uint8 and image.pixels.shape[2] == 3
        assert image.height % 28 == 0 and image.width % 28 == 0
        assert image.height * image.width <= 448 * 448
        assert image.tokens == (image.height // 28) * (image.width // 28)
        assert image.item_id == item_id and image.detail == "low"
        assert not image.pixels.flags.writeable
        details = response["usage"]["input_token_details"]
        assert details["image_tokens"] == image.tokens
        assert response["usage"]["input_tokens"] == 10 + image.tokens
        # the item comes back without its bytes: an id is enough to refer to it
        await c.send("conversation.item.retrieve", item_id=item_id)
        retrieved = await c.wait_for("conversation.item.retrieved")
        assert retrieved["item"]["content"][0] == {**part, "image_url": None}
        assert "base64" not in str(retrieved)
        # and it is read again on the next turn, as the same picture (same key)
        await say(c, "and now?")
        await turn(c)
        [again] = pictures_read(gw.engine)
        assert again.key == image.key and again.pixels is image.pixels


async def test_detail_high_and_the_family_pixel_size():
    async with Gateway(ScriptedEngine(reads_images=True, image_spec=QWEN3_SPEC)) as gw, await gw.client() as c:
        await show(c, data_url(picture(2000, 1000)))  # detail not given: "auto", read as high
        await show(c, data_url(picture(2000, 1000, seed=1)), detail="low")
        await turn(c)
        high, low = pictures_read(gw.engine)
        assert high.detail == "high" and high.width * high.height <= 1024 * 1024
        assert high.width % 32 == 0 and high.height % 32 == 0
        assert abs(high.width / high.height - 2) < 0.1  # the aspect ratio kept, within a token
        assert high.tokens == (high.width // 32) * (high.height // 32)
        assert low.width * low.height <= 448 * 448 and low.width % 32 == 0
        assert high.key != low.key


async def test_a_jpeg_and_cached_image_tokens_in_usage_and_metrics():
    engine = ScriptedEngine(reads_images=True)
    engine.cached_image_tokens = 7
    async with Gateway(engine) as gw, await gw.client() as c:
        added = await show(c, data_url(picture(300, 200, "JPEG"), "image/jpeg"))
        assert added["type"] == "conversation.item.added"
        refused = await show(c, "data:image/png;base64,AAAA")  # not a picture: not counted
        assert refused["type"] == "error"
        response = await turn(c)
        usage = response["usage"]["input_token_details"]
        assert usage["cached_tokens_details"]["image_tokens"] == 7
        sample = gw.worker.metrics.registry.get_sample_value
        assert sample("omni_input_images_total") == 1
        assert sample("omni_input_image_tokens_total", {"cached": "true"}) == 7
        assert sample("omni_input_image_tokens_total", {"cached": "false"}) == usage["image_tokens"] - 7


# --------------------------------------------------------------------------- refused


async def test_an_engine_that_does_not_read_pictures_refuses_at_item_create():
    async with Gateway(ScriptedEngine()) as gw, await gw.client() as c:
        error = await show(c, data_url(picture(64, 64)), event_id="pic-1")
        assert error["type"] == "error"
        assert error["error"]["code"] == "images_not_supported" and error["error"]["event_id"] == "pic-1"
        assert "does not read pictures" in error["error"]["message"]
        await say(c, "hello")  # the socket goes on, and nothing was added
        await turn(c)
        assert [type(i).__name__ for i in gw.engine.requests[-1].context] == ["UserText"]


async def test_the_engine_itself_refuses_a_picture_it_cannot_read():
    engine = ScriptedEngine()
    request = eng.GenerationRequest(request_id="r", instructions="", context=[
        eng.UserImage(np.zeros((28, 28, 3), np.uint8), tokens=1)])
    with pytest.raises(eng.EngineError, match="does not read pictures"):
        async for _ in engine.generate(request):
            pass


BAD_PICTURES = [
    ("https://example.com/cat.png", "image_url_not_allowed"),
    ("ftp://example.com/cat.png", "invalid_image_url"),
    ("data:image/gif;base64,R0lGODlhAQABAAAAACw=", "unsupported_image_format"),
    ("data:image/png;base64,not*base64!", "invalid_image"),
    (data_url(b"\x89PNG\r\n\x1a\nbroken" * 10), "invalid_image"),
    (data_url(picture(32, 32, "BMP")), "invalid_image"),  # a BMP sent as PNG
    ("data:text/plain;base64,aGVsbG8=", "unsupported_image_format"),
    (data_url(picture(1000, 2)), "invalid_image"),  # 500 times as long as wide
]


@pytest.mark.parametrize("url, code", BAD_PICTURES)
async def test_bad_pictures_get_an_error_naming_the_event_and_change_nothing(url, code):
    async with Gateway(ScriptedEngine(reads_images=True)) as gw, await gw.client() as c:
        error = await show(c, url, event_id="bad-pic", text="look")
        assert error["type"] == "error", error
        assert error["error"]["code"] == code and error["error"]["event_id"] == "bad-pic"
        assert error["error"]["param"].startswith("item.content.0")
        await say(c, "still here")
        await turn(c)
        assert [type(i).__name__ for i in gw.engine.requests[-1].context] == ["UserText"]


async def test_size_limits_bytes_pixels_and_the_session_budget():
    engine = ScriptedEngine(reads_images=True)
    async with Gateway(engine, max_image_bytes=20_000, max_image_source_pixels=1_000_000,
                       max_session_bytes=1024 * 1024) as gw, await gw.client() as c:
        large_file = picture(200, 200, noise=True)  # noise does not compress: ~120 kB
        error = await show(c, data_url(large_file))
        assert error["error"]["code"] == "image_too_large" and "bytes" in error["error"]["message"]
        # a small file of many pixels (a decompression bomb's shape) is refused before decoding
        flat = io.BytesIO()
        Image.new("RGB", (2000, 1000), "white").save(flat, "PNG")
        assert len(flat.getvalue()) < 20_000
        error = await show(c, data_url(flat.getvalue()))
        assert error["error"]["code"] == "image_too_large" and "2000×1000" in error["error"]["message"]
        # within both, but its pixels (up to 1024×1024×3 bytes) pass the session's 1 MiB budget
        small = io.BytesIO()
        Image.new("RGB", (1000, 1000), "white").save(small, "PNG")
        error = await show(c, data_url(small.getvalue()))
        assert error["error"]["code"] == "session_memory_limit"
        # a low-detail one fits
        added = await show(c, data_url(small.getvalue()), detail="low")
        assert added["type"] == "conversation.item.added"


async def test_too_many_pictures_in_one_item_is_refused():
    async with Gateway(ScriptedEngine(reads_images=True), max_images_per_response=2) as gw, await gw.client() as c:
        url = data_url(picture(56, 56))
        error = await show(c, url, url, url)
        assert error["error"]["code"] == "too_many_images"
        added = await show(c, url, url)
        assert added["type"] == "conversation.item.added"


async def test_the_oldest_pictures_leave_the_context_beyond_the_limit_and_their_words_stay():
    async with Gateway(ScriptedEngine(reads_images=True), max_images_per_response=4) as gw, await gw.client() as c:
        keys = []
        for n in range(4):
            await show(c, data_url(picture(56, 56, seed=n)), text=f"picture {n}")
        await turn(c)
        read = pictures_read(gw.engine)
        assert len(read) == 4
        keys = [image.key for image in read]
        await show(c, data_url(picture(56, 56, seed=4)), text="picture 4")
        response = await turn(c)
        read = pictures_read(gw.engine)
        # over 4: down to half at once, the newest kept, so the next turns' prompts start the same
        assert len(read) == 2 and read[0].key == keys[3]
        texts = [i.text for i in gw.engine.requests[-1].context if isinstance(i, eng.UserText)]
        assert texts == [f"picture {n}" for n in range(5)]
        assert response["usage"]["input_token_details"]["image_tokens"] == sum(i.tokens for i in read)
        await say(c, "more")
        await turn(c)
        assert [i.key for i in pictures_read(gw.engine)] == [image.key for image in read]


async def test_image_tokens_limit_the_pictures_read():
    # 448×448 at low detail is 256 tokens; a limit of 600 holds two
    async with Gateway(ScriptedEngine(reads_images=True), max_context_image_tokens=600) as gw, \
            await gw.client() as c:
        for n in range(3):
            await show(c, data_url(picture(448, 448, seed=n)), detail="low")
        await turn(c)
        read = pictures_read(gw.engine)
        assert sum(i.tokens for i in read) <= 600 and len(read) == 1


async def test_response_input_pictures():
    async with Gateway(ScriptedEngine(reads_images=True)) as gw, await gw.client() as c:
        await c.send("response.create", response={"conversation": "none",
                                                  "input": [image_item(data_url(picture(56, 56)))]})
        response = (await c.until_done())[-1]["response"]
        [image] = pictures_read(gw.engine)
        assert image.item_id is None and response["usage"]["input_token_details"]["image_tokens"] == image.tokens


# --------------------------------------------------------------------------- remote pictures


@pytest.fixture
async def picture_host():
    png = picture(100, 50, noise=True)

    async def serve(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name == "cat.png":
            return web.Response(body=png, content_type="image/png")
        if name == "big.png":
            return web.Response(body=png * 10, content_type="image/png")
        if name == "page.html":
            return web.Response(text="<html>", content_type="text/html")
        if name == "moved.png":
            raise web.HTTPFound("http://elsewhere.invalid/cat.png")
        raise web.HTTPNotFound()

    app = web.Application()
    app.router.add_get("/{name}", serve)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}", len(png)
    await server.close()


async def test_pictures_from_an_allowed_host(picture_host):
    base, size = picture_host
    async with Gateway(ScriptedEngine(reads_images=True), image_url_hosts=["127.0.0.1"],
                       max_image_bytes=size * 2) as gw, await gw.client() as c:
        added = await show(c, f"{base}/cat.png")
        assert added["type"] == "conversation.item.added" and added["item"]["content"][0]["image_url"] is None
        for name, code in (("big.png", "image_too_large"), ("page.html", "unsupported_image_format"),
                           ("moved.png", "image_download_failed"), ("none.png", "image_download_failed")):
            error = await show(c, f"{base}/{name}", event_id=name)
            assert error["error"]["code"] == code and error["error"]["event_id"] == name, error
        await turn(c)
        [image] = pictures_read(gw.engine)
        assert image.width == 2 * image.height


async def test_remote_pictures_are_refused_by_default(picture_host):
    base, _ = picture_host
    async with Gateway(ScriptedEngine(reads_images=True)) as gw, await gw.client() as c:
        error = await show(c, f"{base}/cat.png")
        assert error["error"]["code"] == "image_url_not_allowed"


# --------------------------------------------------------------------------- units


@pytest.mark.parametrize("size, spec, budget", [
    ((640, 360), eng.ImageSpec(), 448 * 448), ((640, 360), QWEN3_SPEC, 448 * 448),
    ((4000, 3000), eng.ImageSpec(), 1024 * 1024), ((10, 10), eng.ImageSpec(), 448 * 448),
    ((3000, 20), QWEN3_SPEC, 1024 * 1024), ((1, 1), QWEN3_SPEC, 448 * 448),
])
def test_target_size(size, spec, budget):
    width, height = images.target_size(*size, spec, budget)
    assert width % spec.token_px == 0 and height % spec.token_px == 0
    assert spec.min_pixels <= width * height <= budget
    if size[0] * size[1] >= spec.min_pixels:  # the aspect ratio within a token's rounding
        assert abs(width / height - size[0] / size[1]) <= size[0] / size[1] * 0.5 + spec.token_px / height


def test_a_transparent_png_is_shown_on_white():
    rgba = Image.new("RGBA", (56, 56), (255, 0, 0, 0))
    out = io.BytesIO()
    rgba.save(out, "PNG")
    rules = images.ImageRules(spec=eng.ImageSpec(), low_pixels=448 * 448, high_pixels=1024 * 1024,
                              max_bytes=10**6, max_source_pixels=10**7)
    pixels = images.decode(out.getvalue(), "image/png", "low", rules)
    assert pixels.shape == (56, 56, 3) and (pixels == 255).all()
