"""The dashboard as a person sees it (README: Dashboard): Debian's headless Chromium, driven
by selenium through chromedriver, loads the page of a real server on the real database;
traffic shows in its numbers and plot, a dead letter appears and a click redrives it, and
with --auth the page asks for the token. Screenshots go to $MSGTABLE_ARTIFACTS (default
test-artifacts/ in the repository), kept as the run's artefacts."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from msgtable.observe.dashboard import DashboardApi, DashboardServer, RateHistory
from msgtable.server.auth import Authorizer

from ..waiting import wait_until
from .helpers import Collector, Served, serve

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
pytestmark = pytest.mark.skipif(
    not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
    reason="no chromium and chromedriver (make test installs them: apt-get install "
    "chromium chromium-driver)",
)
ARTIFACTS = Path(
    os.environ.get("MSGTABLE_ARTIFACTS") or Path(__file__).resolve().parents[2] / "test-artifacts"
)
TOKEN = "t0ken-of-the-ops-team"
AUTH = {
    "tokens": {TOKEN: "ops"},
    "allow": [{"principal": "ops", "tables": ["jobs"], "actions": ["list", "redrive"]}],
}


@pytest.fixture
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run", "--window-size=1280,1000",
    ):  # fmt: skip
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="msgtable-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(browser: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    assert browser.save_screenshot(str(path)), f"no screenshot at {path}"
    print(f"screenshot: {path}")
    return path


def text(browser: Any, css: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return str(browser.find_element("css selector", css).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def attr(browser: Any, css: str, name: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return str(browser.find_element("css selector", css).get_attribute(name) or "")
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


SENT_RGB = (0x44, 0x77, 0xAA)  # dashboard.js: the colour of the "sent" series


def blue_pixels(browser: Any, plot_css: str) -> int:
    """Pixels of the plot's canvas within 8 of the sent series' colour."""
    return int(
        browser.execute_script(
            """
            const c = document.querySelector(arguments[0] + " canvas");
            if (!c) return 0;
            const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
            const [r, g, b] = arguments[1];
            let n = 0;
            for (let i = 0; i < d.length; i += 4) {
              if (d[i + 3] > 200 && Math.abs(d[i] - r) <= 8 && Math.abs(d[i + 1] - g) <= 8
                  && Math.abs(d[i + 2] - b) <= 8) n++;
            }
            return n;
            """,
            plot_css,
            list(SENT_RGB),
        )
    )


@pytest.fixture
def served(db_dsn: str) -> Iterator[Served]:
    with serve(db_dsn) as s:
        yield s


def open_dashboard(served: Served, authorizer: Authorizer | None = None) -> DashboardServer:
    d = DashboardServer(DashboardApi(served.engine, RateHistory(0.5), authorizer), "127.0.0.1:0")
    d.open()
    return d


def test_the_page_shows_traffic_and_a_click_redrives_a_dead_letter(served: Served, browser):
    served.create_table("jobs", vt_poller_interval=30, vt_ack_wait=60)
    served.create_table("idle")
    d = open_dashboard(served)
    c = None
    try:
        browser.get(d.url)
        card = '[data-key="jobs"]'
        wait_until(lambda: text(browser, card + " h2") == "jobs", what="the jobs table shown")
        wait_until(lambda: text(browser, '[data-key="idle"] h2'), what="the idle table shown")
        assert text(browser, card + " .v-in_flight") == "0"

        rows = ",".join(f"({i}, 'm')" for i in range(8))
        served.sql(f"insert into jobs(id, message) values {rows}")
        c = Collector(served.client, "jobs")
        got = {m.id: m for m in c.take(8)}
        assert served.client.ack("jobs", [0, 1, 2, 4, 5]) == 5
        assert got[3].reject("poison") == 1
        wait_until(
            lambda: text(browser, card + " .v-in_flight") == "2",
            what=lambda: f"in flight 2 shown (shows {text(browser, card + ' .v-in_flight')!r})",
        )
        assert text(browser, card + " .v-acked") == "5"
        assert text(browser, card + " .v-sent") == "8"
        assert text(browser, card + " .v-subscribers") == "1"
        plot = card + " .rate-plot"
        idle_plot = '[data-key="idle"] .rate-plot'
        wait_until(
            lambda: (
                attr(browser, plot, "data-acked") == "5" and attr(browser, plot, "data-sent") == "8"
            ),
            what=lambda: (
                "the rate plot to hold the 8 sends and 5 acks (holds "
                f"{attr(browser, plot, 'data-sent')!r} and {attr(browser, plot, 'data-acked')!r})"
            ),
        )
        # what a person sees: the sends drawn as a line in their colour, off the zero line
        # where an idle table's overlapping series show the last one's colour
        sent_pixels = wait_until(
            lambda: (n := blue_pixels(browser, plot)) > blue_pixels(browser, idle_plot) + 20 and n,
            what=lambda: (
                f"the sends drawn (blue pixels: {blue_pixels(browser, plot)} in jobs, "
                f"{blue_pixels(browser, idle_plot)} in idle)"
            ),
        )
        assert sent_pixels > 20
        dead = card + ' .dead li[data-id="3"]'
        wait_until(lambda: text(browser, dead), what="the dead letter 3 listed")
        assert text(browser, card + " .v-dead") == "1"
        assert "1 attempt" in text(browser, dead) and "1 attempts" not in text(browser, dead)
        # the backlog by age, as msgtable.store.backlog reads it (at most every 5 s): the 2 in
        # flight are scheduled (their ack wait), both created within the last minute
        backlog = card + " .backlog-text"
        wait_until(
            lambda: "0 due · 2 scheduled" in text(browser, backlog),
            timeout_s=20,
            what=lambda: f"the backlog read (shows {text(browser, backlog)!r})",
        )
        bars = browser.find_elements("css selector", card + " .bars span")
        assert [b.get_attribute("data-count") for b in bars] == ["2", "0", "0", "0", "0", "0", "0"]
        screenshot(browser, "dashboard-traffic.png")
        looks_as_a_person_reads_it(browser, card, served.engine.keyspace)

        browser.find_element("css selector", dead + " button.redrive").click()
        (again,) = c.take(1, timeout_s=10)
        assert again.id == 3
        wait_until(
            lambda: text(browser, card + " .v-dead") == "0" and not text(browser, dead),
            what="the redriven dead letter gone from the page",
        )
        wait_until(lambda: text(browser, card + " .v-in_flight") == "3", what="3 in flight shown")
        screenshot(browser, "dashboard-redriven.png")

        # nothing was fetched from anywhere but this server
        origin = d.url.rstrip("/")
        urls = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)"
        )
        assert urls and all(u.startswith(origin + "/") for u in urls), urls
        assert text(browser, "#database") == "database up"
        assert "lease holder this server" in text(browser, "#lease")
    finally:
        if c is not None:
            c.close()
        d.close()


def looks_as_a_person_reads_it(browser: Any, card: str, keyspace: str) -> None:
    """The title, the unacked-by-age strip, the plot's legend and time axis as issue 43 found
    them wanting: "msgtable msgtable", 1-pixel bars, two legend lines of "Time: --", and
    "11/28/26 7:23pm" under a header on the 24-hour clock."""
    assert text(browser, "h1") == f"msgtable keyspace {keyspace}"
    assert browser.title == f"msgtable: keyspace {keyspace}"
    # the strip: seven columns a person can see, each with its ages under it, the count on it
    sizes = browser.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' .bars span')]"
        ".map(b => [b.offsetWidth, b.offsetHeight])",
        card,
    )
    assert len(sizes) == 7 and all(w >= 20 and h >= 20 for w, h in sizes), sizes
    ages = ["< 1m", "1m-5m", "5m-15m", "15m-1h", "1h-6h", "6h-1d", "> 1d"]
    axis = browser.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' .bars-axis span')]"
        ".map(s => s.textContent)",
        card,
    )
    assert [a.replace("\u2013", "-") for a in axis] == ages, axis
    assert text(browser, card + ' .bars span[data-count="2"]') == "2"
    # the legend: one line of the five series' names, no time, no "--"
    legend = card + " .u-legend"
    names = browser.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' .u-series')]"
        ".filter(e => e.offsetParent !== null).map(e => e.innerText.trim())",
        legend,
    )
    assert names == ["sent", "acked", "released", "rejected", "dead lettered"], names
    line = browser.execute_script(
        "const l = document.querySelector(arguments[0] + ' .u-legend');"
        "return [l.offsetHeight, parseFloat(getComputedStyle(l).lineHeight) || 18]",
        card,
    )
    assert line[0] < 2 * line[1], line
    # the time axis on the header's clock: 19:23 or 19:23:05, never 7:23pm or a date
    ticks = browser.execute_script(  # uPlot draws them on its canvas, and keeps them here
        "const c = cards.get(arguments[0]); return c && c.plot ? c.plot.axes[0]._values : []",
        "jobs",
    )
    assert ticks and all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", t) for t in ticks), ticks
    assert re.fullmatch(r"updated \d\d:\d\d:\d\d", text(browser, "#updated"))


def test_the_dead_letter_counter_and_its_list_say_the_same(served: Served, browser):
    """The counter came from the state's snapshot (the last refresh, seconds old), the list
    from its own request: 6 beside a list of 7. Both now say the list's answer."""
    served.create_table("jobs", vt_poller_interval=30, vt_ack_wait=60)
    d = open_dashboard(served)
    c = None
    try:
        browser.get(d.url)
        card = '[data-key="jobs"]'
        served.sql("insert into jobs(id, message) values (1, 'a'), (2, 'b')")
        c = Collector(served.client, "jobs")
        first, second = c.take(2)
        assert first.reject("poison") == 1
        wait_until(lambda: text(browser, card + ' .dead li[data-id="1"]'), what="dead letter 1")
        d.refresher.close()  # the state's snapshot stays where it is: one dead letter
        assert second.reject("poison") == 1
        wait_until(
            lambda: text(browser, card + ' .dead li[data-id="2"]'), what="dead letter 2 listed"
        )
        assert text(browser, card + " .dead h3").startswith("Dead letters (2)")
        wait_until(
            lambda: text(browser, card + " .v-dead") == "2",
            what=lambda: f"the counter at 2 (shows {text(browser, card + ' .v-dead')!r})",
        )
    finally:
        if c is not None:
            c.close()
        d.close()


def test_with_auth_the_page_asks_for_the_token_once(served: Served, browser):
    served.create_table("jobs")
    served.create_table("payroll")
    wait_until(
        lambda: {t.name for t in served.engine.list_tables()} >= {"jobs", "payroll"},
        what="both tables loaded",
    )
    d = open_dashboard(served, Authorizer.from_dict(AUTH))
    try:
        browser.get(d.url)
        wait_until(
            lambda: browser.find_element("id", "login").is_displayed(), what="the token prompt"
        )
        assert not browser.find_elements("css selector", ".card")
        screenshot(browser, "dashboard-token-prompt.png")
        browser.find_element("id", "token").send_keys("not-the-token-at-all")
        browser.find_element("id", "login-button").click()
        wait_until(lambda: "refused" in text(browser, "#login-why"), what="the wrong token refused")
        browser.find_element("id", "token").send_keys(TOKEN)
        browser.find_element("id", "login-button").click()
        wait_until(lambda: text(browser, '[data-key="jobs"] h2'), what="jobs shown with a token")
        assert not browser.find_elements("css selector", '[data-key="payroll"]')
        assert not browser.find_element("id", "login").is_displayed()
        browser.refresh()  # the token is kept for the tab: no second prompt
        wait_until(lambda: text(browser, '[data-key="jobs"] h2'), what="jobs shown after reload")
        assert not browser.find_element("id", "login").is_displayed()
        screenshot(browser, "dashboard-with-token.png")
    finally:
        d.close()


def test_a_card_shows_its_dedup_and_its_schedules_last_and_next_tick(served: Served, browser):
    served.create_table(
        "jobs",
        "dedup_key varchar(64), unique index dedup_idx(dedup_key), "
        "index dedup_created_idx(time_created, dedup_key)",
        vt_dedup="dedup_key",
        vt_dedup_window=30,
    )
    wait_until(lambda: "jobs" in {t.name for t in served.engine.list_tables()}, what="jobs loaded")
    served.engine.schedules.create_schedule(
        "beat", "jobs", "* * * * * *", {"message": "beat"}, timezone="Europe/Paris"
    )
    d = open_dashboard(served)
    try:
        browser.get(d.url)
        card = '[data-key="jobs"]'
        wait_until(
            lambda: text(browser, card + " .dedup") == "dedup: key dedup_key, window 30.0 s",
            what=lambda: f"the dedup line (shows {text(browser, card + ' .dedup')!r})",
        )
        beat = card + ' .schedules li[data-schedule="beat"]'
        line = re.compile(
            r"schedule beat \('\* \* \* \* \* \*' in Europe/Paris, missed: skip\): last tick "
            r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ), next (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ), "
            r"[1-9]\d* enqueued"
        )
        shown = wait_until(
            lambda: line.fullmatch(text(browser, beat)),
            timeout_s=15,
            what=lambda: f"the schedule's line with a tick (shows {text(browser, beat)!r})",
        )
        assert shown.group(1) < shown.group(2), shown.group(0)
        screenshot(browser, "dashboard-schedules.png")
    finally:
        d.close()


def test_the_header_shows_the_sqs_api_and_its_calls(served: Served, browser):
    import boto3
    from botocore.config import Config

    from msgtable.server.sqs.app import SqsServer

    served.create_table("jobs")
    sqs = SqsServer(
        served.engine, served.db.url.render_as_string(hide_password=False), "127.0.0.1:0"
    )
    sqs.open()
    d = open_dashboard(served)
    try:
        browser.get(d.url)
        wait_until(lambda: text(browser, '[data-key="jobs"] h2'), what="the jobs table shown")
        assert not browser.find_element("id", "sqs").is_displayed()  # not served: no pill
        d.api.sqs = sqs
        wait_until(
            lambda: text(browser, "#sqs") == f"sqs on {sqs.address} · 0 calls",
            what=lambda: f"the SQS pill with no call (shows {text(browser, '#sqs')!r})",
        )
        c = boto3.client(
            "sqs", endpoint_url=sqs.url, region_name="local", aws_access_key_id="a",
            aws_secret_access_key="b", config=Config(retries={"total_max_attempts": 1}),
        )  # fmt: skip
        url = c.get_queue_url(QueueName="jobs")["QueueUrl"]
        c.send_message(QueueUrl=url, MessageBody="hello")
        wait_until(
            lambda: text(browser, "#sqs") == f"sqs on {sqs.address} · 2 calls",
            what=lambda: f"the SQS pill with 2 calls (shows {text(browser, '#sqs')!r})",
        )
        assert attr(browser, "#sqs", "title") == "GetQueueUrl 1\nSendMessage 1"
        screenshot(browser, "dashboard-sqs.png")
    finally:
        d.close()
        sqs.close()


def test_a_lazy_subscriptions_card_shows_its_mode_and_cursor_lag(served: Served, browser):
    served.create_table("jobs", "region varchar(8)", vt_poller_interval=0.2)
    served.client.create_subscription("jobs", "feed", state_rows="lazy")
    served.client.create_subscription("jobs", "audit")
    served.client.create_subscription("jobs", "eu", filter="region = 'eu'", state_rows="lazy")
    served.sql("insert into jobs (id) values (1), (2), (3)")
    d = open_dashboard(served)
    try:
        browser.get(d.url)
        lazy, eager = '[data-key="jobs/feed"]', '[data-key="jobs/audit"]'
        wait_until(
            lambda: text(browser, lazy + " .v-cursor_lag") == "3",
            what=lambda: (
                f"the lazy card's 3 never sent (shows {text(browser, lazy + ' .v-cursor_lag')!r})"
            ),
        )
        assert text(browser, lazy + " h2 .sub") == "/ feed (lazy)"
        assert text(browser, eager + " h2 .sub") == "/ audit"
        assert text(browser, eager + " .v-cursor_lag") == "", "an eager card has no cursor lag"
        # a lazy filter with no index to find its matches: the card says which to add
        add = "ALTER TABLE `jobs` ADD INDEX `region_fanout_idx` (`region`, time_fanout)"
        assert text(browser, '[data-key="jobs/eu"] .advice').endswith(add), "the filter's index"
        shown = browser.find_element("css selector", lazy + " .advice")
        assert not shown.is_displayed(), "no filter: no advice shown"
        assert shown.get_attribute("textContent") == ""
    finally:
        d.close()
