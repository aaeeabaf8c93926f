"""The first five minutes and the pictures, in a real browser (Debian's chromium) against a real server: the
landing page and its links, the favicon, no console error on any page for a member, an owner and staff, the
overview's chart and bars, usage axes whose labels never overlap (7, 31 and 92 days, two locales), and the
console's charts moving under load and settling back to 0."""

from __future__ import annotations

import re
import threading
import zoneinfo
from datetime import date, datetime, timedelta

import pytest

from tests.browser.conftest import long_completion, member_key, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
USAGE_CHARTS = ("chart-tokens", "chart-spend", "chart-ttft", "chart-errors")
CONSOLE_CHARTS = ("chart-rps", "chart-ttft", "chart-queue", "chart-events", "chart-kv", "chart-tok-s")
EN_DAY = re.compile(r"^[A-Z][a-z]{2} \d{1,2}(, \d{2})?$")  # "Mar 3" (", 25" when the range spans two years)
DE_DAY = re.compile(r"^\d{1,2}\. \S+( \d{2})?$")  # "3. März"


def watch(page) -> list[str]:
    """The console errors and uncaught exceptions of `page` from now on."""
    errors: list[str] = []
    page.on("console", lambda message: errors.append(f"{page.url}: {message.text}") if message.type == "error"
            else None)
    page.on("pageerror", lambda error: errors.append(f"{page.url}: uncaught {error}"))
    return errors


def charts_drawn(page, ids, *, ticked: bool = False) -> None:
    condition = "el && el.querySelector('.main-svg')" + (" && el.dataset.ticked === '1'" if ticked else "")
    page.wait_for_function(f"{list(ids)!r}.every(id => {{ const el = document.getElementById(id); "
                           f"return {condition}; }})", timeout=60_000)


def visit(page, path: str, name: str, *, charts=(), ticked=False) -> None:
    page.goto(path)
    page.wait_for_load_state("load")
    if charts:
        charts_drawn(page, charts, ticked=ticked)
    page.wait_for_timeout(300)  # late console errors (a fetch, a favicon) still land on this page
    screenshot(page, name)


def login(browser, site, username: str, password: str, **context_options):
    context = browser.new_context(base_url=site["url"], viewport={"width": 1280, "height": 900}, **context_options)
    page = context.new_page()
    page.goto("/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("[type=submit]")
    page.wait_for_load_state()
    return context, page


def test_landing_page_links_resolve_and_signed_in_users_go_to_their_dashboard(browser, site):
    context = browser.new_context(base_url=site["url"], viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        errors = watch(page)
        visit(page, "/", "landing")
        assert page.inner_text("#base-url") == f"{site['url']}/v1"
        assert f"curl {site['url']}/v1/models" in page.inner_text("#quick-start-curl")
        hrefs = page.eval_on_selector_all("#landing-links a", "links => links.map(a => a.getAttribute('href'))")
        assert hrefs == ["/dashboard/", "/admin/", "/v1/openapi.json", "/v1/models"]
        for href in hrefs:
            response = context.request.get(href)  # redirects followed: the login pages
            if href == "/v1/models":
                assert response.status == 401 and response.json()["error"]["code"] == "invalid_api_key"
            else:
                assert response.status == 200, href
        assert context.request.get("/v1/openapi.json").json()["openapi"].startswith("3.")
        favicon = context.request.get("/favicon.ico")
        assert favicon.status == 200 and favicon.headers["content-type"] == "image/svg+xml"
        page.click("#landing-links a[href='/dashboard/']")
        page.wait_for_load_state()
        assert "/accounts/login/" in page.url
        screenshot(page, "login")
        page.fill("input[name=username]", "acme-member")
        page.fill("input[name=password]", site["seed"]["users"]["acme-member"])
        page.click("[type=submit]")
        page.wait_for_load_state()
        page.goto("/")
        assert page.url.endswith("/dashboard/acme/")
        assert errors == []
    finally:
        context.close()


def _tenant_pages(slug: str, invoice: int) -> list[tuple[str, str, tuple]]:
    today = date.today()
    long_range = f"?start={(today - timedelta(days=91)).isoformat()}&end={today.isoformat()}"
    return [(f"/dashboard/{slug}/", "overview", ("chart-overview",)),
            (f"/dashboard/{slug}/usage/", "usage", USAGE_CHARTS),
            (f"/dashboard/{slug}/usage/{long_range}", "usage-92-days", USAGE_CHARTS),
            (f"/dashboard/{slug}/keys/", "keys", ()), (f"/dashboard/{slug}/invoices/", "invoices", ()),
            (f"/dashboard/{slug}/invoices/{invoice}/", "invoice", ()), (f"/dashboard/{slug}/settings/", "settings", ())]


@pytest.mark.parametrize("role", ["member", "owner", "staff"])
def test_no_console_errors_on_any_page(new_page, site, role):
    seed = site["seed"]
    if role == "staff":
        page = new_page("admin", site["admin_password"], admin=True)
        pages = [("/admin/", "admin", ()), ("/admin/console/", "console", CONSOLE_CHARTS),
                 ("/admin/tenants/tenant/", "admin-tenants", ()), ("/dashboard/", "staff-dashboard", ())]
    else:
        username, slug = ("acme-member", "acme") if role == "member" else ("globex-owner", "globex")
        page = new_page(username)
        pages = _tenant_pages(slug, seed["invoices"][slug])
    errors = watch(page)
    for path, name, charts in pages:
        visit(page, path, f"{role}-{name}", charts=charts)
    page.goto("/")
    page.wait_for_load_state()
    # signed in: their dashboard (bootstrap's admin owns the demo tenant; staff of no tenant: the admin)
    assert page.url.endswith({"staff": "/dashboard/demo/", "member": "/dashboard/acme/",
                              "owner": "/dashboard/globex/"}[role])
    assert errors == []


def test_the_overview_draws_its_chart_and_its_bars(new_page):
    page = new_page("globex-owner")
    page.goto("/dashboard/globex/")
    charts_drawn(page, ["chart-overview"], ticked=True)
    screenshot(page, "overview-chart")
    traces = page.evaluate("document.getElementById('chart-overview').data.map(t => [t.type, t.x])")
    today = datetime.now(zoneinfo.ZoneInfo("Asia/Kolkata")).date()  # globex's days
    days = [today.replace(day=1) + timedelta(days=i) for i in range(today.day)]
    assert traces == [["bar", [d.isoformat() for d in days]], ["scatter", [d.isoformat() for d in days]]]
    assert page.locator("#chart-overview .bars .point").count() == len(days)  # a bar per day drawn
    assert page.locator("#chart-overview .scatterlayer .trace").count() == 1
    budget = page.locator("#bar-budget")
    assert budget.count() == 1 and budget.get_attribute("data-thresholds") == "50,80,100"
    marks = page.eval_on_selector_all("#bar-budget .mark", "marks => marks.map(m => m.style.left)")
    assert marks == ["50%", "80%", "100%"]
    fill = page.eval_on_selector("#bar-budget .fill", "el => el.getBoundingClientRect().width")
    track = page.eval_on_selector("#bar-budget .track", "el => el.getBoundingClientRect().width")
    percent = float(budget.get_attribute("data-percent"))
    assert fill == pytest.approx(track * min(percent, 100) / 100, abs=2.5)


_TICKS = """ids => ids.map(id => {
  const el = document.getElementById(id);
  const ticks = [...el.querySelectorAll('.xtick text')].map(t => {
    const r = t.getBoundingClientRect(); return {text: t.textContent, left: r.left, right: r.right};
  }).filter(t => t.text);
  const y = [...el.querySelectorAll('.ytick text')].map(t => t.textContent);
  return {id, ticks, y, range: el._fullLayout.yaxis.range};
})"""


def _axes(page, days: int, end: date) -> list[dict]:
    start = end - timedelta(days=days - 1)
    page.goto(f"/dashboard/acme/usage/?start={start.isoformat()}&end={end.isoformat()}")
    charts_drawn(page, USAGE_CHARTS, ticked=True)
    return page.evaluate(_TICKS, list(USAGE_CHARTS))


@pytest.mark.parametrize(("locale", "pattern"), [("en-US", EN_DAY), ("de-DE", DE_DAY)])
def test_axis_labels_never_overlap_at_7_31_and_92_days(browser, site, locale, pattern):
    context, page = login(browser, site, "acme-member", site["seed"]["users"]["acme-member"], locale=locale)
    errors = watch(page)
    try:
        for days in (7, 31, 92):
            axes = _axes(page, days, date.today())
            screenshot(page, f"usage-{days}-days-{locale}")
            for axis in axes:
                ticks = sorted(axis["ticks"], key=lambda t: t["left"])
                assert len(ticks) >= min(days, 4), (days, axis["id"], ticks)
                for before, after in zip(ticks, ticks[1:]):
                    assert before["right"] <= after["left"], (days, axis["id"], before, after)
                assert all(pattern.match(t["text"]) for t in ticks), (days, axis["id"], [t["text"] for t in ticks])
                assert axis["range"][0] >= 0 and not any(label.startswith(("-", "−")) for label in axis["y"])
            spend = next(a for a in axes if a["id"] == "chart-spend")
            assert all(re.fullmatch(r"\$\d[\d,]*\.\d{2,9}", label) for label in spend["y"]), spend["y"]
        # a range without a request: the error rate's axis is 0 to 100 %
        quiet = {a["id"]: a for a in _axes(page, 92, date.today() - timedelta(days=30))}
        assert quiet["chart-errors"]["range"] == [0, 1]
        assert quiet["chart-errors"]["y"][0] in ("0%", "0 %") and quiet["chart-errors"]["y"][-1] in ("100%", "100 %")
        screenshot(page, f"usage-quiet-{locale}")
        rows = page.eval_on_selector_all("#usage-table tbody tr", "rows => rows.map(r => r.className)")
        assert rows == ["quiet"]  # 92 quiet days: one row
        assert errors == []
    finally:
        context.close()


def _series(page, chart: str) -> list[list]:
    return page.evaluate(f"document.getElementById({chart!r}).data.map(t => t.y)")


def test_console_charts_rise_under_load_and_settle_back_to_zero(new_page, site):
    page = new_page("admin", site["admin_password"], admin=True)
    errors = watch(page)
    key = member_key(new_page, "charts-load")
    call = long_completion(site, key)
    call()  # starts the embedded worker and loads the model
    page.goto("/admin/console/")
    charts_drawn(page, CONSOLE_CHARTS)
    page.wait_for_function("document.getElementById('chart-kv').data.length > 0", timeout=30_000)
    load = [threading.Thread(target=call) for _ in range(8)]
    for thread in load:
        thread.start()
    rose = ("document.getElementById('chart-queue').data.some(t => t.y.some(v => v > 0))"
            " && document.getElementById('chart-tok-s').data.some(t => t.y.some(v => v > 0))")
    page.wait_for_function(rose, timeout=120_000)
    screenshot(page, "console-charts-under-load")
    for thread in load:
        thread.join(300)
    settled = ("document.getElementById('chart-queue').data.every(t => { const ys = t.y.filter(v => v !== null);"
               " return ys.length && ys[ys.length - 1] === 0; })")
    page.wait_for_function(settled, timeout=60_000)
    page.wait_for_function("document.getElementById('chart-rps').data[0].y.some(v => v > 0)", timeout=30_000)
    screenshot(page, "console-charts")
    depth = _series(page, "chart-queue")
    assert max(v for ys in depth for v in ys if v is not None) > 0
    assert all([v for v in ys if v is not None][-1] == 0 for ys in depth)
    assert max(v for ys in _series(page, "chart-tok-s") for v in ys if v is not None) > 0
    # the tables are still there, beneath the charts, and agree: nothing queued now
    assert page.evaluate("document.getElementById('console-charts').compareDocumentPosition("
                         "document.getElementById('queues')) & Node.DOCUMENT_POSITION_FOLLOWING")
    assert errors == []
