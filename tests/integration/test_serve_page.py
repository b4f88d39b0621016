"""`nmt serve`'s web page in a real browser: headless Chromium from the system's packages,
driven by Selenium through the system's chromedriver (nothing is downloaded).

A real server process on a free loopback port, with the word-reversing model: type a
sentence and its translation appears, ask for the n-best list, open the alignment view
and see one cell per source x target piece, with no Content-Security-Policy violation
and no console error; a screenshot is kept (under the test's tmp_path, and copied to
$NMT_TEST_ARTIFACTS when that is set). `nmt attention`'s page, which draws with the same
script, is checked in the same browser.

Without chromium or chromedriver (or selenium) the tests skip and say why, unless
NMT_REQUIRE_BROWSER=1, as CI sets: there a missing browser fails.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from serve_process import ServeProcess

from nmt_cli.config import DecodeConfig
from nmt_cli.engines.pictures.attention_html import attention_page
from nmt_cli.engines.translate.attention import record_attention
from nmt_cli.engines.translate.translator import Translator

SENTENCE = "the big red dog sat"
REVERSED = "sat dog red big the"
CHROMEDRIVER = Path("/usr/bin/chromedriver")
MAX_SENTENCES = 3  # the server's limit a request, so that the page can be shown an error
WAIT_S = 30  # a translation by the tiny model takes milliseconds; this is the hang limit
# window.__csp collects every Content-Security-Policy violation of a page, from before its
# first script runs (DevTools adds this ahead of the page's own scripts).
CSP_WATCH = (
    "window.__csp = [];"
    "document.addEventListener('securitypolicyviolation',"
    " (e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));"
)


def missing_browser() -> str | None:
    """Why the browser cannot run here, or None."""
    if shutil.which("chromium") is None:
        return "chromium is not installed (Debian: apt-get install chromium)"
    if not CHROMEDRIVER.is_file():
        return f"{CHROMEDRIVER} is missing (Debian: apt-get install chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


REQUIRED = os.environ.get("NMT_REQUIRE_BROWSER") == "1"
MISSING = missing_browser()
pytestmark = [pytest.mark.slow]  # a server process and a headless browser
if MISSING is not None and not REQUIRED:
    pytestmark.append(pytest.mark.skip(reason=MISSING))  # before any model is trained


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if MISSING is not None:
        pytest.fail(f"NMT_REQUIRE_BROWSER=1 but {MISSING}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(shutil.which("chromium"))
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1100,1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CSP_WATCH})
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(
    reverser_unseen: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    """`nmt serve` on the reversing model, at most MAX_SENTENCES sentences a request."""
    args = ["-m", str(reverser_unseen), "--pair", "en-de", "--precision", "fp32"]
    args += ["--threads", "1", "--max-sentences", str(MAX_SENTENCES)]
    process = ServeProcess(args, tmp_path_factory.mktemp("serve")).start()
    yield process
    process.stop()


def wait_for(driver: Any, condition: Any, what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(condition, message=f"waited for {what}")


def texts(driver: Any, selector: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, selector)]


def console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def keep_screenshot(driver: Any, path: Path) -> None:
    """Saved under the test's directory, and copied to $NMT_TEST_ARTIFACTS when set."""
    assert driver.save_screenshot(str(path)), "the screenshot was not written"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    artifacts = os.environ.get("NMT_TEST_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(artifacts) / path.name)


def heat_cells(driver: Any) -> list[list[float]]:
    """The heatmap's weights, row by row, from each cell's title ('r -> c: 0.123')."""
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, "table.heat tbody tr")
    return [
        [
            float(td.get_attribute("title").rsplit(": ", 1)[1])
            for td in row.find_elements(By.TAG_NAME, "td")
        ]
        for row in rows
    ]


def test_the_page_translates_as_you_type_with_nbest_and_alignment(
    browser: Any, server: ServeProcess, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    # The policy the page must live with: nothing inline, nothing from elsewhere.
    policy = server.get("/").headers["content-security-policy"]
    assert policy.startswith("default-src 'self';") and "unsafe" not in policy
    driver = browser
    driver.get(f"http://{server.host}:{server.port}/")
    pair = driver.find_element(By.ID, "pair")
    wait_for(driver, lambda _: pair.text.startswith("Model:"), "the model's languages")

    driver.find_element(By.ID, "text").send_keys(SENTENCE)  # no button: typing is enough
    wait_for(driver, lambda _: texts(driver, "#results .translation") == [REVERSED], REVERSED)
    assert driver.find_element(By.ID, "error").text == ""

    driver.find_element(By.ID, "nbest").click()
    wait_for(driver, lambda _: len(texts(driver, "#results ol.nbest li")) == 4, "4 alternatives")
    alternatives = texts(driver, "#results ol.nbest li")
    assert alternatives[0].startswith(REVERSED)
    scores = [float(s) for s in texts(driver, "#results ol.nbest li .score")]
    assert scores == sorted(scores, reverse=True) and len(set(alternatives)) == 4

    driver.find_element(By.ID, "alignment").click()
    wait_for(driver, lambda _: driver.find_elements(By.CSS_SELECTOR, "table.heat td"), "cells")
    truth = server.post("/v1/translate", {"text": SENTENCE, "attention": True}).json()
    attention = truth["translations"][0]["attention"]
    weights = heat_cells(driver)
    # One cell per target x source piece, each row a distribution (to the page's rounding).
    assert len(weights) == len(attention["target"])
    assert all(len(row) == len(attention["source"]) for row in weights)
    for row in weights:
        assert sum(row) == pytest.approx(1.0, abs=2e-3 * len(row))
    assert texts(driver, "table.heat tbody th") == attention["target"]
    assert driver.find_element(By.ID, "alignment-pairs").text.startswith("Hard alignment")
    keep_screenshot(driver, tmp_path / "serve-page.png")

    Select(driver.find_element(By.CSS_SELECTOR, "#attention select[name=view]")).select_by_value(
        "lines"
    )
    assert driver.find_elements(By.CSS_SELECTOR, "#attention svg line")

    # Two lines: two translations, and the attention of the first (asked for on its own).
    box = driver.find_element(By.ID, "text")
    box.send_keys("\nthe red cat")
    both = [REVERSED, "cat red the"]
    wait_for(driver, lambda _: texts(driver, "#results .translation") == both, str(both))
    Select(driver.find_element(By.CSS_SELECTOR, "#attention select[name=view]")).select_by_value(
        "heat"
    )
    assert texts(driver, "table.heat tbody th") == attention["target"]
    assert driver.execute_script("return window.__csp") == []
    assert console_errors(driver) == []


def test_a_server_error_is_shown_as_text(browser: Any, server: ServeProcess) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(f"http://{server.host}:{server.port}/")
    driver.find_element(By.ID, "text").send_keys("a dog\n" * (MAX_SENTENCES + 1))
    error = driver.find_element(By.ID, "error")
    wait_for(driver, lambda _: error.text, "an error message")
    assert error.text.startswith("The server could not translate: 400: text: 4 sentences")
    assert "(max_sentences)" in error.text
    assert driver.execute_script("return window.__csp") == []
    # The failed request itself is the one console error Chromium logs.
    assert all("status of 4" in message for message in console_errors(driver))


def test_nmt_attention_page_draws_with_the_same_script(
    browser: Any, reverser_unseen: Path, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    with Translator.load(reverser_unseen, DecodeConfig(precision="fp32")) as translator:
        maps = record_attention(translator, SENTENCE)
    page = tmp_path / "attention.html"
    page.write_text(attention_page(maps), encoding="utf-8")
    driver = browser
    driver.get(page.as_uri())
    kinds = Select(driver.find_element(By.CSS_SELECTOR, "select[name=attention]"))
    assert [o.text for o in kinds.options] == [
        "encoder self-attention",
        "decoder self-attention",
        "encoder-decoder attention",
    ]
    kinds.select_by_value("cross")
    weights = heat_cells(driver)
    # Layer 1, the mean over heads: as the page rounds weights, then shows 3 decimals.
    np.testing.assert_allclose(weights, maps.cross[0].mean(axis=0), atol=1.5e-3)
    assert console_errors(driver) == []
    keep_screenshot(driver, tmp_path / "attention-page.png")
