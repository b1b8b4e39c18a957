"""`specdec serve`'s chat page in a real browser: Chromium, headless, driven by Selenium, against a real server on
the default model. A prompt is typed and sent; the answer streams in with its drafted tokens tinted and the
figures beside it; its text is the API's answer to the same conversation, with drafting on and off (the page's
switch); a stored answer holding `<script>` and HTML is shown as text and runs nothing; a server with a key is
used once the key is given; and every request the browser made went to this server. Skips with one line where
no Chromium and chromedriver are installed (Debian: `apt-get install chromium chromium-driver`; .ci/run does).
`SPECDEC_PAGE_SCREENSHOT=FILE` saves the page as README shows it.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
from dataclasses import replace

import pytest
from conftest import fixed_planner
from test_server import HANG_GUARD, _sam_settings, client_of, serving

PROMPT = "Repeat this sentence twice: the quick brown fox jumps over the lazy dog."
HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2"> **bold** `code`'


def _chromium():
    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("no Chromium and chromedriver on this machine (apt-get install chromium chromium-driver): the "
                    "chat page's browser test did not run")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,860", "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    browser = webdriver.Chrome(service=Service(driver), options=options)
    browser.set_page_load_timeout(HANG_GUARD)
    return browser


@pytest.fixture
def browser():
    browser = _chromium()
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture(scope="module")
def smollm2(real_target):
    from specdec_cli.decoding.generation_config import GenerationConfig
    from specdec_cli.session.chat import ChatSession

    loaded = real_target("float32", "auto")
    settings = _sam_settings(replace(GenerationConfig(max_new_tokens=48)))
    return fixed_planner(ChatSession(loaded.model, loaded.tokenizer, settings))  # drafts verified on any machine


def _wait(browser, condition, what: str):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, HANG_GUARD, poll_frequency=0.05).until(lambda _: condition(), message=what)


def _ask(browser, text: str) -> dict:
    """Type and send `text`; the answered message as the page stored it."""
    from selenium.webdriver.common.by import By

    answered = len(browser.find_elements(By.CSS_SELECTOR, '.message.assistant[data-done="1"]'))
    box = browser.find_element(By.ID, "prompt")
    box.send_keys(text)
    browser.find_element(By.ID, "send").click()
    _wait(browser, lambda: len(browser.find_elements(By.CSS_SELECTOR, '.message.assistant[data-done="1"]'))
          > answered, "the answer to end")
    stored = browser.execute_script("return JSON.parse(localStorage.getItem('specdec.conversations'))")
    current = browser.execute_script("return JSON.parse(localStorage.getItem('specdec.current'))")
    return next(c for c in stored if c["id"] == current)["messages"][-1]


def _api_first_token_ms(server, prompt: str) -> float:
    """Milliseconds from a streamed request to its first content, as an API client sees them."""
    import time

    started = time.perf_counter()
    for chunk in client_of(server).chat.completions.create(model="smollm2", messages=[
            {"role": "user", "content": prompt}], max_tokens=48, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            return (time.perf_counter() - started) * 1000.0
    raise AssertionError("the stream showed no content")


def _requests_made(browser) -> list[str]:
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def test_the_page_streams_the_apis_answer_with_its_drafts_shown(smollm2, browser):
    from selenium.webdriver.common.by import By

    with serving(smollm2, name="smollm2") as server:
        browser.get(server.url + "/")
        _wait(browser, lambda: browser.find_element(By.ID, "model").text == "smollm2", "the model's name")
        assert browser.find_element(By.CSS_SELECTOR, "#drafter option").text == "sam"
        drafted = _ask(browser, PROMPT)
        api = client_of(server).chat.completions.create(model="smollm2", messages=[
            {"role": "user", "content": PROMPT}], max_tokens=48)
        assert drafted["content"] == api.choices[0].message.content and drafted["content"]
        api_ttft = _api_first_token_ms(server, PROMPT)
        node = browser.find_elements(By.CSS_SELECTOR, ".message.assistant")[-1]
        tinted = node.find_elements(By.CSS_SELECTOR, ".trace .drafted")
        assert tinted and all(span.get_attribute("data-source") for span in tinted)  # accepted drafts, by source
        figures = node.find_element(By.CSS_SELECTOR, ".stats .figures").text
        assert "tok/s" in figures and "tokens/step" in figures and "acceptance" in figures
        assert node.find_elements(By.CSS_SELECTOR, ".stats svg.plot polyline")
        assert "".join(span.text for span in node.find_elements(By.CSS_SELECTOR, ".trace span:not(.rejected)")) \
            .split() == drafted["content"].split()  # the tinted view shows the answer (whitespace aside)
        if os.environ.get("SPECDEC_PAGE_SCREENSHOT"):
            browser.save_screenshot(os.environ["SPECDEC_PAGE_SCREENSHOT"])

        browser.find_element(By.CSS_SELECTOR, "#drafter option[value='none']").click()  # drafting off
        browser.find_element(By.ID, "new-chat").click()
        plain = _ask(browser, PROMPT)
        assert plain["content"] == drafted["content"] and plain["drafter"] == "plain"
        assert plain["timings"]["draft_n"] == 0 and drafted["timings"]["draft_n"] > 0
        browser.find_element(By.ID, "regenerate").click()  # the last answer again, in its place
        _wait(browser, lambda: browser.execute_script(
            "const c = JSON.parse(localStorage.getItem('specdec.conversations'))[0];"
            f"return c.messages.length === 2 && c.messages[1].done && c.messages[1].asked_at > {plain['asked_at']}"),
            "the regenerated answer")
        stored = browser.execute_script("return JSON.parse(localStorage.getItem('specdec.conversations'))[0]")
        assert stored["messages"][1]["content"] == plain["content"]  # greedy: the same answer
        print(f"\ntime to first token, the same conversation again: page {plain['ttft_ms']:.0f} ms, a streaming "
              f"API client {api_ttft:.0f} ms (reported, not asserted: speed is the machine's)")

        browser.find_element(By.ID, "show-drafts").click()  # Markdown view
        assert not browser.find_elements(By.CSS_SELECTOR, ".trace")
        origin = server.url
        made = _requests_made(browser)
    assert made and all(url.startswith(origin) or url.startswith("data:") for url in made), made


def test_model_text_is_shown_as_text_and_runs_nothing(smollm2, browser):
    from selenium.webdriver.common.by import By

    stored = [{"id": "1", "title": "hostile", "messages": [
        {"role": "user", "content": "<b>hi</b>"},
        {"role": "assistant", "content": HOSTILE, "done": True, "steps": [
            {"kind": "prefill", "drafted": 0, "tokens": [[HOSTILE[:20], ""]], "rejected": []},
            {"kind": "step", "drafted": 4, "tokens": [[HOSTILE[20:], "sam-dynamic"]], "rejected": ["<i>x</i>"]}]}]}]
    with serving(smollm2, name="smollm2") as server:
        browser.get(server.url + "/")
        browser.execute_script("localStorage.setItem('specdec.conversations', arguments[0]);"
                               "localStorage.setItem('specdec.current', '\"1\"');", json.dumps(stored))
        for drafts in (True, False):
            browser.get(server.url + "/")
            _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, ".message.assistant"), "the answer")
            if not drafts:
                browser.find_element(By.ID, "show-drafts").click()
            body = browser.find_element(By.CSS_SELECTOR, ".message.assistant .body")
            assert "<script>window.pwned = 1</script>" in body.text
            assert not body.find_elements(By.TAG_NAME, "script") and not body.find_elements(By.TAG_NAME, "img")
            assert browser.find_element(By.CSS_SELECTOR, ".message.user .body").text == "<b>hi</b>"
            assert browser.execute_script("return window.pwned === undefined")


def test_a_server_with_a_key_is_used_once_the_key_is_given(smollm2, browser):
    from selenium.webdriver.common.by import By

    with serving(smollm2, name="smollm2", api_key="s3cret-key") as server:
        browser.get(server.url + "/")
        _wait(browser, lambda: browser.find_element(By.ID, "key-form").is_displayed(), "the page to ask for the key")
        browser.find_element(By.ID, "key").send_keys("s3cret-key")
        browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
        _wait(browser, lambda: browser.find_element(By.ID, "model").text == "smollm2", "the model's name")
        assert _ask(browser, "Say hello.")["content"]
        assert browser.execute_script("return sessionStorage.getItem('specdec.key')") == "s3cret-key"
        kept = browser.execute_script("return JSON.stringify(Object.assign({}, localStorage))")
        assert "s3cret-key" not in kept  # the key stays in the tab, never in the browser's storage


def test_a_traced_stream_carries_each_steps_drafts_and_the_page_needs_no_key(smollm2):
    """The stream's `speculation` field (asked with speculative.trace): every step's tokens, accepted drafts named
    by source, add up to the answer; the page's files are served with a policy that runs only their own scripts,
    without the key the API asks for."""
    from test_server import raw_request

    with serving(smollm2, name="smollm2", api_key="k") as server:
        client = client_of(server, api_key="k")
        steps, content = [], ""
        for chunk in client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}],
                                                    stream=True, extra_body={"speculative": {"trace": True}}):
            if chunk.model_extra.get("speculation"):
                steps.append(chunk.model_extra["speculation"])
            if chunk.choices and chunk.choices[0].delta.content:
                content += chunk.choices[0].delta.content
        assert steps[0]["kind"] == "prefill" and all(step["kind"] == "step" for step in steps[1:])
        assert "".join(text for step in steps for text, _ in step["tokens"]).startswith(content) and content
        assert any(source for step in steps for _, source in step["tokens"])
        assert all(len(step["tokens"]) <= step["drafted"] + 1 for step in steps[1:])
        whole = client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}],
                                               extra_body={"speculative": {"trace": True}})
        assert whole.choices[0].message.content == content and "speculation" not in whole.model_extra
        status, headers, _ = raw_request(server, "GET", "/v1/models")
        assert status == 401
        for path in ("/", "/page/page.js", "/page/page.css"):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG_GUARD)
            connection.request("GET", path)
            response = connection.getresponse()
            assert response.status == 200 and response.read()
            assert "script-src 'self'" in response.getheader("Content-Security-Policy")
            connection.close()
        status, _, body = raw_request(server, "GET", "/page/../app.py")
        assert status == 404
        status, _, body = raw_request(server, "POST", "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "x"}], "speculative": {"trace": "yes"}}).encode(),
            headers={"Authorization": "Bearer k"})
        assert status == 400 and body["error"]["param"] == "speculative.trace"
