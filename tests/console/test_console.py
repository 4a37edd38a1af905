"""The web console (`/ui`) in a real browser: headless Chromium driven by
Selenium, against real 3-member raftlock clusters (the Python client's test
harness starts them). Each test writes screenshots of the pages it visits to
$CONSOLE_SCREENSHOTS (default target/console-screenshots).

Locks are taken as users take them: `raftlockctl lock NAME -- CMD` holds a
lock while CMD runs. Auth is set up with etcdctl, as an operator would.
Run through scripts/test-console.sh, which installs what this needs."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python" / "tests"))
from conftest import Cluster  # noqa: E402  (the Python client's harness)

import raftlock  # noqa: E402

CTL = os.environ.get("RAFTLOCKCTL_BIN", str(ROOT / "target" / "debug" / "raftlockctl"))
SHOTS = pathlib.Path(os.environ.get("CONSOLE_SCREENSHOTS", str(ROOT / "target" / "console-screenshots")))


@pytest.fixture
def browser():
    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1360,900", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    driver = webdriver.Chrome(service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def cluster(tmp_path: pathlib.Path):
    c = Cluster(tmp_path)
    yield c
    c.stop()


def shot(driver, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def wait(driver, what, seconds: float = 5.0, why: str = ""):
    """`what(driver)` once it is true. Pages redraw their rows as the
    cluster changes, so an element found a moment ago may be gone: such a
    look simply counts as not yet."""
    ignored = (StaleElementReferenceException, IndexError)
    return WebDriverWait(driver, seconds, poll_frequency=0.05, ignored_exceptions=ignored).until(what, message=why)


def click(driver, selector: str, label: str, why: str) -> None:
    """Click the button `label` in the element at `selector`, as soon as it is there."""
    def found(d):
        buttons = [b for r in rows(d, selector) for b in r.find_elements(By.TAG_NAME, "button") if b.text == label]
        if buttons:
            buttons[0].click()
        return bool(buttons)
    wait(driver, found, 5, why)


def rows(driver, selector: str):
    return driver.find_elements(By.CSS_SELECTOR, selector)


def hold(endpoints, name: str, *extra: str) -> subprocess.Popen:
    """`raftlockctl lock NAME -- sleep 600`: holds (or waits for) the lock."""
    return subprocess.Popen([CTL, "--endpoints", ",".join(endpoints), *extra, "lock", name, "--", "sleep", "600"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def owners(client, name: str):
    d = client.describe(name)
    return list(d.holders), list(d.waiters)


def until(check, seconds: float, why: str):
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


def test_pages_follow_locks_waiters_revocations_and_a_new_leader(cluster: Cluster, browser):
    client = raftlock.Client(cluster.endpoints)
    ui = lambda i: f"http://{cluster.endpoints[i]}/ui/"  # noqa: E731

    browser.get(ui(0) + "#/cluster")
    members = wait(browser, lambda d: len(rows(d, "tr[data-member]")) == 3 and rows(d, "tr[data-member]"), 10,
                   "the cluster page never showed three members")
    leaders = wait(browser, lambda d: rows(d, "tr[data-role=leader]"), 5, "no leader shown")
    assert len(leaders) == 1
    leader_name = leaders[0].get_attribute("data-member")
    assert {r.get_attribute("data-member") for r in members} == {"m0", "m1", "m2"}
    shot(browser, "cluster")

    # The console of a member that is not the leader, so it outlives the kill.
    served = next(i for i in range(3) if f"m{i}" != leader_name)
    browser.get(ui(served) + "#/locks")
    wait(browser, lambda d: d.find_elements(By.ID, "prefix"), 5, "the locks page never drew")

    holder = hold(cluster.endpoints, "jobs/nightly")
    waiter = None
    try:
        held = until(lambda: owners(client, "jobs/nightly")[0], 10, "raftlockctl never held the lock")
        holder_key = held[0].key.decode()
        token = str(held[0].token)
        started = time.monotonic()
        shown = f"token {token} lease"
        wait(browser, lambda d: shown in "".join(r.text for r in rows(d, 'tr[data-lock="jobs/nightly"]')), 2,
             "the held lock and its token did not show within 2 s")
        assert time.monotonic() - started < 2.0

        waiter = hold(cluster.endpoints, "jobs/nightly")
        waiting = until(lambda: owners(client, "jobs/nightly")[1], 10, "the second raftlockctl never waited")
        waiter_key = waiting[0].key.decode()
        wait(browser, lambda d: ["1"] == [c.text for c in rows(d, 'tr[data-lock="jobs/nightly"] td.num')], 2,
             "the list did not count the waiter")
        shot(browser, "locks")

        browser.get(ui(served) + "#/lock/jobs%2Fnightly")
        wait(browser, lambda d: rows(d, f'table[aria-label=Waiters] tr[data-key="{waiter_key}"]'), 3,
             "the waiter did not show in the queue")
        # Its history: both places' arrival, replayed from before the page opened.
        events = 'table[aria-label=Events] tr'
        wait(browser, lambda d: any(waiter_key in r.text and "queued" in r.text for r in rows(d, events)), 3,
             "the waiter's arrival is not in the lock's events")
        assert any(holder_key in r.text and "granted" in r.text for r in rows(browser, events))
        shot(browser, "lock")
        # Revoke the holder's lease from the page: the waiter becomes the holder.
        click(browser, f'table[aria-label=Holders] tr[data-key="{holder_key}"]', "Revoke lease", "no revoke button")
        wait(browser, lambda d: d.find_element(By.ID, "confirm").is_displayed(), 2, "no confirmation asked")
        browser.find_element(By.ID, "confirm-ok").click()
        wait(browser, lambda d: rows(d, f'table[aria-label=Holders] tr[data-key="{waiter_key}"]'), 5,
             "the waiter never showed as the holder")
        assert not rows(browser, f'tr[data-key="{holder_key}"]')
        assert until(lambda: [h for h in owners(client, "jobs/nightly")[0] if h.key.decode() == waiter_key], 5,
                     "the server does not have the waiter holding")

        # A long queue's waiters come a page of 100 at a time: 105 keys put
        # under the lock's name on one lease, the first holds, 104 wait.
        queue_lease = client.lease_grant(600)
        for i in range(105):
            client.put(f"jobs/paged/{i:03}".encode(), b"", lease=queue_lease)
        browser.get(ui(served) + "#/lock/jobs%2Fpaged")
        waiting = "table[aria-label=Waiters] tr[data-key]"
        first_page = lambda d: [r.get_attribute("data-key") for r in rows(d, waiting)][:1] == ["jobs/paged/001"] \
            and len(rows(d, waiting)) == 100  # noqa: E731
        wait(browser, first_page, 5, "the first page did not show the first 100 waiters")
        click(browser, "main .pager", "Next page", "no next page of waiters")
        wait(browser, lambda d: [r.get_attribute("data-key") for r in rows(d, waiting)]
             == [f"jobs/paged/{i:03}" for i in range(101, 105)], 5, "the second page is not the last four waiters")
        click(browser, "main .pager", "Previous page", "no way back to the first page of waiters")
        wait(browser, first_page, 5, "the first page did not come back")
        client.lease_revoke(queue_lease)

        # The leases page is live: a lease granted elsewhere shows, with
        # its key, and goes when it is revoked.
        browser.get(ui(served) + "#/leases")
        wait(browser, lambda d: rows(d, "tr[data-lease]"), 5, "the leases page shows no lease")
        lease = etcdctl(cluster, "lease", "grant", "600").split()[1]
        etcdctl(cluster, "put", "--lease", lease, "leased/key", "v")
        started = time.monotonic()
        wait(browser, lambda d: "leased/key" in "".join(r.text for r in rows(d, f'tr[data-lease="{lease}"]')), 2.5,
             "a new lease and its key did not show within 2.5 s")
        assert time.monotonic() - started < 2.5
        etcdctl(cluster, "lease", "revoke", lease)
        wait(browser, lambda d: not rows(d, f'tr[data-lease="{lease}"]'), 2.5, "a revoked lease stayed on the page")

        for page in ("locks", "leases", "elections", "keys"):
            browser.get(ui(served) + f"#/{page}")
            time.sleep(1.0)
            assert not rows(browser, "p.error"), f"the {page} page shows an error"
            shown = browser.find_element(By.TAG_NAME, "main").text.split()
            assert "null" not in shown and "undefined" not in shown and "nullnull" not in shown, \
                f"the {page} page shows a missing value: {shown}"
            shot(browser, page)

        # Kill the leader: the page shows it down and another member leading.
        browser.get(ui(served) + "#/cluster")
        wait(browser, lambda d: rows(d, "tr[data-role=leader]"), 5, "no leader shown")
        cluster.kill(int(leader_name[1:]))
        killed = time.monotonic()
        wait(browser, lambda d: rows(d, f'tr.down[data-member="{leader_name}"]'), 2.0,
             "the killed leader did not turn red within two seconds")
        assert time.monotonic() - killed < 2.0
        new = wait(browser, lambda d: [r for r in rows(d, "tr[data-role=leader]")
                                       if r.get_attribute("data-member") != leader_name], 15,
                   "no new leader shown")
        assert len(new) == 1
        shot(browser, "cluster-new-leader")
    finally:
        for p in (holder, waiter):
            if p is not None:
                p.kill()
                p.wait()
        client.close()


def etcdctl(cluster: Cluster, *args: str) -> str:
    """Run etcdctl against the cluster; what it printed."""
    return subprocess.run(["etcdctl", "--endpoints", ",".join(cluster.endpoints), *args], check=True,
                          env={**os.environ, "ETCDCTL_API": "3"}, stdout=subprocess.PIPE, text=True).stdout


def sign_in(browser, user: str, password: str) -> None:
    wait(browser, lambda d: d.find_elements(By.ID, "login-user"), 5, "no sign-in form")
    browser.find_element(By.ID, "login-user").send_keys(user)
    browser.find_element(By.ID, "login-password").send_keys(password)
    browser.find_element(By.ID, "login-submit").click()


def test_with_auth_on_visitors_sign_in_and_a_reader_gets_no_actions(cluster: Cluster, browser):
    etcdctl(cluster, "user", "add", "root:rootpw")
    etcdctl(cluster, "role", "add", "reader")
    etcdctl(cluster, "role", "grant-permission", "reader", "read", "", "--from-key")
    etcdctl(cluster, "user", "add", "alice:alicepw")
    etcdctl(cluster, "user", "grant-role", "alice", "reader")
    etcdctl(cluster, "user", "add", "bob:bobpw")
    etcdctl(cluster, "auth", "enable")
    holder = hold(cluster.endpoints, "shared/report", "--user", "root:rootpw")
    try:
        ui = f"http://{cluster.endpoints[1]}/ui/#/locks"
        browser.get(ui)
        # Anonymous: the sign-in form, and no data.
        wait(browser, lambda d: d.find_elements(By.ID, "login-user"), 5, "an anonymous visitor saw no sign-in form")
        assert not rows(browser, "tr[data-lock]")
        shot(browser, "sign-in")
        sign_in(browser, "alice", "wrong")
        wait(browser, lambda d: "authentication failed" in "".join(e.text for e in rows(d, "[role=alert]")), 5,
             "a wrong password was not refused")
        browser.find_element(By.ID, "login-user").clear()
        sign_in(browser, "alice", "alicepw")
        wait(browser, lambda d: rows(d, 'tr[data-lock="shared/report"]'), 5, "the reader does not see the lock")
        browser.get(f"http://{cluster.endpoints[1]}/ui/#/lock/shared%2Freport")
        wait(browser, lambda d: rows(d, "table[aria-label=Holders] tr[data-key]"), 5, "the reader does not see the holder")
        assert not rows(browser, "main button.danger"), "a read-only user was offered actions"
        browser.get(f"http://{cluster.endpoints[1]}/ui/#/cluster")
        wait(browser, lambda d: len(rows(d, "tr[data-member]")) == 3, 5, "the reader does not see the members")
        assert not rows(browser, "main button.danger"), "a read-only user was offered to move the leader"
        shot(browser, "reader-cluster")
        browser.get(f"http://{cluster.endpoints[1]}/ui/#/leases")
        wait(browser, lambda d: "shared/report" in "".join(r.text for r in rows(d, "tr[data-lease]")), 5,
             "the reader does not see the holder's lease and its key")
        assert not rows(browser, "main button.danger"), "a read-only user was offered to revoke a lease"
        # A user with no roles sees that the lease exists, not what it holds.
        click(browser, "#who", "Sign out", "no sign-out button")
        sign_in(browser, "bob", "bobpw")
        browser.get(f"http://{cluster.endpoints[1]}/ui/#/leases")
        wait(browser, lambda d: "not yours to read" in "".join(r.text for r in rows(d, "tr[data-lease]")), 5,
             "a user with no roles was not told the lease's keys are not its to read")
        assert "shared/report" not in browser.find_element(By.TAG_NAME, "main").text
        assert not rows(browser, "main button.danger"), "a user with no roles was offered to revoke a lease"
        # root: every action.
        click(browser, "#who", "Sign out", "no sign-out button")
        sign_in(browser, "root", "rootpw")
        browser.get(f"http://{cluster.endpoints[1]}/ui/#/lock/shared%2Freport")
        wait(browser, lambda d: [b for b in rows(d, "main button.danger") if b.text == "Release"], 5,
             "root was not offered to release the grant")
        browser.get(f"http://{cluster.endpoints[1]}/ui/#/leases")
        wait(browser, lambda d: [b for b in rows(d, "tr[data-lease] button.danger") if b.text == "Revoke"], 5,
             "root was not offered to revoke the lease")
    finally:
        holder.kill()
        holder.wait()
