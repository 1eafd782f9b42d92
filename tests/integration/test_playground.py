"""The browser playground (`/`, ninfer/gateway/http/ui/) in a real headless Chromium, driven by
Playwright, against `ninfer serve` with the demo model and an API key.

One server, one browser and one page for the module; the tests run in file order on that page
(warm-up banner and key prompt, a streamed answer stopped mid-way, regenerate, temperature, edit,
reload, image attach, untrusted model text, a scripted showcase answer, a 2,000-token stream). Each
state is screenshotted into the module's temporary folder; docs/playground.png is the showcase
(PLAYGROUND_SCREENSHOT=PATH copies it there).
"""
from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from support.serve_util import metric, serving

API_KEY = "sk-playground"
MODEL = "ninfer-demo"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def png(width: int = 96, height: int = 64) -> bytes:
    import io

    from PIL import Image

    img = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def chromium_path() -> str | None:
    for candidate in (os.environ.get("NINFER_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("playground-screenshots")


@pytest.fixture(scope="module")
def server_process():
    with serving("--max-model-len", "4096", "--max-concurrency", "2", api_key=API_KEY, wait=False) as s:
        yield s


@pytest.fixture(scope="module")
def server(server_process):
    server_process.wait_ready()
    return server_process


@pytest.fixture(scope="module")
def browser(tmp_path_factory, server_process):
    """Chromium (launched while the server loads its model)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is missing (pip install -e '.[test]')")
    exe = chromium_path()
    if exe is None:
        pytest.skip("no Chromium: install Debian's `chromium` package (.ci/run does) or set NINFER_CHROMIUM")
    pw = sync_playwright().start()
    try:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=exe, args=CHROMIUM_FLAGS,
            headless=True, viewport={"width": 1100, "height": 760})
        yield ctx
        ctx.close()
    finally:
        pw.stop()


class Page:
    """The one page of the module, with the requests it made and the errors it logged."""

    def __init__(self, page, base: str):
        self.p = page
        self.base = base
        self.urls: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda r: self.urls.append(r.url))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        # NOTE: "Failed to load resource" is Chromium's log line for any 4xx/5xx the page handles itself
        page.on("console", lambda m: m.type == "error" and not m.text.startswith("Failed to load resource")
                and self.errors.append(m.text))

    def shot(self, folder: Path, name: str) -> Path:
        path = folder / f"{name}.png"
        self.p.screenshot(path=str(path))
        return path

    def chat_body(self, action) -> dict:
        """Run `action`; the JSON body of the chat request it sends."""
        with self.p.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as req:
            action()
        return json.loads(req.value.post_data)

    def wait_answer_done(self, timeout_ms: int = 30000) -> None:
        self.p.wait_for_selector("#stop", state="hidden", timeout=timeout_ms)
        self.p.wait_for_selector("article.assistant:last-child .stats:not(:empty), "
                                 "article.assistant:last-child .error:not([hidden])", timeout=timeout_ms)

    def set_field(self, selector: str, value: str) -> None:
        self.p.fill(selector, value)
        self.p.dispatch_event(selector, "change")

    def send(self, text: str) -> dict:
        self.p.fill("#input", text)
        return self.chat_body(lambda: self.p.press("#input", "Enter"))


@pytest.fixture(scope="module")
def page(browser, server):
    pg = Page(browser.pages[0] if browser.pages else browser.new_page(), server.base)
    yield pg
    assert not pg.errors, pg.errors


def running(server) -> float:
    return metric(httpx.get(server.base + "/metrics", timeout=10).text, "ninfer:num_requests_running")


def load_ms(p) -> float:
    nav = p.evaluate("() => performance.getEntriesByType('navigation')[0].toJSON()")
    print(f"page load: {nav['loadEventEnd'] - nav['startTime']:.0f} ms (response end {nav['responseEnd']:.0f} ms, "
          f"DOMContentLoaded {nav['domContentLoadedEventEnd']:.0f} ms)")
    return nav["loadEventEnd"] - nav["startTime"]


def test_load_and_api_key_prompt(page, server, shots):
    p = page.p
    p.goto(server.base + "/")
    first = load_ms(p)
    p.wait_for_selector("#key-dialog:not([hidden])", timeout=10000)      # /v1/models answered 401
    page.shot(shots, "1-api-key")
    p.fill("#key-input", API_KEY)
    p.click("#key-form button[type=submit]")
    p.wait_for_selector("#banner-demo:not([hidden])")
    assert p.inner_text("#model-name") == MODEL and "random weights" in p.inner_text("#banner-demo")
    assert p.is_enabled("#send") and p.is_hidden("#banner-status")
    # a bounded answer by default (the server's default is the rest of a 262k-token context)
    assert p.input_value("#max-tokens") == "2048"
    best = first
    for _ in range(3):                  # NOTE: the best of a few loads: CI shares its cores with other tests
        if best < 200:
            break
        p.reload()
        best = min(best, load_ms(p))
        p.wait_for_selector("#banner-demo:not([hidden])")              # the key was kept: no prompt
    assert best < 200
    p.reload()
    p.wait_for_selector("#banner-demo:not([hidden])")
    assert p.is_hidden("#key-dialog")


def test_warmup_banner_until_ready(page, server, shots):
    p = page.p
    warming = json.dumps({"status": "starting", "reason": "warming up (first compiles and graph captures)"})
    p.route("**/health", lambda route: route.fulfill(status=503, body=warming, content_type="application/json"))
    try:
        p.reload()
        p.wait_for_selector("#banner-status:not([hidden])")
        assert "warming up" in p.inner_text("#banner-status") and p.is_disabled("#send")
        page.shot(shots, "2-warming-up")
    finally:
        p.unroute("**/health")
    p.wait_for_selector("#banner-status", state="hidden", timeout=10000)   # polled until ready
    assert p.is_enabled("#send")
    p.wait_for_selector("#banner-demo:not([hidden])")


def test_stream_then_stop_frees_the_server(page, server, shots):
    p = page.p
    p.uncheck("#thinking")
    page.set_field("#max-tokens", "3000")
    body = page.send("Tell me a long story.")
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["max_tokens"] == 3000
    assert body["messages"] == [{"role": "user", "content": "Tell me a long story."}] and "temperature" not in body
    answer = "article.assistant.streaming .answer"
    grown = "([sel, n]) => (document.querySelector(sel)?.textContent.length ?? 0) > n"
    p.wait_for_function(grown, arg=[answer, 20], timeout=20000)
    first = len(p.inner_text(answer))
    p.wait_for_function(grown, arg=[answer, first + 20], timeout=20000)
    assert p.is_visible("#stop")                                   # text grows while the answer streams
    t0 = time.monotonic()
    while running(server) != 1:                                     # (the metrics snapshot may lag a step)
        assert time.monotonic() - t0 < 5, "the streamed request does not show as running"
        time.sleep(0.05)
    page.shot(shots, "3-streaming")
    p.click("#stop")
    t0 = time.monotonic()
    while running(server) != 0:
        assert time.monotonic() - t0 < 5, "the stopped request still runs"
        time.sleep(0.05)
    print(f"running requests back to 0 {1000 * (time.monotonic() - t0):.0f} ms after Stop")
    while True:                                                     # cancelled, not run to its end
        text = httpx.get(server.base + "/metrics", timeout=10).text
        if metric(text, "ninfer:request_success_total", 0, finished_reason="abort") == 1:
            break
        assert time.monotonic() - t0 < 5, text
        time.sleep(0.05)
    assert metric(text, "ninfer:request_success_total", 0, finished_reason="length") == 0
    page.wait_answer_done()
    assert "stopped" in p.inner_text("article.assistant .stats")
    assert p.is_visible("#send") and p.is_hidden("#stop")


def test_regenerate_temperature_and_edit(page, shots):
    p = page.p
    page.set_field("#max-tokens", "8")
    stopped = p.inner_text("article.assistant .answer")
    body = page.chat_body(lambda: p.click("article.assistant button.regenerate"))
    assert body["messages"] == [{"role": "user", "content": "Tell me a long story."}] and body["max_tokens"] == 8
    page.wait_answer_done()
    assert p.locator("article.assistant").count() == 1
    stats = p.inner_text("article.assistant .stats")
    assert "TTFT" in stats and "tok/s" in stats and "8 tokens" in stats and "finish: length" in stats, stats
    assert p.inner_text("article.assistant .answer") != stopped
    page.shot(shots, "4-regenerated")

    page.set_field("#temperature", "0.3")
    body = page.send("And another one.")
    assert body["temperature"] == 0.3 and [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    page.wait_answer_done()

    p.click("article.user:nth-last-child(2) button.edit")
    p.fill("article.user .edit-box", "And another one, shorter.")
    body = page.chat_body(lambda: p.click("article.user button.save-edit"))
    assert body["messages"][-1] == {"role": "user", "content": "And another one, shorter."}
    assert len(body["messages"]) == 3 and body["temperature"] == 0.3
    page.wait_answer_done()
    assert p.locator("article.msg").count() == 4
    p.wait_for_function("() => document.getElementById('context-count').textContent.includes('/ 4096 tokens')")
    page.shot(shots, "5-conversation")


def test_reload_keeps_the_conversation(page, shots):
    p = page.p
    before = p.locator("article.msg").all_inner_texts()
    p.reload()
    p.wait_for_selector("#banner-demo:not([hidden])")
    assert p.locator("article.msg").all_inner_texts() == before
    assert p.input_value("#temperature") == "0.3" and not p.is_checked("#thinking")
    assert p.locator("#conversations li").count() == 1
    page.shot(shots, "6-reloaded")


def test_image_attach_shows_the_server_error(page, shots):
    p = page.p
    p.click("#new-chat")
    p.set_input_files("#file-input", files=[{"name": "pic.png", "mimeType": "image/png", "buffer": png()}])
    p.wait_for_selector(".attachment img")
    # a drop on the chat area and a paste attach too
    p.evaluate("""(b64) => {
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const files = () => {
            const dt = new DataTransfer();
            dt.items.add(new File([bytes], 'x.png', {type: 'image/png'}));
            return dt;
        };
        const opts = {bubbles: true, cancelable: true};
        document.getElementById('chat').dispatchEvent(new DragEvent('drop', {dataTransfer: files(), ...opts}));
        document.getElementById('input').dispatchEvent(new ClipboardEvent('paste', {clipboardData: files(), ...opts}));
    }""", base64.b64encode(png(32, 32)).decode())
    p.wait_for_function("() => document.querySelectorAll('.attachment img').length === 3")
    p.click(".attachment:last-child .remove")
    p.click(".attachment:last-child .remove")
    assert p.locator(".attachment img").count() == 1
    body = page.send("What is in this image?")
    parts = body["messages"][-1]["content"]
    assert parts[0] == {"type": "text", "text": "What is in this image?"}
    assert [x["type"] for x in parts] == ["text", "image_url"]
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    page.wait_answer_done()
    assert "no vision tower" in p.inner_text("article.assistant .error")      # the envelope's message
    assert p.inner_text("article.assistant .stats") == ""
    assert p.locator("article.user .images img").count() == 1
    page.shot(shots, "7-image-error")


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
UNTRUSTED = ("Plain **bold** and `code`. <img src=x onerror=\"window.__pwned=1\"> "
             "<script>window.__pwned=2</script>\n\n"
             "[bad](javascript:window.__pwned=3) and [good](https://example.com/docs)\n\n"
             "```html\n<b onclick=\"window.__pwned=4\">x</b>\n```\n")


def sse(*chunks: dict) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def delta(**d) -> dict:
    return {"id": "c", "object": "chat.completion.chunk", "model": MODEL,
            "choices": [{"index": 0, "delta": d, "finish_reason": None}]}


def test_untrusted_model_text_renders_as_text(page, shots):
    p = page.p
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    stream = sse(delta(role="assistant", content=""), delta(reasoning_content="thinking <i>hard</i>"),
                 *(delta(content=UNTRUSTED[i:i + 7]) for i in range(0, len(UNTRUSTED), 7)),
                 delta(tool_calls=[call]),
                 delta(tool_calls=[{"index": 0, "function": {"arguments": "{\"city\": \"Paris\"}"}}]),
                 {"id": "c", "object": "chat.completion.chunk", "model": MODEL, "choices": [],
                  "usage": {"prompt_tokens": 9, "completion_tokens": 40, "total_tokens": 49}})
    p.route("**/v1/chat/completions",
            lambda route: route.fulfill(status=200, body=stream, content_type="text/event-stream"))
    try:
        page.set_field("#tools", "[{oops")
        p.fill("#input", "Say something dangerous.")
        p.press("#input", "Enter")
        assert "Tools: not valid JSON" in p.inner_text("#tools-error") and p.input_value("#input")
        page.set_field("#tools", json.dumps([WEATHER]))
        body = page.send("Say something dangerous.")
        assert body["tools"] == [WEATHER] and p.is_hidden("#tools-error")
        page.wait_answer_done()
    finally:
        p.unroute("**/v1/chat/completions")
        page.set_field("#tools", "")
    msg = "article.assistant:last-child"
    text = p.inner_text(f"{msg} .answer")
    assert '<img src=x onerror="window.__pwned=1">' in text and "<script>window.__pwned=2</script>" in text
    assert p.evaluate("() => window.__pwned") is None
    assert p.locator("#messages img:not(.images img), #messages script, #messages b").count() == 0
    assert p.inner_text(f"{msg} .answer strong") == "bold" and p.inner_text(f"{msg} .answer p code") == "code"
    assert p.inner_text(f"{msg} .code pre") == '<b onclick="window.__pwned=4">x</b>'
    assert p.inner_text(f"{msg} .code-lang") == "html"
    assert p.locator(f"{msg} a").count() == 1                        # javascript: stays text
    assert p.get_attribute(f"{msg} a", "href") == "https://example.com/docs"
    assert "noopener" in p.get_attribute(f"{msg} a", "rel")
    assert p.text_content(f"{msg} .reasoning-body") == "thinking <i>hard</i>"    # collapsed
    assert p.evaluate(f"() => document.querySelector('{msg} details.reasoning').open") is False
    assert p.inner_text(f"{msg} .tool-name") == "get_weather"
    assert json.loads(p.inner_text(f"{msg} .tool-args")) == {"city": "Paris"}
    assert "9 prompt + 40 tokens" in p.inner_text(f"{msg} .stats")
    page.shot(shots, "8-untrusted-text")


SHOWCASE_REASONING = ("The user wants to reverse a list. Slicing makes a reversed copy; list.reverse() "
                      "works in place. Show both, with their costs.")
SHOWCASE = """Two common ways:

1. **Slicing** returns a new list: `items[::-1]`
2. **`list.reverse()`** reverses the list in place and returns `None`

```python
items = [1, 2, 3]
print(items[::-1])   # [3, 2, 1]
items.reverse()
print(items)         # [3, 2, 1]
```

| method | copies the list | time |
|---|:-:|--:|
| `items[::-1]` | yes | O(n) |
| `items.reverse()` | no | O(n) |
"""


def test_showcase_screenshot(page, shots):
    """A scripted answer (reasoning, Markdown, a code block, a table) for the README's screenshot:
    PLAYGROUND_SCREENSHOT=docs/playground.png python3 -m pytest tests/integration/test_playground.py"""
    p = page.p
    words = SHOWCASE.split(" ")
    stream = sse(delta(role="assistant", content=""), delta(reasoning_content=SHOWCASE_REASONING),
                 *(delta(content=w + (" " if i < len(words) - 1 else "")) for i, w in enumerate(words)),
                 {"id": "c", "object": "chat.completion.chunk", "model": MODEL, "choices": [],
                  "usage": {"prompt_tokens": 18, "completion_tokens": 97, "total_tokens": 115,
                            "completion_tokens_details": {"reasoning_tokens": 24}}})
    p.click("#new-chat")
    p.check("#thinking")
    for field, value in (("#system-prompt", "Answer briefly."), ("#temperature", "0.7"), ("#top-p", "0.95"),
                         ("#top-k", "20"), ("#max-tokens", "1024"), ("#thinking-budget", "256")):
        page.set_field(field, value)
    p.route("**/v1/chat/completions",
            lambda route: route.fulfill(status=200, body=stream, content_type="text/event-stream"))
    try:
        body = page.send("How do I reverse a list in Python?")
        assert body["messages"] == [{"role": "system", "content": "Answer briefly."},
                                    {"role": "user", "content": "How do I reverse a list in Python?"}]
        assert (body["temperature"], body["top_p"], body["top_k"], body["max_tokens"]) == (0.7, 0.95, 20, 1024)
        assert body["chat_template_kwargs"] == {"enable_thinking": True} and body["thinking_budget"] == 256
        page.wait_answer_done()
    finally:
        p.unroute("**/v1/chat/completions")
    msg = "article.assistant:last-child"
    assert p.locator(f"{msg} ol li").count() == 2 and p.locator(f"{msg} table tr").count() == 3
    assert p.inner_text(f"{msg} .code-lang") == "python"
    assert "97 tokens" in p.inner_text(f"{msg} .stats") and "24 reasoning" in p.inner_text(f"{msg} .stats")
    p.click(f"{msg} details.reasoning summary")
    p.evaluate("() => { document.getElementById('messages').scrollTop = 0; }")
    shot = page.shot(shots, "9-showcase")
    if os.environ.get("PLAYGROUND_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["PLAYGROUND_SCREENSHOT"])


MD_CASES = [
    "# Title\n\nSome *em* and **strong**, ~~gone~~, `x<y`, \\*literal\\*.\nSecond line.",
    "- a\n- b\n  - nested\n    more\n- c\n\n1. one\n2. two\n\n3. three\n\n  indented para",
    "```python\ndef f():\n\n    return '<b>'\n```\n\nafter\n\n~~~\nfence ~\n~~~",
    "> quoted **text**\n> more\n\n| a | b |\n|:--|--:|\n| 1 | 2 |\n\n---\n\nhttps://example.com/x. done",
    "text [link](https://a.example/p?q=1) and [js](javascript:alert(1))\n\n```\nunclosed <script>",
]


def test_markdown_streaming_matches_whole_render(page):
    """MarkdownView fed in pieces (1, 3, 17 characters) builds the same DOM as one whole render."""
    result = page.p.evaluate("""async (cases) => {
        const md = await import('/ui/markdown.js');
        const out = [];
        for (const text of cases) {
            const whole = document.createElement('div');
            md.renderMarkdown(text, whole);
            for (const step of [1, 3, 17]) {
                const div = document.createElement('div');
                const view = new md.MarkdownView(div);
                for (let i = step; i < text.length + step; i += step) view.update(text.slice(0, i));
                out.push([step, div.innerHTML === whole.innerHTML]);
            }
            out.push(['html', whole.innerHTML]);
        }
        return out;
    }""", MD_CASES)
    html = [h for k, h in result if k == "html"]
    assert all(ok for k, ok in result if k != "html"), result
    assert "<h1>Title</h1>" in html[0] and "<del>gone</del>" in html[0] and "<code>x&lt;y</code>" in html[0]
    assert "*literal*" in html[0] and "<em>em</em>" in html[0]
    assert html[1].count("<ul>") == 2 and '<ol start="3">' in html[1] and "<li>nested\nmore</li>" in html[1]
    assert html[2].count('class="code"') == 2 and "    return '&lt;b&gt;'" in html[2]
    assert "<blockquote>" in html[3] and '<td class="align-right">2</td>' in html[3] and "<hr>" in html[3]
    assert '<a href="https://example.com/x"' in html[3]
    assert '<a href="https://a.example/p?q=1"' in html[4] and "javascript:alert(1)" in html[4]
    assert "href=\"javascript" not in html[4] and "&lt;script&gt;" in html[4]


class _SlowSSE(http.server.BaseHTTPRequestHandler):
    """Streams `tokens` content deltas in batches of `batch`, `pause_s` apart (what a fast model sends)."""
    tokens: list[str] = []
    batch = 40
    pause_s = 0.02

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.end_headers()
        event = lambda obj: f"data: {json.dumps(obj)}\n\n"
        self.wfile.write(event(delta(role="assistant", content="")).encode())
        for i in range(0, len(self.tokens), self.batch):
            self.wfile.write("".join(event(delta(content=t)) for t in self.tokens[i:i + self.batch]).encode())
            self.wfile.flush()
            time.sleep(self.pause_s)
        usage = {"id": "c", "object": "chat.completion.chunk", "model": MODEL, "choices": [],
                 "usage": {"prompt_tokens": 5, "completion_tokens": len(self.tokens),
                           "total_tokens": 5 + len(self.tokens)}}
        self.wfile.write((event(usage) + "data: [DONE]\n\n").encode())
        self.close_connection = True

    def log_message(self, *args):
        pass


def markdown_tokens(n: int) -> list[str]:
    """`n` tokens of mixed Markdown: paragraphs, lists, code blocks, headings."""
    blocks = ["## Section {k}\n\n", "Some **bold** words and `inline code` in paragraph {k} with more text here.\n\n",
              "- item {k} one\n- item {k} two with *emphasis*\n\n",
              "```js\nconst x{k} = {k};\nconsole.log(x{k});\n```\n\n"]
    out: list[str] = []
    k = 0
    while len(out) < n:
        text = blocks[k % len(blocks)].format(k=k)
        out.extend(w + " " for w in text.split(" ")[:-1])
        out.append(text.split(" ")[-1])
        k += 1
    return out[:n]


def test_streaming_2000_tokens_stays_responsive(page, shots):
    tokens = markdown_tokens(2000)
    handler = type("Handler", (_SlowSSE,), {"tokens": tokens})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    p = page.p
    slow = f"http://127.0.0.1:{srv.server_address[1]}/stream"
    # NOTE: the URL is changed below the page: it still fetches its own origin's route
    p.route("**/v1/chat/completions", lambda route: route.continue_(url=slow))
    try:
        p.click("#new-chat")
        page.set_field("#max-tokens", "2000")
        page.send("Write a long document.")
        p.wait_for_selector("article.assistant.streaming .answer h2")
        p.evaluate("""() => {
            const answer = document.querySelector('article.assistant.streaming .answer');
            const probe = window.__probe = {longTasks: [], frames: 0, removed: 0, t0: performance.now()};
            new PerformanceObserver((list) => { for (const e of list.getEntries()) probe.longTasks.push(e.duration); })
                .observe({type: 'longtask'});
            new MutationObserver((records) => { for (const r of records) probe.removed += r.removedNodes.length; })
                .observe(answer, {childList: true, subtree: true});
            const tick = () => {
                if (!document.querySelector('article.assistant.streaming')) { probe.t1 = performance.now(); return; }
                probe.frames++;
                requestAnimationFrame(tick);
            };
            requestAnimationFrame(tick);
        }""")
        page.wait_answer_done()
        probe = p.evaluate("() => window.__probe")
    finally:
        p.unroute("**/v1/chat/completions")
        srv.shutdown()
        srv.server_close()
    wall = probe["t1"] - probe["t0"]
    long_total = sum(probe["longTasks"])
    print(f"2000-token stream: {wall:.0f} ms, {probe['frames']} frames, long tasks {len(probe['longTasks'])} "
          f"({long_total:.0f} ms, max {max(probe['longTasks'], default=0):.0f} ms), {probe['removed']} nodes removed")
    text = p.inner_text("article.assistant .answer")
    assert text.rstrip().endswith(tokens[-1].strip()) and p.locator("article.assistant .answer h2").count() >= 20
    assert "2000 tokens" in p.inner_text("article.assistant .stats")
    assert probe["frames"] >= wall / 16.7 / 4, probe                  # frames kept coming (60 Hz ideal)
    assert long_total < 0.3 * wall and max(probe["longTasks"], default=0) < 200, probe
    assert probe["removed"] <= 4 * probe["frames"] + 20, probe                # only the open block re-renders
    page.shot(shots, "10-long-stream")


def test_no_third_party_requests(page):
    assert page.urls and all(u.startswith(page.base + "/") or u.startswith(("data:", "blob:")) for u in page.urls), \
        sorted(set(page.urls))


def test_ui_routes_csp_and_no_ui(server, monkeypatch):
    import argparse
    import types

    from fastapi.testclient import TestClient

    from ninfer.gateway.cli import cmd_serve
    from ninfer.gateway.http import server as http_server
    from ninfer.gateway.http.app import GatewayState, create_app
    from ninfer.gateway.http.ui import CSP

    for path, kind in (("/", "text/html"), ("/ui/app.js", "javascript"), ("/ui/style.css", "text/css")):
        r = httpx.get(server.base + path)              # no API key: the page asks for it itself
        assert r.status_code == 200 and kind in r.headers["content-type"], path
        assert r.headers["content-security-policy"] == CSP and r.headers["x-content-type-options"] == "nosniff"
    for part in ("default-src 'self'", "script-src 'self'", "connect-src 'self'", "img-src 'self' data: blob:"):
        assert part in CSP
    assert "unsafe" not in CSP
    assert "content-security-policy" not in httpx.get(server.base + "/health").headers
    assert httpx.get(server.base + "/v1/models").status_code == 401
    assert httpx.get(server.base + "/ui/missing.js").status_code == 404
    models = httpx.get(server.base + "/v1/models", headers=server.headers).json()
    assert models["data"][0]["demo"] is True
    # --no-ui: no page, no assets (and the flag reaches the state)
    off = TestClient(create_app(GatewayState(model_name="m", ui=False, api_key="k")))
    assert off.get("/").status_code == 404 and off.get("/ui/app.js").status_code == 404
    assert off.get("/").json()["error"]["code"] == "not_found"
    # the flag's way to the server: `ninfer serve --no-ui` -> serve(ui=False), and demo=True for the demo model
    parser = argparse.ArgumentParser()
    cmd_serve.add_parser(parser)
    seen = {}
    monkeypatch.setattr(cmd_serve, "resolve_model", lambda model, config: (Path("demo.ninfer"), MODEL, True))
    plan = types.SimpleNamespace(note=lambda: "max_model_len: the start plan's line")
    monkeypatch.setattr(cmd_serve, "check_model", lambda path, config: plan)
    monkeypatch.setattr(http_server, "serve", lambda factory, **kw: seen.update(kw) or 0)
    for argv, ui in ((["--port", "0"], True), (["--port", "0", "--no-ui"], False)):
        assert cmd_serve.run(parser.parse_args(argv)) == 0 and seen["ui"] is ui and seen["demo"] is True
