"""``blockx dashboard`` against a running cluster, in a real headless Chromium.

One module-scoped cluster (a real etcd, ``blockx-coordinator`` and ``blockx-worker``
with a task that succeeded, one that failed and one whose id and failure message
are HTML), two jobs' records in a sink database, the dashboard as a real
``blockx dashboard`` process reading both, and one Debian ``chromium`` started with the flags
root needs and a fresh profile, driven by Playwright over its debugging pipe. Each page
is loaded, what it shows is checked, and a screenshot of it is kept in
``test-artifacts/dashboard/`` (the ``artifacts`` fixture of tests/conftest.py).
Plain-HTTP tests check the JSON twins, the 405 for anything but GET and HEAD,
bounded parameters, loopback Host names, and a registered worker that does not
answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aetcd
import pytest
import pytest_asyncio
from grpclib.client import Channel
from grpclib.const import Status
from playwright.async_api import Browser, Page, async_playwright
from processes import EXAMPLES, CoordinatorProcess, WorkerProcess, call_list_task, run_to_end
from support import free_port, heartbeat, wait_until

from blockx_chain.sink import JobEntry, open_sink
from blockx_chain.url import parse_blockdb_url
from blockx_client import Client, list_workers
from blockx_core.heartbeat import encode_heartbeat
from blockx_drive.jobs import JobKind, JobProgress, JobRecorder, JobState, list_jobs
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer
from blockx_server.runtime.clock import SYSTEM_CLOCK

pytestmark = pytest.mark.asyncio(loop_scope="module")

PREFIX: Final = "/blockx/workers/"
# The dashboard reads this prefix too; no coordinator places on it.
DOWN_PREFIX: Final = "/blockx/bundle-workers/"
CHROMIUM: Final = shutil.which("chromium")
# Headless, as root, with nothing fetched in the background; Playwright adds only the
# profile and its pipe.
CHROMIUM_FLAGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)

# Every page must fit a laptop's browser window: no table wider than this.
VIEWPORT_WIDTH: Final = 1280
OK_ID: Final = "dash-ok"
# The longest ids real clients make are uuids with prefixes; this one is longer.
LONG_ID: Final = "dash-long-" + "0123456789abcdef" * 12
# Runs until the Worker stops: the executor it holds is busy on the Worker page.
SLOW_ID: Final = "dash-slow"
FAIL_ID: Final = "dash-fail"
HOSTILE_ID: Final = 'dash-<img id="injected-id" src="x">'
HOSTILE_MESSAGE: Final = '<b id="injected-msg">bold</b>'
# Refused by the coordinator while its only worker is a full one.
REFUSED_ID: Final = 'dash-refused-<i id="injected-refusal">'

FUNCTIONS: Final = """
def echo(x):
    return x


def boom(x):
    raise ValueError(f"boom {x}")


def sleepy(seconds):
    import time

    time.sleep(seconds)
    return seconds
"""


@dataclass
class Cluster:
    etcd: EtcdServer
    coordinator: CoordinatorProcess
    worker: WorkerProcess
    stub: worker_v1.WorkerServiceStub
    slots: int


@dataclass
class Dashboard:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def at(self, path: str) -> str:
        return self.url.rstrip("/") + path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    base = tmp_path_factory.mktemp("dashboard-cluster")
    functions = base / "functions"
    functions.mkdir()
    shutil.copy(EXAMPLES / "functions" / "hello.py", functions / "hello.py")
    (functions / "dashfns.py").write_text(FUNCTIONS)
    async with EtcdServer() as etcd:
        env = {"ETCD_ENDPOINTS": etcd.endpoint}
        coordinator = CoordinatorProcess(
            {**env, "COORDINATOR_REGISTRY_PREFIXES": PREFIX}, base / "coordinator.log"
        )
        # First a refusal to remember: the only worker registered is a full one.
        full = f"127.0.0.1:{free_port()}"
        etcd_client = aetcd.Client(etcd.host, etcd.port, timeout=5)
        full_hb = heartbeat(full, slots=2, used=2, at_ms=SYSTEM_CLOCK.now_ms())
        await etcd_client.put((PREFIX + full).encode(), encode_heartbeat(full_hb))
        try:
            await coordinator.wait_serving()

            async def refused() -> bool:
                return await coordinator.status_of(REFUSED_ID) == Status.RESOURCE_EXHAUSTED

            await wait_until(refused, "a reservation refused for the full worker", timeout=20)
        finally:
            await etcd_client.delete((PREFIX + full).encode())
            await etcd_client.close()
        worker = WorkerProcess(
            {
                **env,
                "WORKER_REGISTRY_PREFIX": PREFIX,
                "WORKER_HEARTBEAT_INTERVAL": "200",
                "FUNCTIONS_DIR": str(functions),
                # The slow call holds its executor until the Worker stops.
                "CALL_WALL_LIMIT_MS": "3600000",
                "DRAIN_TIMEOUT_MS": "200",
            },
            base / "worker.log",
        )
        channel: Channel | None = None
        try:
            await worker.wait_ready()
            channel = worker.channel()
            stub = worker_v1.WorkerServiceStub(channel)
            for task in (
                call_list_task(OK_ID, "echo", [[1], [2]]),
                call_list_task(FAIL_ID, "boom", [[HOSTILE_MESSAGE]]),
                call_list_task(HOSTILE_ID, "echo", [[3]]),
                call_list_task(LONG_ID, "echo", [[5]]),
            ):
                await run_to_end(stub, task)

            async def eligible() -> bool:
                async with Client(coordinator=f"127.0.0.1:{coordinator.port}") as client:
                    report = await client.explain_placement()
                return [w.worker_addr for w in report.eligible] == [worker.addr]

            await wait_until(eligible, "the worker eligible at the coordinator", timeout=30)
            [registered] = await list_workers([etcd.endpoint], [PREFIX])
            yield Cluster(etcd, coordinator, worker, stub, registered.heartbeat.task_slots)
        finally:
            if channel is not None:
                channel.close()
            coordinator.stop()
            worker.stop()


def start_dashboard(args: list[str], home: Path, log: Path) -> subprocess.Popen[bytes]:
    """``blockx ARGS`` as a child process, its output in ``log``."""
    blockx = shutil.which("blockx")
    assert blockx is not None, "blockx is not installed (uv sync)"
    with log.open("wb") as out:
        return subprocess.Popen(
            [blockx, *args],
            # No dev.toml of a developer's own `dev up` may be read.
            env={**os.environ, "XDG_CONFIG_HOME": str(home), "COLUMNS": "200"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@pytest.fixture(scope="module")
def sink_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The sink database whose job records the dashboard shows."""
    return f"sqlite:///{tmp_path_factory.mktemp('dashboard-sink')}/sink.db"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dashboard(
    cluster: Cluster, sink_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Dashboard]:
    base = tmp_path_factory.mktemp("dashboard")
    port = free_port()
    log = base / "dashboard.log"
    proc = start_dashboard(
        [
            "--etcd",
            cluster.etcd.endpoint,
            "--coordinator",
            f"127.0.0.1:{cluster.coordinator.port}",
            "dashboard",
            "--sink-db",
            sink_url,
            "--port",
            str(port),
            "--refresh",
            "1",
            "--timeout",
            "2",
        ],
        base,
        log,
    )
    found = Dashboard(f"http://127.0.0.1:{port}/", proc, log)

    def serving() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return get(found.at("/api/workers"))[0] == 200
        except OSError:
            return False

    try:
        await wait_until(serving, "the dashboard serving", timeout=20)
        yield found
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
        output = log.read_text()
        assert "Traceback" not in output, output
        # uvicorn stops gracefully, then re-raises the signal it caught.
        assert code in (0, -signal.SIGTERM), output


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def jobs(sink_url: str) -> AsyncIterator[tuple[JobProgress, JobProgress]]:
    """A backfill 40 blocks into 100, and a follow 4 blocks behind the head, running."""
    now = SYSTEM_CLOCK.now_ms()
    backfill = JobProgress(
        job_id="backfill-dash",
        kind=JobKind.BACKFILL,
        # The prefix of the tasks the cluster fixture ran, to find them by.
        task_prefix="dash-",
        state=JobState.RUNNING,
        started_ms=now - 60_000,
        updated_ms=now,
        function="token_volume",
        chain="base",
        chain_id=8453,
        from_block=1_000,
        to_block=1_099,
        blocks_total=100,
        blocks_done=40,
        rows_done=321,
        tasks_done=4,
        tasks_failed=1,
        retries=2,
        blocks_per_s=12.5,
        eta_s=4.8,
        # A hash in a message is one long word: the table must still fit.
        message="TIMED_OUT on blocks 1010-1019, retried; block hash 0x" + "ab" * 64,
    )
    follow = JobProgress(
        job_id="follow-dash",
        kind=JobKind.FOLLOW,
        state=JobState.RUNNING,
        started_ms=now - 120_000,
        updated_ms=now,
        function="per_block_token_volume_" + "x" * 100,
        sink_table="token_volume_by_block_" + "y" * 100,
        # A follow of the Workers' only chain: no name, the chain id it planned from.
        chain_id=31337,
        from_block=5_000,
        blocks_done=230,
        head=5_234,
        last_block=5_230,
        lag_ms=7_500,
    )
    sink = await open_sink(parse_blockdb_url(sink_url))
    try:
        async with JobRecorder(sink, backfill), JobRecorder(sink, follow):
            assert len(await list_jobs(parse_blockdb_url(sink_url))) == 2
            yield backfill, follow
    finally:
        await sink.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Browser]:
    if CHROMIUM is None:
        pytest.skip("chromium is not on PATH (scripts/setup.sh installs Debian's chromium)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    async with async_playwright() as playwright:
        # Never `playwright install`: Debian's chromium, with these flags only.
        started = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            ignore_default_args=True,
            args=[*CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe"],
        )
        try:
            yield started
        finally:
            await started.close()


@pytest_asyncio.fixture(loop_scope="module")
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": VIEWPORT_WIDTH, "height": 900})
    opened = await context.new_page()
    opened.set_default_timeout(10_000)
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    opened.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    yield opened
    await context.close()
    # No script error and no refused resource (a CSP violation is a console error).
    assert errors == []


def get(
    url: str, method: str = "GET", host: str | None = None
) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, method=method, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


async def get_json(url: str) -> Any:
    status, body, _ = await asyncio.to_thread(get, url)
    assert status == 200, body
    return json.loads(body)


def task_url(task_id: str) -> str:
    return "/task?id=" + urllib.parse.quote(task_id, safe="")


async def snap(page: Page, artifacts: Path, name: str) -> None:
    """Keep a screenshot of the page, which must fit the viewport's width."""
    widths = await page.evaluate(
        """() => ({
            page: document.documentElement.scrollWidth,
            tables: Array.from(document.querySelectorAll("table"),
                (t) => [t.id || t.className, Math.ceil(t.getBoundingClientRect().right)]),
        })"""
    )
    await page.screenshot(path=str(artifacts / f"{name}.png"), full_page=True)
    wide = [table for table, right in widths["tables"] if right > VIEWPORT_WIDTH]
    assert not wide, f"{name}: tables wider than {VIEWPORT_WIDTH} px: {widths['tables']}"
    assert widths["page"] <= VIEWPORT_WIDTH, f"{name}: the page is {widths['page']} px wide"


# ---- in the browser -------------------------------------------------------------------


async def test_workers_page(
    page: Page, dashboard: Dashboard, cluster: Cluster, artifacts: Path
) -> None:
    await page.goto(dashboard.at("/workers"))
    row = page.locator(f'#workers tr[data-worker="{cluster.worker.addr}"]')
    await row.wait_for()
    text = await row.inner_text()
    assert cluster.worker.addr in text
    assert "block" in text
    assert f"/{cluster.slots}" in text
    assert " ago" in text
    head = await page.locator("#workers thead").inner_text()
    assert "cpu %" in head
    assert "memory %" in head
    note = await page.locator("#code-epoch").inner_text()
    assert "each Worker's page shows it" in note
    await snap(page, artifacts, "workers")
    # Each worker links to its own page.
    await row.locator("a").click()
    await page.wait_for_url("**/worker?addr=**")
    assert await page.locator("#worker-addr").inner_text() == cluster.worker.addr


async def test_worker_page_shows_a_busy_executors_call(
    page: Page, dashboard: Dashboard, cluster: Cluster, artifacts: Path
) -> None:
    """A call that holds its executor for long is on the Worker page: which
    executor, which task and function, for how long, highlighted; the task among the
    running ones; the load over the last minutes; the failures."""
    await cluster.stub.submit_task(
        worker_v1.SubmitTaskRequest(task=call_list_task(SLOW_ID, "sleepy", [[3600]]))
    )
    async with Client(direct=True) as client:

        async def held_long() -> bool:
            described = await client.describe_worker(cluster.worker.addr)
            return any(
                e.running is not None
                and e.running.task_id == SLOW_ID
                and e.running.held_ms >= 1_000
                for e in described.executors
            )

        await wait_until(held_long, "the slow call holding its executor for a second", timeout=30)
    await page.goto(dashboard.at("/worker?addr=" + urllib.parse.quote(cluster.worker.addr)))
    summary = await page.locator("#worker-summary").inner_text()
    assert "blockx-worker (block cluster)" in summary
    assert int(await page.locator("#code-epoch").inner_text()) >= 1
    assert "1/2" in await page.locator("#stat-executors").inner_text()
    # The busy executor comes first, highlighted, with the call's function and task.
    busy = page.locator("#executors tbody tr").first
    assert (await busy.get_attribute("class") or "").split() == ["busy", "long"]
    text = await busy.inner_text()
    assert "sleepy" in text
    assert "(root #0)" in text
    assert await busy.locator("a.task-link").get_attribute("title") == SLOW_ID
    assert " s" in await busy.locator("td.held").inner_text()
    idle = page.locator("#executors tbody tr").nth(1)
    assert await idle.get_attribute("class") == "idle"
    running = await page.locator(f'#running tr[data-task-id="{SLOW_ID}"]').inner_text()
    assert "sleepy" in running
    assert "calls" in running  # its phase
    failure = await page.locator(f'#failures tr[data-task-id="{FAIL_ID}"]').inner_text()
    assert "CALL_FAILED" in failure
    # Three charts, a bar per interval, the interval in progress included.
    assert await page.locator("#load figure.chart").count() == 3
    assert await page.locator("#load rect.bar.current").count() == 3
    await snap(page, artifacts, "worker")
    # The running task's link leads to its own page.
    await page.click(f'#running tr[data-task-id="{SLOW_ID}"] a')
    await page.wait_for_url("**/task?id=**")
    assert await page.locator("#task-id").inner_text() == SLOW_ID


async def test_tasks_page_by_state(page: Page, dashboard: Dashboard, artifacts: Path) -> None:
    await page.goto(dashboard.at("/tasks"))
    ok = page.locator(f'#tasks tr[data-task-id="{OK_ID}"]')
    failed = page.locator(f'#tasks tr[data-task-id="{FAIL_ID}"]')
    ok_text = await ok.inner_text()
    assert "SUCCEEDED" in ok_text
    assert "2/2" in ok_text  # its two calls, as the Worker counted them
    assert await ok.locator('progress[max="2"][value="2"]').count() == 1
    failed_text = await failed.inner_text()
    assert "FAILED" in failed_text
    assert "CALL_FAILED" in failed_text
    assert await page.locator('b[data-count="SUCCEEDED"]').inner_text() == "3"
    # A long id is cut in the table, whole in its title and its link.
    long = page.locator(f'#tasks tr[data-task-id="{LONG_ID}"] a').first
    assert await long.get_attribute("title") == LONG_ID
    assert len(await long.inner_text()) < 50
    assert await page.locator('b[data-count="FAILED"]').inner_text() == "1"
    await snap(page, artifacts, "tasks")
    # Only the failed ones, by the state chip.
    await page.click("nav.states a.state-failed")
    await page.wait_for_url("**state=FAILED**")
    assert await page.locator("#tasks tbody tr").count() == 1
    await failed.wait_for()


async def test_search_finds_one_task(page: Page, dashboard: Dashboard, artifacts: Path) -> None:
    await page.goto(dashboard.at("/tasks"))
    await page.fill("#q", "ok")
    await page.press("#q", "Enter")
    await page.wait_for_url("**q=ok**")
    rows = page.locator("#tasks tbody tr")
    assert await rows.count() == 1
    assert await rows.first.get_attribute("data-task-id") == OK_ID
    await snap(page, artifacts, "tasks-search")


async def test_task_page_shows_the_failure(
    page: Page, dashboard: Dashboard, cluster: Cluster, artifacts: Path
) -> None:
    await page.goto(dashboard.at("/tasks"))
    await page.click(f'#tasks tr[data-task-id="{FAIL_ID}"] a')
    await page.wait_for_url("**/task?id=**")
    assert await page.locator("#task-id").inner_text() == FAIL_ID
    holder = page.locator(f'section.holder[data-worker="{cluster.worker.addr}"]')
    text = await holder.inner_text()
    assert "FAILED" in text
    assert "CALL_FAILED" in text
    # Every call failure: the function, its kind and the message the function raised.
    failure = await holder.locator("table.call-failures tbody tr").first.inner_text()
    assert "boom" in failure
    assert "USER_ERROR" in failure
    assert f"boom {HOSTILE_MESSAGE}" in failure
    assert "0/1" in text  # its one call failed
    phases = await holder.locator("ol.phases").inner_text()
    assert "reserved / first seen" in phases
    assert "FAILED" in phases
    await snap(page, artifacts, "task-failed")


async def test_hostile_id_and_message_are_text(
    page: Page, dashboard: Dashboard, artifacts: Path
) -> None:
    await page.goto(dashboard.at("/tasks"))
    await page.locator(f"text={HOSTILE_ID}").wait_for()
    assert await page.locator("#injected-id").count() == 0
    assert await page.locator("#injected-msg").count() == 0
    await page.goto(dashboard.at(task_url(FAIL_ID)))
    assert HOSTILE_MESSAGE in await page.locator("section.holder").inner_text()
    assert await page.locator("#injected-msg").count() == 0
    await page.goto(dashboard.at(task_url(HOSTILE_ID)))
    assert await page.locator("#task-id").inner_text() == HOSTILE_ID
    assert await page.locator("#injected-id").count() == 0
    await snap(page, artifacts, "task-hostile-id")


async def test_placement_page(
    page: Page, dashboard: Dashboard, cluster: Cluster, artifacts: Path
) -> None:
    await page.goto(dashboard.at("/placement"))
    row = page.locator(f'#placement tr[data-worker="{cluster.worker.addr}"]')
    assert await row.get_attribute("class") == "eligible"
    assert await row.locator(".verdict").inner_text() == "yes"
    summary = await page.locator(".summary").inner_text()
    assert "places tasks" in summary
    assert "1 of 1 worker(s) eligible" in summary
    # The last refusals, newest first, each with its per-worker explanation.
    refusal = page.locator("#refusals tbody tr").first
    assert await refusal.get_attribute("data-task-id") == REFUSED_ID
    text = await refusal.inner_text()
    assert REFUSED_ID in text
    assert "NoExecutableSlot" in text
    assert "full 2/2" in text
    assert await page.locator("#injected-refusal").count() == 0
    await snap(page, artifacts, "placement")
    # The bundle cluster's coordinator: none is configured for this dashboard.
    await page.click('nav.clusters a[data-cluster="bundle"]')
    await page.wait_for_url("**cluster=bundle**")
    missing = await page.locator("#not-configured").inner_text()
    assert "No bundle coordinator is configured" in missing
    assert "BLOCKX_BUNDLE_COORDINATOR" in missing


async def test_jobs_page(
    page: Page,
    dashboard: Dashboard,
    jobs: tuple[JobProgress, JobProgress],
    artifacts: Path,
) -> None:
    await page.goto(dashboard.at("/jobs"))
    backfill = await page.locator('#jobs tr[data-job-id="backfill-dash"]').inner_text()
    assert "backfill" in backfill
    assert "40/100 (40.0 %)" in backfill
    assert "1,000 → 1,099" in backfill
    assert "token_volume" in backfill
    assert "TIMED_OUT on blocks 1010-1019" in backfill
    # Each job's chain, and the chain id it planned from.
    backfill_chain = page.locator('#jobs tr[data-job-id="backfill-dash"] .chain')
    assert await backfill_chain.inner_text() == "base (8453)"
    follow_chain = page.locator('#jobs tr[data-job-id="follow-dash"] .chain')
    assert await follow_chain.inner_text() == "only chain (31337)"
    follow = await page.locator('#jobs tr[data-job-id="follow-dash"]').inner_text()
    assert "head (follow)" in follow
    assert "4 block(s) · 7.5 s" in follow
    await snap(page, artifacts, "jobs")
    # A job's tasks: those whose ids start with its task prefix.
    await page.click('#jobs tr[data-job-id="backfill-dash"] a.job-tasks')
    await page.wait_for_url("**/tasks?**")
    url = urllib.parse.urlsplit(page.url)
    assert urllib.parse.parse_qs(url.query)["q"] == ["dash-"]
    assert await page.locator(f'#tasks tr[data-task-id="{OK_ID}"]').count() == 1
    await snap(page, artifacts, "job-tasks")


def _record(**fields: Any) -> bytes:
    base = {"kind": "backfill", "state": "running", "started_ms": 1, "updated_ms": 1}
    return json.dumps({**base, **fields}).encode()


# Records anyone who can write the sink could put in its job table, each with the
# field its reason names (or what it says of the whole value).
BAD_JOB_RECORDS: Final = {
    "bad-eta": (_record(job_id="bad-eta", eta_s=1e308), "$.eta_s"),
    "bad-nan": (b'{"job_id": "bad-nan", "blocks_per_s": NaN}', "not JSON"),
    "bad-negative": (_record(job_id="bad-negative", blocks_done=-5), "$.blocks_done"),
    "bad-string": (_record(job_id="bad-string", rows_done="many"), "$.rows_done"),
    "bad-huge-text": (_record(job_id="bad-huge-text", message="x" * 100_000), "bytes"),
    "bad-long-text": (_record(job_id="bad-long-text", function="f" * 5_000), "$.function"),
    "bad-json": (b"{not json", "not JSON"),
    "bad-array": (b"[1, 2]", "Expected `object`, got `array`"),
    "bad-date": (_record(job_id="bad-date", updated_ms=10**17), "$.updated_ms"),
    "bad-name": (_record(job_id="another"), "its record names job 'another'"),
}


async def test_bad_job_records_are_rows_and_the_page_stays_up(
    page: Page,
    dashboard: Dashboard,
    sink_url: str,
    jobs: tuple[JobProgress, JobProgress],
    artifacts: Path,
) -> None:
    sink = await open_sink(parse_blockdb_url(sink_url))
    try:
        for name, (value, _) in BAD_JOB_RECORDS.items():
            entry = JobEntry(
                job_id=name,
                kind="backfill",
                state="running",
                function="",
                sink_table="",
                started_ms=1,
                updated_ms=1,
                ended_ms=None,
                record=value.decode(),
            )
            await sink.put_job(entry)
        status, body, _ = await asyncio.to_thread(get, dashboard.at("/jobs"))
        assert status == 200, body[-2000:]
        listed = await get_json(dashboard.at("/api/jobs"))
        assert {j["job_id"] for j in listed["jobs"]} == {"backfill-dash", "follow-dash"}
        bad = {b["key"]: b["error"] for b in listed["bad_records"]}
        assert sorted(bad) == sorted(BAD_JOB_RECORDS)
        for name, (_, reason) in BAD_JOB_RECORDS.items():
            assert reason in bad[name], (name, bad[name])
            assert len(bad[name]) <= 301
        # In the browser: one row per bad record, the jobs as before.
        await page.goto(dashboard.at("/jobs"))
        rows = page.locator("#jobs tr.bad-record")
        assert await rows.count() == len(BAD_JOB_RECORDS)
        eta = await page.locator('#jobs tr[data-key="bad-eta"]').inner_text()
        assert "bad record bad-eta" in eta
        assert "$.eta_s" in eta
        assert (
            "40/100 (40.0 %)"
            in await page.locator('#jobs tr[data-job-id="backfill-dash"]').inner_text()
        )
        summary = await page.locator(".summary").inner_text()
        assert f"{len(BAD_JOB_RECORDS)} bad record(s)" in summary
        await snap(page, artifacts, "jobs-bad-records")
    finally:
        async with sink.transaction() as tx:
            for name in BAD_JOB_RECORDS:
                await tx.execute("DELETE FROM _blockx_jobs WHERE job_id = ?", (name,))
        await sink.close()


async def test_pages_refresh_themselves(page: Page, dashboard: Dashboard, cluster: Cluster) -> None:
    await page.goto(dashboard.at("/tasks"))
    await page.locator(f'#tasks tr[data-task-id="{OK_ID}"]').wait_for()
    await run_to_end(cluster.stub, call_list_task("dash-late", "echo", [[4]]))
    # No reload: the page's script swaps in fresh data (every second here).
    await page.locator('#tasks tr[data-task-id="dash-late"]').wait_for()


# ---- plain HTTP ---------------------------------------------------------------------


async def test_json_twins(
    dashboard: Dashboard, cluster: Cluster, jobs: tuple[JobProgress, JobProgress]
) -> None:
    workers = await get_json(dashboard.at("/api/workers"))
    [worker] = [w for w in workers["workers"] if w["worker_addr"] == cluster.worker.addr]
    assert worker["task_slots"] == cluster.slots
    assert 0.0 <= worker["cpu_fraction"] <= 1.0
    tasks = await get_json(dashboard.at("/api/tasks?state=FAILED"))
    assert [t["task_id"] for t in tasks["tasks"]] == [FAIL_ID]
    assert tasks["counts"]["FAILED"] == 1
    assert tasks["problems"] == []
    # A time window of first sightings (a job's tasks link sets one).
    window = await get_json(dashboard.at("/api/tasks?function=echo&since=1"))
    assert OK_ID in {t["task_id"] for t in window["tasks"]}
    window = await get_json(dashboard.at("/api/tasks?since=1&until=2"))
    assert (window["tasks"], window["matching"]) == ([], 0)
    task = await get_json(dashboard.at("/api" + task_url(FAIL_ID)))
    [holder] = task["holders"]
    assert holder["failure_code"] == "CALL_FAILED"
    assert holder["call_failures"][0]["function"] == "boom"
    placement = await get_json(dashboard.at("/api/placement"))
    assert placement["view_trusted"] is True
    assert [w["worker_addr"] for w in placement["workers"] if w["eligible"]] == [
        cluster.worker.addr
    ]
    [last, *_] = placement["recent_refusals"]
    assert last["task_id"] == REFUSED_ID
    assert last["code"] == "NoExecutableSlot"
    assert [w["kind"] for w in last["workers"]] == ["full"]
    listed = await get_json(dashboard.at("/api/jobs"))
    by_id = {j["job_id"]: j for j in listed["jobs"]}
    assert by_id["backfill-dash"]["fraction_done"] == 0.4
    assert by_id["follow-dash"]["head_lag_blocks"] == 4
    assert (by_id["backfill-dash"]["chain"], by_id["backfill-dash"]["chain_id"]) == ("base", 8453)
    assert (by_id["follow-dash"]["chain"], by_id["follow-dash"]["chain_id"]) == ("", 31337)


async def test_read_only_and_bounded(dashboard: Dashboard) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, _, headers = await asyncio.to_thread(get, dashboard.at("/tasks"), method)
        assert status == 405, method
        assert headers["allow"] == "GET, HEAD"
    status, body, _ = await asyncio.to_thread(get, dashboard.at("/workers"), "HEAD")
    assert (status, body) == (200, b"")
    status, body, _ = await asyncio.to_thread(get, dashboard.at("/api/tasks?state=NOPE"))
    assert status == 400
    assert b"state must be one of" in body
    status, body, _ = await asyncio.to_thread(get, dashboard.at("/tasks?q=" + "x" * 201))
    assert status == 400
    status, body, _ = await asyncio.to_thread(get, dashboard.at("/api/task"))
    assert status == 400
    status, body, _ = await asyncio.to_thread(get, dashboard.at("/api/tasks?since=5&until=4"))
    assert status == 400
    assert b"since is after until" in body
    status, body, _ = await asyncio.to_thread(get, dashboard.at("/api/tasks?since=-1"))
    assert status == 400
    status, body, _ = await asyncio.to_thread(get, dashboard.at("/api/worker"))
    assert status == 400
    assert b"addr" in body
    # An address no worker registered is not dialled: the page says so.
    nobody = await get_json(dashboard.at("/api/worker?addr=10.255.255.1:1"))
    assert nobody["answered"] is False
    assert "not registered" in nobody["problems"][0]["error"]
    status, body, _ = await asyncio.to_thread(get, dashboard.at("/placement?cluster=nope"))
    assert status == 400
    assert b"cluster must be block or bundle" in body
    status, _, headers = await asyncio.to_thread(get, dashboard.at("/workers"))
    assert "script-src 'self'" in headers["content-security-policy"]
    status, body, _ = await asyncio.to_thread(get, dashboard.at("/api/task?id=nobody-has-it"))
    assert json.loads(body)["holders"] == []


async def test_only_loopback_names_on_loopback(dashboard: Dashboard) -> None:
    """A page on another domain re-pointed at 127.0.0.1 (DNS rebinding) reads nothing."""
    port = urllib.parse.urlsplit(dashboard.url).port
    for host, expected in [
        ("rebind.example", 400),
        (f"rebind.example:{port}", 400),
        (f"localhost:{port}", 200),
        (f"[::1]:{port}", 200),
        (f"127.0.0.1:{port}", 200),
    ]:
        status, _, _ = await asyncio.to_thread(get, dashboard.at("/api/workers"), "GET", host)
        assert status == expected, host


async def test_a_worker_that_does_not_answer(dashboard: Dashboard, cluster: Cluster) -> None:
    """A heartbeat for a port nobody listens on: the pages say that worker did not
    answer and still show what the live one holds."""
    gone = f"127.0.0.1:{free_port()}"
    client = aetcd.Client(cluster.etcd.host, cluster.etcd.port, timeout=5)
    key = (DOWN_PREFIX + gone).encode()
    try:
        hb = heartbeat(gone, slots=4, at_ms=SYSTEM_CLOCK.now_ms())
        await client.put(key, encode_heartbeat(hb))
        tasks = await get_json(dashboard.at("/api/tasks"))
        assert [p["source"] for p in tasks["problems"]] == [f"worker {gone}"]
        assert OK_ID in {t["task_id"] for t in tasks["tasks"]}
        status, body, _ = await asyncio.to_thread(get, dashboard.at("/tasks"))
        assert status == 200
        assert f"<strong>worker {gone}</strong> did not answer" in body.decode()
        task = await get_json(dashboard.at("/api" + task_url(OK_ID)))
        assert [h["state"] for h in task["holders"]] == ["SUCCEEDED"]
        assert [p["source"] for p in task["problems"]] == [f"worker {gone}"]
        workers = await get_json(dashboard.at("/api/workers"))
        assert gone in {w["worker_addr"] for w in workers["workers"]}
    finally:
        await client.delete(key)
        await client.close()
