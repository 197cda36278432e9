#!/usr/bin/env python3
"""Drives the kairos web UI in headless Chromium (Debian's chromium and chromedriver, through
Selenium) against a running cluster (`kairos up`), as its users would: alice logs in with her
token, sees her job listed and an array folded under one row (its tasks' states in words), reads
the story of a training job that an urgent job preempted, cancels from the page, sees elapsed
time and exit codes, is refused bob's job, has no operator actions, and logs out; bob sees no
preemption he had no part in; the admin sees the operator actions.

With --history (against a cluster whose controllers run with a short --job-retention): a job
that finished and left the live state is listed, with its exit code and elapsed time, by the
History page, which sorts by a click on a column's header.

With --screenshots DIR, each view is saved there as PNG.

Prints one line per check and `ok` at the end; exits non-zero at the first failure.
"""

import argparse
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

WAIT_S = 30


def call(url, method, path, token=None, body=None):
    """One JSON API call: (HTTP status, decoded answer)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def ok(url, method, path, token, body=None):
    status, answer = call(url, method, path, token, body)
    if status != 200:
        sys.exit(f"{method} {path}: {status} {answer}")
    return answer


def submit(url, token, name, argv, gpus, qos, requeue=None):
    spec = {"name": name, "argv": argv, "qos": qos, "resources": {"gpus": gpus}}
    if requeue is not None:
        spec["requeue"] = requeue
    return ok(url, "POST", "/api/v1/jobs", token, {"spec": spec})["job_id"]


def state(url, token, job):
    return ok(url, "GET", f"/api/v1/jobs/{job}", token)["state"].replace("JOB_STATE_", "")


def wait(what, check, within=WAIT_S):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    sys.exit(f"timed out waiting for {what}")


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("KAIROS_CHROMIUM", "/usr/bin/chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000", "--force-device-scale-factor=1"):
        options.add_argument(flag)
    service = Service(executable_path=os.environ.get("KAIROS_CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(service=service, options=options)


class Ui:
    def __init__(self, driver, url, shots):
        self.d, self.url, self.shots = driver, url, shots

    def find(self, css, within=WAIT_S):
        try:
            return WebDriverWait(self.d, within, poll_frequency=0.05).until(
                lambda d: d.find_element(By.CSS_SELECTOR, css))
        except TimeoutException:
            sys.exit(f"no element {css} on {self.d.current_url}:\n{self.text('main')}")

    def click(self, css):
        """Clicks the element, found again if a redraw replaced it in between."""
        for _ in range(50):
            try:
                self.find(css).click()
                return
            except StaleElementReferenceException:
                time.sleep(0.05)
        sys.exit(f"{css} kept being redrawn under the click")

    def text(self, css):
        # Read in the page in one step: the views redraw while they are read.
        return self.d.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css)

    def until_text(self, css, *wanted, within=WAIT_S):
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            t = self.text(css)
            if all(w in t for w in wanted):
                return t
            time.sleep(0.05)
        sys.exit(f"{css} never showed {wanted}; it shows:\n{self.text(css)}")

    def go(self, hash_):
        self.d.get(f"{self.url}/#{hash_}")

    def login(self, token):
        self.d.get(f"{self.url}/")
        field = self.find("#token")
        words = self.text("#login-form")
        if "`" in words or "kairos token create --user NAME" not in words:
            sys.exit(f"the login page reads: {words!r}")
        field.send_keys(token)
        field.send_keys(Keys.ENTER)  # the keyboard alone logs in
        self.find("#jobs")

    def shot(self, name):
        if self.shots:
            time.sleep(0.5)
            self.d.save_screenshot(os.path.join(self.shots, f"{name}.png"))

    def fetch_status(self, path):
        """The HTTP status of a GET the page itself makes (with its cookies)."""
        return self.d.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {credentials: 'same-origin'}).then(r => done(r.status), e => done(String(e)));",
            path)


CLOCK = re.compile(r"^(\d+-)?\d\d:\d\d:\d\d$")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--admin-token-file", required=True)
    p.add_argument("--screenshots")
    p.add_argument("--history", action="store_true",
                   help="check the History page (the controllers run with a short --job-retention)")
    a = p.parse_args()
    url = a.url.rstrip("/")
    admin = open(a.admin_token_file).read().strip()
    alice = ok(url, "POST", "/api/v1/tokens", admin, {"user": "alice", "role": "user"})["token"]
    bob = ok(url, "POST", "/api/v1/tokens", admin, {"user": "bob", "role": "user"})["token"]
    if a.screenshots:
        os.makedirs(a.screenshots, exist_ok=True)
    if a.history:
        history(url, alice, bob, a.screenshots)
    else:
        everyday(url, admin, alice, bob, a.screenshots)
    print("ok")


def everyday(url, admin, alice, bob, shots):

    # bob holds one GPU; alice trains on the other seven, printing a step every 0.2 s.
    bobs = submit(url, bob, "bob-notebook", ["sleep", "600"], 1, "batch")
    loop = "i=0; while true; do i=$((i+1)); echo step $i; sleep 0.2; done"
    train = submit(url, alice, "train-llm", ["sh", "-c", loop], 7, "training", requeue=True)
    wait("the training job to run", lambda: state(url, alice, train) == "RUNNING")

    urgent = sweep = 0
    d = browser()
    try:
        ui = Ui(d, url, shots)
        ui.login(alice)
        ui.until_text("#who", "alice (user)")
        print("alice logs in with her token (the login page shows the command, no backticks)")

        # A job submitted now is in the table within 2 s.
        t0 = time.monotonic()
        fresh = submit(url, alice, "eval-fresh", ["sleep", "1"], 1, "batch")
        ui.find(f'#jobs-body tr[data-job="{fresh}"]', within=5)
        took = time.monotonic() - t0
        if took > 2.0:
            sys.exit(f"the jobs table listed job {fresh} after {took:.2f} s, more than 2 s")
        print(f"the jobs table lists a submitted job within 2 s ({took:.2f} s)")
        # An array's tasks are folded under one row until it is opened.
        spec = {"name": "sweep", "argv": ["sleep", "600"], "qos": "batch", "array_indices": [0, 1, 2],
                "resources": {"gpus": 1}}
        sweep = ok(url, "POST", "/api/v1/jobs", alice, {"spec": spec})["job_id"]
        ui.until_text("#jobs-body button.fold", "[3 tasks]")
        if d.find_elements(By.CSS_SELECTOR, "#jobs-body tr.task"):
            sys.exit(f"the array is not folded: {ui.text('#jobs-body')}")
        # The folded row's State cell counts the tasks by state, in words.
        words = ui.until_text("#jobs-body tr.array td.array-states", "PENDING")
        row = ui.text("#jobs-body tr.array")
        if "[object" in row or not re.fullmatch(r"[A-Z_]+ \d+(, [A-Z_]+ \d+)*", words.strip()) \
                or sum(int(n) for n in re.findall(r"\d+", words)) != 3:
            sys.exit(f"the folded array's state cell reads {words!r} (row: {row!r})")
        print(f"the folded array's row shows its tasks' states in words: {words.strip()}")
        ui.click("#jobs-body button.fold")
        wait("the array's tasks", lambda: len(d.find_elements(By.CSS_SELECTOR, "#jobs-body tr.task")) == 3)
        print("an array's tasks fold under one row and open on a click")
        if d.find_elements(By.CSS_SELECTOR, f'#jobs-body tr[data-job="{bobs}"]') or "bob" in ui.text("#jobs"):
            sys.exit("alice's jobs table lists bob's job")

        # An urgent job (the admin's: users may not use that QoS) preempts the training job, which
        # is requeued and runs again once the urgent one is done.
        urgent = submit(url, admin, "urgent-infer", ["sh", "-c", "echo serving; sleep 4"], 7, "urgent")
        wait("the urgent job to run", lambda: state(url, admin, urgent) == "RUNNING")
        ui.go("/jobs")
        ui.until_text("#jobs-body", "train-llm")
        ui.go(f"/jobs/{train}")
        ui.until_text("#timeline", "submitted", "started", "preempted", f"by job {urgent}")
        ui.until_text("#log", "step 1")
        print(f"job {train}'s page shows its preemption by job {urgent} and its log tail")
        wait("the training job to run again", lambda: state(url, alice, train) == "RUNNING")
        ui.until_text("#timeline", "requeued")
        ui.until_text("#job", "RUNNING")
        ui.shot("job")
        # In the jobs table the running job's elapsed time moves with the clock.
        ui.go("/jobs")
        cell = f'#jobs-body tr[data-job="{train}"] td.elapsed'
        first = wait("an elapsed time", lambda: CLOCK.match(ui.text(cell)) and ui.text(cell))
        wait("the elapsed time to move", lambda: CLOCK.match(ui.text(cell)) and ui.text(cell) != first, within=5)
        left = ui.text(f'#jobs-body tr[data-job="{train}"] td.left')
        if not (CLOCK.match(left) or left == "no limit"):
            sys.exit(f"job {train}'s time left reads {left!r}")
        print(f"the jobs table shows a running job's elapsed time ({first}, moving) and time left ({left})")
        ui.go(f"/jobs/{train}")
        ui.find("#cancel-button")

        # Cancel from the page ends the running job CANCELLED.
        ui.click("#cancel-button")
        wait("the training job to be CANCELLED", lambda: state(url, alice, train) == "CANCELLED")
        ui.until_text("#job", "CANCELLED")
        print(f"cancel from job {train}'s page ends it CANCELLED")
        wait("the first eval job to complete", lambda: state(url, alice, fresh) == "COMPLETED")
        ui.go("/jobs?state=all")
        ui.find(f'#jobs-body tr[data-job="{train}"]')
        done = f'#jobs-body tr[data-job="{fresh}"]'
        ui.until_text(f"{done} td.exit", "0")
        took = ui.text(f"{done} td.elapsed")
        if ui.text(f"{done} td.exit").strip() != "0" or not CLOCK.match(took) or ui.text(f"{done} td.left"):
            sys.exit(f"job {fresh}'s row reads {ui.text(done)!r}")
        ui.until_text("#jobs-body tr.array td.array-states", "RUNNING")
        if "[object" in ui.text("#jobs"):
            sys.exit(f"the jobs table shows {ui.text('#jobs')!r}")
        print(f"a finished job's row shows its exit code (0) and elapsed time ({took}), no time left")
        ui.shot("jobs")

        # bob's job is not alice's to see.
        ui.go(f"/jobs/{bobs}")
        ui.until_text("h1", "403")
        if "bob-notebook" in ui.text("main"):
            sys.exit("the 403 page shows bob's job")
        print("alice gets a 403 page for bob's job")

        ui.go("/nodes")
        ui.find(".gpu.allocated")
        if d.find_elements(By.CSS_SELECTOR, ".admin-action"):
            sys.exit("a user sees operator actions")
        print("the GPU grid shows allocated GPUs, and no operator action to a user")
        ui.shot("gpus")

        ui.go("/policy")
        ui.until_text("#qos-table", "training", "urgent")
        ui.until_text("#preemptions-table", str(train), str(urgent))
        ui.shot("policy")
        print("the queue and policy view shows QoS usage and the preemption")

        # bob had no part in alice's preemption: neither the API (the method `kairos preemptions`
        # calls) nor his page shows it to him, only those of his own job (if the urgent job took
        # its GPU too); alice and the admin see it.
        for who, token, sees in (("bob", bob, False), ("alice", alice, True), ("admin", admin, True)):
            listed = ok(url, "GET", "/api/v1/preemptions", token)["preemptions"]
            if any(p["victim"] == train for p in listed) != sees:
                sys.exit(f"{who} is listed the preemptions {listed}")
        bobs_own = [p for p in ok(url, "GET", "/api/v1/preemptions", admin)["preemptions"]
                    if bobs in (p["preemptor"], p["victim"])]
        ui.click("#logout")
        ui.login(bob)
        ui.go("/policy")
        ui.until_text("#policy", "Recent preemptions of your jobs")
        if bobs_own:
            ui.find("#preemptions-table")
        else:
            ui.until_text("#policy", "None recently.")
        pairs = d.execute_script(
            "return [...document.querySelectorAll('#preemptions-table tbody tr')]"
            ".map(r => [...r.querySelectorAll('td')].slice(1, 3).map(td => Number(td.innerText)));")
        if len(pairs) != len(bobs_own) or any(bobs not in pair for pair in pairs):
            sys.exit(f"bob's page lists the preemptions (preemptor, victim) {pairs}; his job {bobs} took part in {bobs_own}")
        print(f"bob sees no preemption of other users' jobs (the API and his page: {len(pairs)} of his own), "
              "alice and the admin do")

        ui.click("#logout")
        ui.find("#token")
        cookies = {c["name"] for c in d.get_cookies()}
        if "kairos_session" in cookies:
            sys.exit(f"the session cookie outlived the logout: {cookies}")
        status = ui.fetch_status("/api/v1/whoami")
        if status != 401:
            sys.exit(f"after logout the page's call answered {status}, not 401")
        print("logout clears the session cookie (the API then answers 401)")

        ui.login(admin)
        ui.go("/nodes")
        ui.find(".admin-action")
        print("the admin sees the operator actions")

        # A topology placing the node in rack r7: the grid groups it under its rack.
        node = ok(url, "GET", "/api/v1/nodes", admin)["nodes"][0]["name"]
        topology = {"levels": ["rack"], "nodes": [{"node": node, "domains": {"rack": "r7"}}]}
        ok(url, "PUT", "/api/v1/topology", admin, topology)
        ui.go("/nodes")
        ui.until_text("#nodes", "rack r7 — ")
        print("the GPU grid groups nodes under their rack")
        ok(url, "PUT", "/api/v1/topology", admin, {"levels": []})

        # A job that waits behind bob's (its QoS's wall clock is its time limit) has an expected
        # start, in the jobs table and on its page, with why then.
        behind = submit(url, admin, "behind", ["sleep", "1"], 8, "batch")
        ui.go("/jobs")
        cell = f'#jobs-body tr[data-job="{behind}"] td.expected-start'
        wait("an expected start", lambda: ui.text(cell).strip() not in ("", "–") and ui.text(cell))
        ui.go(f"/jobs/{behind}")
        reason = ui.until_text("#expected-start", "Expected start:", "ends (time limit)")
        print(f"a pending job shows its expected start and why ({reason.strip()})")
        call(url, "POST", f"/api/v1/jobs/{behind}/cancel", admin, {})

        # A maintenance reservation open on the node shows it as MAINT in the grid.
        now_ms = int(time.time() * 1000)
        maint = {"name": "ui-maint", "nodes": [node], "start_ms": now_ms + 500, "end_ms": now_ms + 120_000,
                 "maint": True, "ignore_jobs": True}
        ok(url, "PUT", "/api/v1/reservations/ui-maint", admin, {"reservation": maint})
        ui.go("/nodes")
        ui.until_text(f'section[data-node="{node}"] h2', "MAINT")
        ui.until_text(f'section[data-node="{node}"] .gpus', "maintenance (ui-maint)")
        print("a node held by an open maintenance reservation shows MAINT in the GPU grid")
        ok(url, "DELETE", "/api/v1/reservations/ui-maint", admin)
    finally:
        d.quit()
        for job in (train, bobs, urgent, sweep):
            call(url, "POST", f"/api/v1/jobs/{job}/cancel", admin, {})


def listed_live(url, token, job):
    return any(j["id"] == job for j in ok(url, "GET", "/api/v1/jobs?all=true&limit=1000", token)["jobs"])


def history(url, alice, bob, shots):
    """Jobs that ended and left the live state are on the History page, sortable."""
    fails = submit(url, alice, "ends-badly", ["sh", "-c", "sleep 1; exit 3"], 1, "batch")
    works = submit(url, alice, "ends-well", ["sh", "-c", "sleep 2"], 1, "batch")
    bobs = submit(url, bob, "bobs-own", ["true"], 1, "batch")
    for job in (fails, works):
        wait(f"job {job} to leave the live state", lambda: not listed_live(url, alice, job))
    records = {r["id"]: r for r in ok(url, "GET", "/api/v1/history", alice)["records"]}
    if not (records.get(fails, {}).get("purged") and records.get(works, {}).get("purged")):
        sys.exit(f"the history does not hold both purged jobs: {records}")
    print(f"jobs {fails} and {works} ended and left the live state (the Jobs view no longer lists them)")

    d = browser()
    try:
        ui = Ui(d, url, shots)
        ui.login(alice)
        ui.go("/jobs?state=all")
        ui.until_text("#jobs-status", "updated")
        if d.find_elements(By.CSS_SELECTOR, f'#jobs-body tr[data-job="{fails}"]'):
            sys.exit(f"job {fails} is still in the jobs table")
        ui.click('nav a[data-view="history"]')
        row = f'#history-body tr[data-job="{fails}"]'
        ui.until_text(row, "ends-badly", "FAILED")
        cells = {c: ui.text(f'{row} td[data-col="{c}"]').strip() for c in ("Exit code", "Elapsed", "State")}
        if cells["Exit code"] != "3" or not CLOCK.match(cells["Elapsed"]):
            sys.exit(f"job {fails}'s history row reads {cells}")
        ui.until_text(f'#history-body tr[data-job="{works}"]', "ends-well", "COMPLETED")
        if d.find_elements(By.CSS_SELECTOR, f'#history-body tr[data-job="{bobs}"]') or "bobs-own" in ui.text("#history"):
            sys.exit("alice's history lists bob's job")
        print(f"the History page lists job {fails} finished before the retention window: FAILED, exit code 3, "
              f"elapsed {cells['Elapsed']}; and not bob's job")

        def order():
            return d.execute_script(
                "return [...document.querySelectorAll('#history-body tr')].map(r => Number(r.dataset.job));")

        def sorted_by(col, desc):
            """Clicks the column's header (once, or twice to sort the other way) until it sorts so."""
            want = "descending" if desc else "ascending"
            th = f'#history thead th:has(button[data-col="{col}"])'
            for _ in range(2):
                ui.click(f'#history thead button[data-col="{col}"]')
                if d.find_element(By.CSS_SELECTOR, th).get_attribute("aria-sort") == want:
                    return order()
            sys.exit(f"two clicks on {col} did not sort it {want}: {ui.text('#history thead')}")

        up = sorted_by("Exit code", False)
        down = sorted_by("Exit code", True)
        if not (up.index(works) < up.index(fails) and down.index(fails) < down.index(works)):
            sys.exit(f"sorting by exit code: ascending {up}, descending {down}")
        up = sorted_by("Elapsed", False)
        if not up.index(fails) < up.index(works):
            sys.exit(f"sorting by elapsed (job {fails} ran ~1 s, {works} ~2 s): {up}")
        print("a click on a column's header sorts the History page (exit code both ways, elapsed)")
        newest = sorted_by("Ended", True)
        if newest.index(works) > newest.index(fails):
            sys.exit(f"sorting by end, newest first: {newest}")
        ui.shot("history")
    finally:
        d.quit()


if __name__ == "__main__":
    main()
