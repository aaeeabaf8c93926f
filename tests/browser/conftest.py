"""Browser tests: Debian's chromium driven by Playwright, against a real uvicorn server.

One server (embedded mode: SQLite file, the engine in a thread, one sequence
at a time so that a small load queues), seeded by tests/browser/seed.py, and
one browser per test module, on a free port (tests.e2e.servers.port_pick: E2E_PORT_RANGE if set).
Screenshots of every page land in test-artifacts/screenshots/ (git-ignored).
Without chromium or Playwright the tests skip locally and fail under CI=true.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.processes import ROOT, Proc, database_prepare, http_wait, process_env
from tests.e2e.servers import port_pick

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
ADMIN_PASSWORD = "e2e-admin-password-1"  # what tests.e2e.processes.database_prepare gives bootstrap

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]


def _required(problem: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the browser tests must run under CI: {problem}")
    pytest.skip(problem)


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The server: {"url", "seed" (seed.py's output), "database" (its SQLite file)}."""
    tmp = tmp_path_factory.mktemp("browser_site")
    database = tmp / "site.sqlite3"
    env = process_env(DATABASE_URL=f"sqlite:///{database}", ENGINE_MAX_NUM_SEQS="1", ENGINE_KV_CACHE_MB="128",
                      OMP_NUM_THREADS="1")
    database_prepare(env)
    seeded = subprocess.run([sys.executable, str(Path(__file__).with_name("seed.py"))], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300, check=True)
    port = port_pick()
    proc = Proc("web", [sys.executable, "-m", "uvicorn", "platform_site.asgi:application", "--host", "127.0.0.1",
                        "--port", str(port), "--lifespan", "off", "--no-access-log"], env, tmp / "web.log")
    url = f"http://127.0.0.1:{port}"
    try:
        http_wait(f"{url}/healthz", proc)
        yield {"url": url, "seed": json.loads(seeded.stdout.strip().splitlines()[-1]), "database": database,
               "admin_password": ADMIN_PASSWORD, "proc": proc}
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def browser():
    """One chromium per test module. Not per session: Playwright's sync API runs an asyncio loop in the main thread
    while it is started, and the suites after this one (pytest-asyncio's tests, the servers' clients) cannot run
    their own loops until it stops."""
    if not Path(CHROMIUM).exists():
        _required(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _required("playwright is not installed (pip install -e '.[test]')")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield browser
        browser.close()


@pytest.fixture
def new_page(browser, site, request):
    """new_page(username, password=None, admin=False) -> a logged-in page in a fresh context (its own cookies)."""
    contexts = []

    def make(username: str, password: str | None = None, *, admin: bool = False):
        context = browser.new_context(base_url=site["url"], viewport={"width": 1280, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.on("pageerror", lambda error: print(f"page error on {page.url}: {error}"))  # shown when a test fails
        password = password or site["seed"]["users"].get(username) or site["admin_password"]
        page.goto("/admin/login/" if admin else "/accounts/login/")
        page.fill("input[name=username]", username)
        page.fill("input[name=password]", password)
        page.click("[type=submit]")
        page.wait_for_load_state()
        return page

    yield make
    for context in contexts:
        context.close()


def screenshot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def member_key(new_page, name: str) -> str:
    """A key `acme-member` creates on the dashboard's keys page (its secret, shown once)."""
    member = new_page("acme-member")
    member.goto("/dashboard/acme/keys/")
    member.fill("input[name=name]", name)
    member.click("#create-key [type=submit]")
    return member.inner_text("#new-key-secret")


def long_completion(site, key: str):
    """A function that makes one completion of 160 tokens with `key`: long enough that a queue of a few of them
    stays up across several of the console's 3 s refreshes (8 requests of 40 tokens were all served between two)."""
    import httpx

    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Count to fifty."}],
            "max_tokens": 160, "ignore_eos": True}

    def call() -> None:
        httpx.post(f"{site['url']}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                   timeout=300)

    return call
