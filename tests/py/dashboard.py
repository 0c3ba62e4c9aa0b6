"""The dashboard in a real browser (Debian's chromium, driven by Playwright), against a real
controller and nodelet started by tests/tests/e2e/dashboard.rs.

Everything comes from the environment (tokens never on a command line):
  DASH_URL          https://127.0.0.1:PORT/ui/
  DASH_ADMIN_TOKEN, DASH_VIEWER_TOKEN, DASH_MEMBER_TOKEN
  DASH_CHROMIUM     the browser (default /usr/bin/chromium)
  DASH_READY_FILE   written once the admin is signed in: the test then applies the job
  DASH_JOB          namespace/name of that job (in the member's namespace)
  DASH_HIDDEN_JOB   namespace/name of a job in a namespace the member is not in
  DASH_SCREENSHOT   where to save the lab picture (PNG)

Prints one line `DASHBOARD-METRICS {json}` (page weight, first contentful paint) and exits 0
when every check passed; a failed check raises (non-zero exit, with the reason).
"""

import json
import os
import sys
import time

from playwright.sync_api import expect, sync_playwright

URL = os.environ["DASH_URL"]
TIMEOUT_MS = 90_000


def sign_in(page, token):
    page.goto(URL)
    page.locator("#token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#main")).to_be_visible()
    # The change stream is up: the page is live.
    expect(page.locator("#live")).to_have_text("live", timeout=TIMEOUT_MS)


def sign_out(page):
    page.get_by_role("button", name="Sign out").click()
    expect(page.locator("#signin")).to_be_visible()


def job_row(page, ident):
    return page.locator(f'#jobs tr[data-job="{ident}"]')


def main():
    job = os.environ["DASH_JOB"]
    hidden = os.environ["DASH_HIDDEN_JOB"]
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=os.environ.get("DASH_CHROMIUM", "/usr/bin/chromium"),
            # Root in a container: Chromium's sandbox needs namespaces it may not have.
            args=["--no-sandbox"],
        )
        # The controller's certificate is signed by the test's own CA, which this browser
        # profile does not know.
        context = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        weights = {}

        def weigh(response):
            path = response.url.split("://", 1)[1].split("/", 1)[1]
            if path in ("ui/", "ui/app.js", "ui/app.css"):
                weights[path] = len(response.body())

        page.on("response", weigh)
        messages = []
        page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))

        # First visit: the sign-in page, and how soon it paints.
        first = page.goto(URL)
        expect(page.locator("#signin")).to_be_visible()
        headers = first.headers
        csp = headers.get("content-security-policy", "")
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, headers
        assert headers.get("x-content-type-options") == "nosniff", headers
        # The API answers nobody without a token.
        anonymous = page.evaluate("() => fetch('/ui/api/jobs').then((r) => r.status)")
        assert anonymous == 401, f"an anonymous read got {anonymous}"
        fcp = page.evaluate(
            """() => new Promise((done) => {
                const seen = () => performance.getEntriesByName('first-contentful-paint')[0];
                if (seen()) return done(seen().startTime);
                new PerformanceObserver(() => seen() && done(seen().startTime))
                    .observe({type: 'paint', buffered: true});
            })"""
        )
        nav = page.evaluate(
            "() => { const n = performance.getEntriesByType('navigation')[0];"
            " return {dcl: n.domContentLoadedEventEnd, load: n.loadEventEnd}; }"
        )
        # The token is nowhere but sessionStorage and the Authorization header.
        sent = []
        page.on("request", lambda r: sent.append(r.url))

        # The admin signs in and sees the lab: the Mac that joined.
        started = time.monotonic()
        sign_in(page, os.environ["DASH_ADMIN_TOKEN"])
        expect(page.locator("#lab-picture g.mac")).to_have_count(3)
        expect(page.locator("#lab-picture")).to_contain_text("node-1")
        expect(page.locator("#lab-picture line.cable")).to_have_count(3)
        lab_ms = (time.monotonic() - started) * 1000
        expect(job_row(page, hidden)).to_have_count(1)

        # The test applies the job now; it appears, runs and succeeds, told by the change stream.
        with open(os.environ["DASH_READY_FILE"], "w") as f:
            f.write("signed in\n")
        row = job_row(page, job)
        expect(row).to_have_count(1)
        expect(row).to_have_attribute("data-phase", "Succeeded", timeout=TIMEOUT_MS)
        expect(row.locator("td.phase")).to_have_text("Succeeded")
        # Its logs, read from the nodelet.
        row.get_by_role("button", name="Logs").click()
        expect(page.locator("#log-lines")).to_contain_text("hello from the dashboard test")
        # The loss its rank 0 logged, drawn as a curve: four points, 2.4 down to 2.1.
        expect(page.locator("#loss-curve")).to_be_visible()
        expect(page.locator("#loss-curve")).to_contain_text("last 2.100 · 4 points")
        # Events arrived too (the scheduler records them).
        expect(page.locator("#events tbody tr").first).not_to_have_text("No events.")

        # The lab picture, kept as an artifact, once the nodelets measured every cable.
        expect(page.locator("#lab-picture text.cable", has_text="µs")).to_have_count(3)
        shot = os.environ["DASH_SCREENSHOT"]
        os.makedirs(os.path.dirname(shot), exist_ok=True)
        page.locator("#lab").screenshot(path=shot)
        sign_out(page)

        # A viewer sees the job, and its delete is refused in the page.
        sign_in(page, os.environ["DASH_VIEWER_TOKEN"])
        expect(page.locator("#who")).to_contain_text("viewer")
        row = job_row(page, job)
        expect(row).to_have_count(1)
        delete = row.get_by_role("button", name="Delete")
        delete.click()
        row.get_by_role("button", name="Confirm delete").click()
        expect(page.locator("#notice")).to_contain_text("Refused (403)")
        expect(page.locator("#notice")).to_contain_text("may not delete")
        sign_out(page)

        # A member sees the jobs of its namespace, not another's.
        sign_in(page, os.environ["DASH_MEMBER_TOKEN"])
        expect(page.locator("#who")).to_contain_text("member")
        expect(job_row(page, job)).to_have_count(1)
        expect(job_row(page, hidden)).to_have_count(0)
        expect(page.locator("#lab-picture g.mac")).to_have_count(3)

        tokens = [os.environ[k] for k in ("DASH_ADMIN_TOKEN", "DASH_VIEWER_TOKEN", "DASH_MEMBER_TOKEN")]
        leaked = [u for u in sent if any(t in u for t in tokens)]
        assert not leaked, f"a token went into a URL: {leaked}"
        errors = [m for m in messages if m.startswith("error")]
        browser.close()

    metrics = {
        "page_weight_bytes": sum(weights.values()),
        "files": weights,
        "first_contentful_paint_ms": round(fcp, 1),
        "dom_content_loaded_ms": round(nav["dcl"], 1),
        "load_ms": round(nav["load"], 1),
        "sign_in_to_lab_ms": round(lab_ms, 1),
        "console_errors": errors,
    }
    print("DASHBOARD-METRICS " + json.dumps(metrics), flush=True)
    assert len(weights) == 3, f"expected the page's three files, weighed {weights}"


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the test prints our stderr; say what failed plainly
        print(f"dashboard check failed: {type(e).__name__}: {e}", file=sys.stderr)
        raise
