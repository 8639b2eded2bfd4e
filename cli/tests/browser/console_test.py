#!/usr/bin/env python3
"""`outbox console` in a real browser: Debian's Chromium driven by Playwright, against a real
cluster with the outbox installed by `outbox migrate`, the roles of the GRANT recipes
(docs/security.md), a real `outbox relay` and a receiver on 127.0.0.1.

    OUTBOX_TEST_URL=postgres://postgres@127.0.0.1:PORT/postgres OUTBOX=target/debug/outbox \\
        python3 cli/tests/browser/console_test.py [NAME...]

Run by cli/test.sh. Screenshots of each page go to $OUTBOX_SCREENSHOTS (default
target/console-screenshots). Every wait has a deadline; nothing sleeps a fixed time.
"""

import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import psycopg
from playwright.sync_api import sync_playwright

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BASE_URL = os.environ["OUTBOX_TEST_URL"]
OUTBOX = os.environ.get("OUTBOX", os.path.join(ROOT, "target/debug/outbox"))
SHOTS = os.environ.get("OUTBOX_SCREENSHOTS", os.path.join(ROOT, "target/console-screenshots"))
DATABASE = "outbox_t_console"
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class Failed(Exception):
    pass


def check(condition, what):
    if not condition:
        raise Failed(what)


def wait_until(what, condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout:.0f} s waiting until {what}")
        time.sleep(0.05)


def url(user, database=DATABASE):
    host = BASE_URL.split("@", 1)[1].rsplit("/", 1)[0]
    return f"postgres://{user}@{host}/{database}"


def sql(query, *args, user="postgres"):
    with psycopg.connect(url(user), autocommit=True) as conn:
        cursor = conn.execute(query, args)
        return cursor.fetchall() if cursor.description else None


def recipe_sql_with(marker):
    """The SQL block of docs/security.md (the GRANT recipes) that holds marker, as written."""
    page = open(os.path.join(ROOT, "docs", "security.md")).read()
    at = page.index(marker)
    start = page.rindex("```sql\n", 0, at) + len("```sql\n")
    return page[start:page.index("```", at)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Receiver:
    """A webhook receiver on 127.0.0.1 that fails (500, with a hostile body) until told to accept."""

    def __init__(self):
        self.accept = False
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                if receiver.accept:
                    self.send_response(204)
                    self.end_headers()
                else:
                    body = ("<b>refused</b> " + HOSTILE).encode()
                    self.send_response(500)
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


class Process:
    """An `outbox` process, stopped with SIGTERM."""

    def __init__(self, *args, env=None):
        self.process = subprocess.Popen([OUTBOX, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=dict(os.environ, **(env or {})))
        self.output = []
        threading.Thread(target=lambda: self.output.extend(self.process.stdout), daemon=True).start()

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=20)


class Console(Process):
    def __init__(self, role, *extra, env=None, prefix=""):
        self.port = free_port()
        super().__init__("console", "--database-url", url(role), "--listen", f"127.0.0.1:{self.port}", "--prefix", prefix, *extra,
                         env=env)
        self.base = f"http://127.0.0.1:{self.port}{prefix}/"
        wait_until(f"the console as {role} serves", self.serves, timeout=20)

    def serves(self):
        check(self.process.poll() is None, "the console exited: " + "".join(self.output))
        try:
            return urllib.request.urlopen(self.base, timeout=2).status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def request(self, path, body=None, headers=None):
        """(status, JSON body) of a request made outside the browser."""
        data = None if body is None else body.encode()
        request = urllib.request.Request(self.base + path, data=data, headers=headers or {}, method="POST" if data else "GET")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")


def prepare():
    """A database with the SQL install, the recipes' roles, an endpoint whose deliveries are dead,
    a pull endpoint with a leased job, and a relay running."""
    admin = url("postgres", "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")
        for role in ["outbox_owner", "outbox_relay", "app_producer", "app_consumer", "ops", "monitor"]:
            conn.execute(f"DO $$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        conn.execute(f"GRANT CREATE ON DATABASE {DATABASE} TO outbox_owner; GRANT outbox_owner TO outbox_relay")
    subprocess.run([OUTBOX, "migrate", "--database-url", url("outbox_owner")], check=True, capture_output=True)
    receiver = Receiver()
    with psycopg.connect(url("outbox_owner"), autocommit=True) as conn:
        conn.execute("GRANT USAGE ON SCHEMA outbox TO app_producer, app_consumer, ops, monitor")
        conn.execute("SELECT outbox.outbox_endpoint_set('billing', %s, '{order.*}', max_attempts => 2)", (receiver.url,))
        conn.execute("SELECT outbox.outbox_endpoint_set('mailer', NULL, '{mail.*}', kind => 'pull')")
        conn.execute(recipe_sql_with("-- producer: enqueues in its own transactions"))
        conn.execute(recipe_sql_with("-- the exporter's role"))
    with psycopg.connect(url("app_producer"), autocommit=True) as conn:
        ids = [conn.execute("SELECT outbox.outbox_enqueue('order.placed', %s, %s)",
                            (json.dumps({"order": n, "note": HOSTILE}), f"customer-{n % 3}")).fetchone()[0] for n in range(6)]
        conn.execute("SELECT outbox.outbox_enqueue('mail.welcome', '{\"to\": \"a@example.com\"}')")
    relay = Process("relay", "--database-url", url("outbox_relay"), "--poll-interval", "100ms")
    wait_until("the relay gives up on every billing delivery (the receiver fails)",
               lambda: sql("SELECT count(*) FROM outbox.outbox_deliveries WHERE endpoint = 'billing' AND dead_at IS NOT NULL")[0][0] == 6,
               timeout=60)
    with psycopg.connect(url("app_consumer"), autocommit=True) as conn:
        conn.execute("SELECT * FROM outbox.outbox_claim('mailer', 1, '10 minutes')")
    return receiver, relay, ids


def browser_page(playwright):
    browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.on("dialog", lambda dialog: dialog.dismiss())  # no alert() is ever expected
    return browser, page


def shoot(page, name):
    os.makedirs(SHOTS, exist_ok=True)
    page.screenshot(path=os.path.join(SHOTS, f"{name}.png"), full_page=True)


def confirm(page):
    page.locator("#confirm-ok").click()


def stats():
    rows = sql("SELECT endpoint, pending, waiting, dead FROM outbox.outbox_endpoint_stats() ORDER BY endpoint")
    return {r[0]: {"pending": str(r[1]), "waiting": str(r[2]), "dead": str(r[3])} for r in rows}


def test_an_operator_sees_a_dead_delivery_requeues_it_and_sees_it_delivered(ctx):
    page, console, receiver, ids = ctx["page"], ctx["ops"], ctx["receiver"], ctx["ids"]
    page.goto(console.base)
    page.wait_for_selector("#overview tr[data-endpoint='billing']")
    expected = stats()
    for endpoint, numbers in expected.items():
        for field, value in numbers.items():
            shown = page.locator(f"#overview tr[data-endpoint='{endpoint}'] td[data-field='{field}']").inner_text().strip()
            check(shown == value, f"the overview shows {field} {shown} for {endpoint}; outbox_endpoint_stats() says {value}")
    check(page.locator("#relays li").count() == 1, "the overview lists the running relay")
    shoot(page, "overview")

    page.goto(console.base + "#/events?state=dead&endpoint=billing")
    page.wait_for_selector("#events tr[data-state='dead']")
    check(page.locator("#events tr[data-state='dead']").count() == 6, "the six dead deliveries are listed")
    check("6 deliveries match" in page.locator("#count").inner_text(), "the count is exact")
    shoot(page, "events")

    target = ids[0]
    page.goto(console.base + f"#/event/{target}")
    card = page.locator("#event .card[data-endpoint='billing']")
    card.wait_for()
    check("dead" in card.locator("[data-field='state']").inner_text(), "the delivery shows dead")
    failures = card.locator("table.failures tbody tr")
    check(failures.count() == 2, f"both failed attempts are in the history, not {failures.count()}")
    check("500" in failures.first.inner_text() and "<b>refused</b>" in failures.first.inner_text(),
          "the history shows the status and the start of the answer, as text")
    shoot(page, "event")

    receiver.accept = True
    card.get_by_role("button", name="Requeue").click()
    page.wait_for_selector("#notice:has-text('Requeued 1')")
    wait_until("the requeued delivery is sent",
               lambda: sql("SELECT sent_at IS NOT NULL FROM outbox.outbox_deliveries WHERE event_id = %s AND endpoint = 'billing'", target)[0][0])
    page.reload()
    page.locator("#event .card[data-endpoint='billing'] [data-field='state']:has-text('sent')").wait_for()


def test_a_bulk_requeue_shows_its_count_first_and_acts_only_when_confirmed(ctx):
    page, console = ctx["page"], ctx["ops"]
    dead = sql("SELECT count(*) FROM outbox.outbox_deliveries WHERE endpoint = 'billing' AND dead_at IS NOT NULL")[0][0]
    page.goto(console.base + "#/events?state=dead&endpoint=billing")
    page.get_by_role("button", name="Requeue all matching…").click()
    question = page.locator("#confirm-text")
    question.wait_for()
    check(f"Requeue all {dead} deliveries" in question.inner_text(), f"the dialog counts {dead}: {question.inner_text()!r}")
    page.get_by_role("button", name="Cancel").click()
    check(sql("SELECT count(*) FROM outbox.outbox_deliveries WHERE endpoint = 'billing' AND dead_at IS NOT NULL")[0][0] == dead,
          "cancelled: nothing changed")
    page.get_by_role("button", name="Requeue all matching…").click()
    confirm(page)
    page.wait_for_selector(f"#notice:has-text('Requeue: {dead} changed')")
    wait_until("every requeued delivery is sent",
               lambda: sql("SELECT count(*) FROM outbox.outbox_deliveries WHERE endpoint = 'billing' AND sent_at IS NULL")[0][0] == 0)
    # A bulk skip passes over what is not dead (here: everything) instead of failing on it.
    page.goto(console.base + "#/events?endpoint=billing")
    page.get_by_role("button", name="Skip all matching…").click()
    confirm(page)
    page.wait_for_selector("#notice:has-text('Skip: 0 changed')")


def test_events_are_found_by_json_path_key_topic_and_time(ctx):
    page, console, ids = ctx["page"], ctx["ops"], ctx["ids"]
    window = [urllib.parse.quote(t) for t in sql("SELECT (now() - interval '1 hour')::text, (now() + interval '1 hour')::text")[0]]
    for query, expected in [("path=" + "%24.order%20%3F%20(%40%20%3D%3D%203)", {ids[3]}), ("key=customer-1", {ids[1], ids[4]}),
                            ("topic=mail.*", set(r[0] for r in sql("SELECT id FROM outbox.outbox WHERE topic = 'mail.welcome'"))),
                            ("endpoint=billing&since=2000-01-01&until=2000-01-02", set()),
                            ("endpoint=billing&since=" + window[0] + "&until=" + window[1], set(ids))]:
        page.goto(console.base + "#/events?" + query)
        page.wait_for_function("q => document.querySelector('#events #count') && document.querySelector('#events').dataset.query === q",
                               arg=query)
        shown = {int(e) for e in page.locator("#events tbody tr").evaluate_all("rows => rows.map(r => r.dataset.event)")}
        check(shown == expected, f"{query}: shown {shown}, expected {expected}")
    page.goto(console.base + "#/events?path=%24%24%24")
    page.wait_for_selector("main p.bad")
    check("syntax error" in page.locator("main p.bad").inner_text(), "a bad JSON path is refused with the database's reason")


# Headless Chromium shows every tab, so hiding one is done as the browser would: document.hidden
# turns true and visibilitychange fires. The page's clock is Playwright's, moved on at will.
HIDE_TAB = """hidden => {
    Object.defineProperty(document, "hidden", { configurable: true, get: () => hidden });
    Object.defineProperty(document, "visibilityState", { configurable: true, get: () => hidden ? "hidden" : "visible" });
    document.dispatchEvent(new Event("visibilitychange"));
}"""
COUNT_OVERVIEW_READS = """window.overviewReads = 0;
const fetchFirst = window.fetch;
window.fetch = (path, ...rest) => {
    if (String(path).endsWith("api/endpoints")) window.overviewReads += 1;
    return fetchFirst(path, ...rest);
};"""


def test_the_overview_refreshes_every_five_seconds_and_not_while_the_tab_is_hidden(ctx):
    page = ctx["browser"].new_page()
    try:
        page.clock.install()
        page.add_init_script(COUNT_OVERVIEW_READS)
        page.goto(ctx["ops"].base + "#/overview")
        page.wait_for_selector("#overview")
        reads = lambda: page.evaluate("window.overviewReads")

        def next_read_after(count):  # moves the page's clock on until the overview asks again
            deadline = time.monotonic() + 30
            while reads() <= count:
                check(time.monotonic() < deadline, "the overview did not ask again")
                page.clock.run_for(500)
            return reads()

        next_read_after(reads())
        page.evaluate(HIDE_TAB, True)
        hidden_at = reads()
        page.clock.run_for(60_000)
        check(reads() == hidden_at, f"a hidden tab asked {reads() - hidden_at} times in a minute")
        page.evaluate(HIDE_TAB, False)
        check(reads() == hidden_at + 1, "showing the tab again refreshes the overview at once")
        next_read_after(hidden_at + 1)
    finally:
        page.close()


def test_counts_are_exact_up_to_ten_thousand_and_marked_as_an_estimate_beyond(ctx):
    page, console = ctx["page"], ctx["ops"]
    sql("""SELECT outbox.outbox_endpoint_set('archive', 'http://127.0.0.1:9/', '{archive.*}');
           WITH events AS (INSERT INTO outbox.outbox (topic, payload) SELECT 'archive.row', '{}' FROM generate_series(1, 10050) RETURNING id)
           INSERT INTO outbox.outbox_deliveries (event_id, endpoint, sent_at) SELECT id, 'archive', now() FROM events""")
    sql("ANALYZE outbox.outbox, outbox.outbox_deliveries")
    try:
        status, counted = console.request("api/count?endpoint=archive")
        check(status == 200 and counted["more"] and counted["count"] == 10000 and counted["estimate"] >= 10000,
              f"beyond 10,000: a bound and the planner's estimate, not {counted}")
        check(console.request("api/count/exact?endpoint=archive")[1] == {"count": 10050, "more": False}, "the exact count is exact")
        check(console.request("api/count?endpoint=billing")[1]["more"] is False, "below the cap the count is exact")
        newest = sql("SELECT max(event_id) FROM outbox.outbox_deliveries WHERE endpoint = 'archive'")[0][0]
        page.goto(console.base + "#/events?endpoint=archive")
        page.wait_for_selector("#count:has-text('the planner')")
        page.wait_for_selector(f"#events tbody tr[data-event='{newest}']")
        page.locator("#next").click()
        # The first page's rows stay until the second's replace them.
        page.locator(f"#events tbody tr[data-event='{newest}']").wait_for(state="detached")
        first = int(page.locator("#events tbody tr").first.get_attribute("data-event"))
        check(first == newest - 50, f"the second page starts after the first 50 ({first}, newest {newest})")
    finally:
        sql("SELECT outbox.outbox_endpoint_drop('archive')")


def test_an_operator_creates_edits_disables_enables_replays_and_drops_an_endpoint(ctx):
    page, console, receiver = ctx["page"], ctx["ops"], ctx["receiver"]
    page.goto(console.base + "#/endpoints")
    form = page.locator("#endpoints > form.endpoint-form")
    form.locator("input[name=name]").fill("crm")
    form.locator("input[name=url]").fill(receiver.url)
    form.locator("input[name=topics]").fill("order.*")
    form.locator("input[name=max_attempts]").fill("4")
    form.get_by_role("button", name="Create").click()
    page.wait_for_selector("#notice:has-text('Endpoint crm saved')")
    check(sql("SELECT topics, max_attempts FROM outbox.outbox_endpoints WHERE name = 'crm'") == [(["order.*"], 4)], "crm was created")
    bad = page.locator("#endpoints > form.endpoint-form")
    bad.locator("input[name=name]").fill("broken")
    bad.locator("input[name=url]").fill("ftp://127.0.0.1/")
    bad.get_by_role("button", name="Create").click()
    page.wait_for_selector("#notice.error")
    check(sql("SELECT count(*) FROM outbox.outbox_endpoints WHERE name = 'broken'")[0][0] == 0, "a bad URL creates nothing")

    card = page.locator("#endpoints .card[data-endpoint='crm']")
    card.get_by_role("button", name="Disable").click()
    page.wait_for_selector("#endpoints .card[data-endpoint='crm'] [data-field='disabled']")
    check(sql("SELECT disabled_at IS NOT NULL FROM outbox.outbox_endpoints WHERE name = 'crm'")[0][0], "crm was disabled")
    page.locator("#endpoints .card[data-endpoint='crm']").get_by_role("button", name="Enable").click()
    page.wait_for_selector("#notice:has-text('crm enabled')")
    check(sql("SELECT disabled_at IS NULL FROM outbox.outbox_endpoints WHERE name = 'crm'")[0][0], "crm was enabled")

    replay = page.locator("#endpoints .card[data-endpoint='crm'] form")
    replay.locator("input[name=since]").fill("2000-01-01")
    replay.get_by_role("button", name="Replay").click()
    page.wait_for_selector("#notice:has-text('6 deliveries to crm')")
    page.locator("#endpoints .card[data-endpoint='crm']").get_by_role("button", name="Drop").click()
    confirm(page)
    page.wait_for_selector("#notice:has-text('crm dropped')")
    check(sql("SELECT count(*) FROM outbox.outbox_endpoints WHERE name = 'crm'")[0][0] == 0, "crm was dropped")


def test_a_hostile_payload_key_topic_and_answer_stay_inert_text(ctx):
    page, console, ids = ctx["page"], ctx["ops"], ctx["ids"]
    page.goto(console.base + f"#/event/{ids[1]}")
    page.locator("#payload").wait_for()
    shown = page.locator("#payload").inner_text()
    check("<script>window.__pwned = 1</script><img src=x onerror=" in shown, f"the payload is shown as the text it is: {shown}")
    page.goto(console.base + "#/events?key=customer-1")
    page.wait_for_selector("#events tbody tr")
    page.goto(console.base + f"#/event/{ids[2]}")
    page.locator("#payload").wait_for()
    check(page.evaluate("window.__pwned") is None, "no script from the payload or the answer ran")
    check(page.locator("main img, main script, main b").count() == 0, "no element came from a value")


def test_rotating_a_secret_shows_it_once(ctx):
    page, console = ctx["page"], ctx["ops"]
    page.goto(console.base + "#/endpoints")
    card = page.locator("#endpoints .card[data-endpoint='billing']")
    card.get_by_role("button", name="Rotate secret").click()
    confirm(page)
    secret = card.locator("[data-field='secret']")
    secret.wait_for()
    shown = secret.inner_text().strip()
    check(re.fullmatch(r"whsec_[A-Za-z0-9+/]{43}=", shown) is not None, f"a generated secret is shown: {shown!r}")
    stored = sql("SELECT secret FROM outbox.outbox_endpoint_secrets WHERE endpoint = 'billing' ORDER BY generation DESC LIMIT 1")[0][0]
    check(stored == shown, "the secret shown is the one that signs")
    shoot(page, "endpoints")
    page.reload()
    page.locator("#endpoints .card[data-endpoint='billing']").wait_for()
    check(shown not in page.content(), "the secret is never shown again")
    status, _ = console.request("api/endpoints")
    check(status == 200, "the endpoints read")
    check(shown not in json.dumps(console.request("api/endpoints")[1]), "nor is it in any answer")


def test_read_only_flag_and_read_only_roles_show_and_allow_no_action(ctx):
    page = ctx["page"]
    for name, console in [("--read-only", ctx["read_only"]), ("the producer's role", ctx["producer"]),
                          ("the monitor's role", ctx["monitor"])]:
        for view, shown in [("#/overview", "#overview"), ("#/events?state=dead", "#events"), ("#/endpoints", "#endpoints"),
                            ("#/leases", "#leases")]:
            page.goto(console.base + view)
            page.wait_for_selector(shown)
            check(page.locator("main [data-action], main form.endpoint-form").count() == 0, f"{name} shows an action on {view}")
        status, token = console.request("api/session")
        check(status == 200, f"{name}: the session answers")
        headers = {"content-type": "application/json", "x-outbox-console": token["token"]}
        for action in [{"action": "disable", "name": "billing"}, {"action": "requeue", "event_id": ctx["ids"][0], "endpoint": None}]:
            status, body = console.request("api/action", json.dumps(action), headers)
            check(status == 403, f"{name}: {action['action']} was not refused: {status} {body}")
    check(sql("SELECT disabled_at IS NULL FROM outbox.outbox_endpoints WHERE name = 'billing'")[0][0], "nothing was disabled")
    page.goto(ctx["producer"].base + "#/overview")
    page.wait_for_selector("#overview p")
    check("may read none" in page.locator("main").inner_text(), "the producer's console says what it cannot read")


def test_a_consumer_sees_and_acts_only_on_its_own_leases(ctx):
    page, console = ctx["page"], ctx["consumer"]
    page.goto(console.base + "#/leases")
    lease = page.locator("#leases .card[data-endpoint='mailer']")
    lease.wait_for()
    check(page.locator("main [data-action]").count() == 2, "extend and nack, and nothing else")
    shoot(page, "leases")
    lease.get_by_role("button", name="Extend 5 min").click()
    page.wait_for_selector("#notice:has-text('Lease extended')")
    until = sql("SELECT available_at > now() + interval '4 minutes' FROM outbox.outbox_deliveries WHERE endpoint = 'mailer'")[0][0]
    check(until, "the lease was extended")
    page.goto(console.base + "#/endpoints")
    page.wait_for_selector("#endpoints p")
    check(page.locator("main [data-action]").count() == 0, "a consumer manages no endpoint")


def test_a_cross_site_post_is_refused(ctx):
    page, console = ctx["page"], ctx["ops"]
    # A page on another origin posts a form at the console, as an attacker's site would.
    attacker_port = free_port()
    form = f"""<form id=f method=POST action="{console.base}api/action" enctype="text/plain">
      <input name='{{"action":"disable","name":"billing","x":"' value='"}}'></form>
      <script>document.getElementById('f').submit()</script>"""

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(form.encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", attacker_port), Attacker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with page.expect_response(lambda r: r.url.endswith("/api/action")) as answer:
            page.goto(f"http://127.0.0.1:{attacker_port}/")
        check(answer.value.status == 403, f"the cross-site form was answered {answer.value.status}")
        status, _ = console.request("api/action", json.dumps({"action": "disable", "name": "billing"}),
                                    {"content-type": "application/json"})
        check(status == 403, "an action without the page's token is refused")
        check(sql("SELECT disabled_at IS NULL FROM outbox.outbox_endpoints WHERE name = 'billing'")[0][0], "billing is still enabled")
    finally:
        server.shutdown()


def test_every_answer_carries_a_strict_content_security_policy(ctx):
    for path in ["", "console.js", "api/session", "api/nothing"]:
        request = urllib.request.Request(ctx["ops"].base + path)
        try:
            response = urllib.request.urlopen(request, timeout=5)
        except urllib.error.HTTPError as error:
            response = error
        policy = response.headers.get("content-security-policy", "")
        check("script-src 'self'" in policy and "default-src 'none'" in policy and "unsafe" not in policy, f"/{path}: {policy!r}")
        check(response.headers.get("x-content-type-options") == "nosniff", f"/{path} is sniffable")


def test_any_address_but_loopback_needs_authentication_and_credentials_are_checked(ctx):
    refused = subprocess.run([OUTBOX, "console", "--database-url", url("ops"), "--listen", "0.0.0.0:0"], capture_output=True, text=True,
                             timeout=20)
    check(refused.returncode != 0 and "not a loopback address" in refused.stderr, f"0.0.0.0 without credentials: {refused.stderr}")
    port = free_port()
    guarded = Process("console", "--database-url", url("ops"), "--listen", f"127.0.0.1:{port}", env={"OUTBOX_CONSOLE_TOKEN": "t0ken"})
    try:
        def status(headers):
            try:
                return urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/api/session", headers=headers),
                                              timeout=2).status
            except urllib.error.HTTPError as error:
                return error.code
            except (urllib.error.URLError, ConnectionError):
                return None
        wait_until("the guarded console serves", lambda: status({}) is not None)
        check(status({}) == 401, "no token: refused")
        check(status({"authorization": "Bearer wrong"}) == 401, "a wrong token: refused")
        check(status({"authorization": "Bearer t0ken"}) == 200, "the token: served")
    finally:
        guarded.stop()


def test_under_a_prefix_the_console_serves_everything_below_it_and_nothing_else(ctx):
    page = ctx["page"]
    console = Console("ops", prefix="/ops/outbox")
    try:
        page.goto(console.base)
        page.wait_for_selector("#overview tr[data-endpoint='billing']")
        check(console.request("api/session")[0] == 200, "the API is below the prefix")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{console.port}/api/session", timeout=5)
            raise Failed("the API answered outside the prefix")
        except urllib.error.HTTPError as error:
            check(error.code == 404, f"outside the prefix: {error.code}")
    finally:
        console.stop()


TESTS = [value for name, value in list(globals().items()) if name.startswith("test_")]


def main():
    chosen = [t for t in TESTS if not sys.argv[1:] or any(a in t.__name__ for a in sys.argv[1:])]
    if not chosen:
        return
    receiver, relay, ids = prepare()
    consoles = {"ops": Console("ops"), "read_only": Console("ops", "--read-only"), "producer": Console("app_producer"),
                "consumer": Console("app_consumer"), "monitor": Console("monitor")}
    failed = 0
    with sync_playwright() as playwright:
        browser, page = browser_page(playwright)
        ctx = dict(consoles, browser=browser, page=page, receiver=receiver, ids=ids)
        for test in chosen:
            started = time.monotonic()
            try:
                test(ctx)
                print(f"ok   {test.__name__} ({time.monotonic() - started:.1f} s)")
            except Exception as error:  # a failure is reported, and the other tests still run
                failed += 1
                shoot(page, "FAILED-" + test.__name__)
                print(f"FAIL {test.__name__}: {type(error).__name__}: {error}")
        browser.close()
    for console in consoles.values():
        console.stop()
    relay.stop()
    print(f"{len(chosen) - failed} passed, {failed} failed; screenshots in {SHOTS}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
