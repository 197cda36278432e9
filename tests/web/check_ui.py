#!/usr/bin/env python3
"""Drives the kairos web UI in headless Chromium (Debian's chromium and chromedriver, through
Selenium) against a running cluster (`kairos up`), as its users would: alice logs in with her
token, sees her job listed, reads the story of a training job that an urgent job preempted,
cancels from the page, is refused bob's job, has no operator actions, and logs out; the admin
sees the operator actions. With --screenshots DIR, each view is saved there as PNG.

Prints one line per check and `ok` at the end; exits non-zero at the first failure.
"""

import argparse
import json
import os
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--admin-token-file", required=True)
    p.add_argument("--screenshots")
    a = p.parse_args()
    url = a.url.rstrip("/")
    admin = open(a.admin_token_file).read().strip()
    alice = ok(url, "POST", "/api/v1/tokens", admin, {"user": "alice", "role": "user"})["token"]
    bob = ok(url, "POST", "/api/v1/tokens", admin, {"user": "bob", "role": "user"})["token"]
    if a.screenshots:
        os.makedirs(a.screenshots, exist_ok=True)

    # bob holds one GPU; alice trains on the other seven, printing a step every 0.2 s.
    bobs = submit(url, bob, "bob-notebook", ["sleep", "600"], 1, "batch")
    loop = "i=0; while true; do i=$((i+1)); echo step $i; sleep 0.2; done"
    train = submit(url, alice, "train-llm", ["sh", "-c", loop], 7, "training", requeue=True)
    wait("the training job to run", lambda: state(url, alice, train) == "RUNNING")

    urgent = sweep = 0
    d = browser()
    try:
        ui = Ui(d, url, a.screenshots)
        ui.login(alice)
        ui.until_text("#who", "alice (user)")
        print("alice logs in with her token")

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

        # Cancel from the page ends the running job CANCELLED.
        ui.click("#cancel-button")
        wait("the training job to be CANCELLED", lambda: state(url, alice, train) == "CANCELLED")
        ui.until_text("#job", "CANCELLED")
        print(f"cancel from job {train}'s page ends it CANCELLED")
        ui.go("/jobs?state=all")
        ui.find(f'#jobs-body tr[data-job="{train}"]')
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
    finally:
        d.quit()
        for job in (train, bobs, urgent, sweep):
            call(url, "POST", f"/api/v1/jobs/{job}/cancel", admin, {})
    print("ok")


if __name__ == "__main__":
    main()
