"""The X capture, end to end: real Playwright on Chromium against a loopback
server that plays the X bookmarks page (tests/fake_x.py)."""

from __future__ import annotations

import json
import time

import dagster as dg
import pytest

from kb_assets.x.raw_pages import x_raw_pages
from kb.x.capture_traffic import rate_limit_wait
from kb_assets.partitions import sync_batches
from kb.x.browser import Browser, NotAnXPage, XLoginMissing
from kb.x.raw_store import RawStore
from kb.settings import get_settings
from tests.fake_x import FakeX, OtherSite
from tests.x_fixtures import all_tweet_entries
from kb_resources.services import BrowserResource
from kb_resources.stores import RawStoreResource

pytestmark = [
    pytest.mark.browser,
    # With one Chromium kept open, Playwright's event loop runs in this thread
    # when Dagster closes its own loop at the end of a run; Dagster expects
    # that and ignores the RuntimeError, but Python warns about the coroutine.
    pytest.mark.filterwarnings("ignore:coroutine 'BaseEventLoop.shutdown_asyncgens' was never awaited"),
    pytest.mark.slow,  # slow: a browser
]

SECRET = "TEST-SECRET-auth-token-0123456789"


@pytest.fixture(scope="session")
def x_server():
    server = FakeX("127.0.0.1")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def other_server():
    server = OtherSite("localhost")
    yield server
    server.stop()


@pytest.fixture(scope="module", autouse=True)
def one_chromium():
    """One Chromium for the whole module; every test still gets new contexts."""
    with Browser.from_settings().kept_open():
        yield


@pytest.fixture(scope="session")
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


@pytest.fixture
def fake_x(x_server, other_server, monkeypatch):
    """The fake X with a fresh state, KB_X_BASE_URL pointing at it, and a
    saved login whose session cookie belongs to the fake X host."""
    x_server.reset()
    other_server.seen.clear()
    monkeypatch.setenv("KB_X_BASE_URL", x_server.url)
    monkeypatch.setenv("KB_CHROMIUM_PATH", "/usr/bin/chromium")
    monkeypatch.setenv("KB_CAPTURE_SCROLL_WAIT_S", "0.5")
    monkeypatch.setenv("KB_CAPTURE_MAX_IDLE_SCROLLS", "3")
    monkeypatch.setenv("KB_BROWSER_TIMEOUT_S", "10")
    state = {"cookies": [{"name": "auth_token", "value": SECRET, "domain": "127.0.0.1", "path": "/",
                          "expires": -1, "httpOnly": True, "secure": False, "sameSite": "Lax"}],
             "origins": []}
    get_settings().x_state_path.write_text(json.dumps(state))
    return x_server


@pytest.fixture(scope="session")
def entries():
    return all_tweet_entries()


def capture(instance, batch: str, **config) -> dg.ExecuteInProcessResult:
    instance.add_dynamic_partitions(sync_batches.name, [batch])
    return dg.materialize(
        [x_raw_pages],
        partition_key=batch,
        instance=instance,
        resources={"browser": BrowserResource.from_settings(), "raw_store": RawStoreResource.from_settings()},
        run_config={"ops": {"x_raw_pages": {"config": config}}},
        raise_on_error=False,
    )


def kept_pages(batch: str) -> list[bytes]:
    return [p.read_bytes() for p in RawStore.from_settings().pages(batch)]


def metadata(result: dg.ExecuteInProcessResult) -> dict:
    [materialization] = result.asset_materializations_for_node("x_raw_pages")
    return {k: v.value for k, v in materialization.metadata.items()}


def failure_message(result: dg.ExecuteInProcessResult) -> str:
    [event] = [e for e in result.all_events if e.is_step_failure]
    return event.step_failure_data.error.message


def test_capture_keeps_every_bookmarks_page_as_it_came(fake_x, instance, entries):
    served = fake_x.serve_entries(entries)
    assert len(served) == 7  # 117 tweets: six pages of up to 20, then the empty end page

    result = capture(instance, "b-all")

    assert result.success
    assert kept_pages("b-all") == served
    meta = metadata(result)
    assert (meta["pages"], meta["tweets"], meta["complete"]) == (7, 117, True)
    # The page also called UserByScreenName; the capture did not keep it.
    assert any("/UserByScreenName" in s.path for s in fake_x.state.seen)
    manifest = RawStore.from_settings().manifest("b-all")
    assert manifest.complete and manifest.error is None and manifest.mode == "browser"
    assert manifest.pages == [f"page-{n:04d}.json" for n in range(1, 8)]
    first = entries[0]["entryId"].removeprefix("tweet-")
    assert RawStore.from_settings().watermark() == {"tweet_id": first, "sort_index": entries[0]["sortIndex"], "batch": "b-all"}
    # The X context sent the saved login to X.
    assert all(SECRET in c for c in fake_x.cookies_on("/i/api/graphql/"))


def test_incremental_capture_stops_one_page_after_the_watermark(fake_x, instance, entries):
    fake_x.serve_entries(entries[30:])
    assert capture(instance, "b-first").success
    assert RawStore.from_settings().watermark()["tweet_id"] == entries[30]["entryId"].removeprefix("tweet-")

    # 30 new bookmarks arrive on top. The old newest (entry 30) is on page 2.
    served = fake_x.serve_entries(entries)
    fake_x.state.served_pages.clear()
    result = capture(instance, "b-next")

    assert result.success
    assert kept_pages("b-next") == served[:3]
    assert fake_x.state.served_pages == [0, 1, 2]
    meta = metadata(result)
    assert meta["met_watermark"] is True and meta["complete"] is True and meta["tweets"] == 60
    assert RawStore.from_settings().watermark()["tweet_id"] == entries[0]["entryId"].removeprefix("tweet-")
    assert RawStore.from_settings().watermark()["batch"] == "b-next"


def test_full_capture_ignores_the_watermark(fake_x, instance, entries):
    served = fake_x.serve_entries(entries)
    RawStore.from_settings().move_watermark(entries[0]["entryId"].removeprefix("tweet-"), entries[0]["sortIndex"], "old")

    result = capture(instance, "b-full", full=True)

    assert result.success
    assert kept_pages("b-full") == served
    assert RawStore.from_settings().manifest("b-full").full is True


def test_a_new_query_id_changes_nothing(fake_x, instance, entries):
    served = fake_x.serve_entries(entries[:45])
    fake_x.state.query_id = "NEWdeployQueryId42"

    result = capture(instance, "b-newid")

    assert result.success
    assert kept_pages("b-newid") == served
    assert any("/NEWdeployQueryId42/Bookmarks" in s.path for s in fake_x.state.seen)


def test_x_asking_the_top_again_does_not_end_the_capture(fake_x, instance, entries):
    served = fake_x.serve_entries(entries[:45])
    fake_x.state.refresh_top = True

    result = capture(instance, "b-refresh")

    assert result.success
    kept = kept_pages("b-refresh")
    # The empty top refresh is kept as it came, and the capture still went to the end.
    assert [p for p in kept if p in served] == served
    assert len(kept) == len(served) + 1
    assert metadata(result)["tweets"] == 45


@pytest.mark.parametrize("fail_mode", ["500", "close"])
def test_a_capture_cut_off_keeps_its_pages_and_not_the_watermark(fake_x, instance, entries, fail_mode):
    served = fake_x.serve_entries(entries)
    RawStore.from_settings().move_watermark("1", "1", "old")
    fake_x.state.fail_after, fake_x.state.fail_mode = 2, fail_mode

    result = capture(instance, f"b-cut-{fail_mode}")

    assert not result.success
    assert kept_pages(f"b-cut-{fail_mode}") == served[:2]
    manifest = RawStore.from_settings().manifest(f"b-cut-{fail_mode}")
    assert manifest.complete is False and manifest.pages == ["page-0001.json", "page-0002.json"]
    assert RawStore.from_settings().watermark() == {"tweet_id": "1", "sort_index": "1", "batch": "old"}
    message = failure_message(result)
    assert "cut off after 2 pages" in message and "watermark did not move" in message
    assert ("HTTP 500" if fail_mode == "500" else "failed") in message

    # A retry of the same batch sets the first attempt aside (kept, not mixed in).
    fake_x.state.fail_after = None
    assert capture(instance, f"b-cut-{fail_mode}").success
    assert kept_pages(f"b-cut-{fail_mode}") == served
    [aside] = (RawStore.from_settings().x_dir() / ".superseded").glob(f"b-cut-{fail_mode}-*")
    assert [p.read_bytes() for p in sorted(aside.glob("page-*.json"))] == served[:2]


def test_a_rate_limit_waits_as_x_says_and_goes_on_from_the_last_kept_page(fake_x, instance, entries):
    served = fake_x.serve_entries(entries)
    # Page 3 meets one 429 with retry-after 0: no real wait in a test.
    fake_x.state.limit_after, fake_x.state.limit_count = 2, 1
    fake_x.state.limit_headers = {"retry-after": "0"}

    result = capture(instance, "b-limit")

    assert result.success, failure_message(result)
    assert fake_x.state.limited == [2]
    # The page opened again and asked for page 3 (the last kept cursor), not the top.
    assert fake_x.state.served_pages == list(range(len(served)))
    assert kept_pages("b-limit") == served
    meta = metadata(result)
    assert (meta["complete"], meta["rate_limit_waits"], meta["tweets"]) == (True, 1, 117)
    assert RawStore.from_settings().watermark()["batch"] == "b-limit"


def test_a_long_rate_limit_ends_the_run_and_the_next_sync_goes_on(fake_x, instance, entries, monkeypatch):
    monkeypatch.setenv("KB_CAPTURE_MAX_WAIT_S", "60")
    served = fake_x.serve_entries(entries)
    fake_x.state.limit_after, fake_x.state.limit_count = 2, 1
    fake_x.state.limit_headers = {"x-rate-limit-reset": str(int(time.time()) + 900)}

    first = capture(instance, "b-chain-1")

    assert not first.success
    message = failure_message(first)
    assert "HTTP 429" in message and "goes on from the last kept page" in message
    assert kept_pages("b-chain-1") == served[:2]
    store = RawStore.from_settings()
    assert store.manifest("b-chain-1").resume_cursor == "page-2"
    assert store.watermark() is None

    # The next sync starts at the kept cursor, reaches the end, and completes the chain.
    fake_x.state.served_pages.clear()
    second = capture(instance, "b-chain-2")

    assert second.success, failure_message(second)
    assert fake_x.state.served_pages == list(range(2, len(served)))
    assert kept_pages("b-chain-2") == served[2:]
    manifest = store.manifest("b-chain-2")
    assert manifest.complete and manifest.resumed_from == "b-chain-1" and manifest.resume_cursor is None
    # The watermark is the newest bookmark of the chain: the first batch's top.
    first_id = entries[0]["entryId"].removeprefix("tweet-")
    assert store.watermark() == {"tweet_id": first_id, "sort_index": entries[0]["sortIndex"], "batch": "b-chain-2"}
    # A complete chain: the sync after it starts at the top again.
    assert store.resume_point(full=False) is None


def test_the_wait_after_a_429_follows_the_answer():
    now = 1_700_000_000.0
    assert rate_limit_wait({"retry-after": "7"}, 15, now) == 7
    assert rate_limit_wait({"retry-after": "Tue, 14 Nov 2023 22:14:20 GMT"}, 15, now) == 60
    assert rate_limit_wait({"x-rate-limit-reset": str(int(now) + 42)}, 15, now) == 42
    assert rate_limit_wait({"x-rate-limit-reset": str(int(now) - 5)}, 15, now) == 0
    assert rate_limit_wait({"retry-after": "soon"}, 15, now) == 15


def test_max_pages_keeps_a_partial_capture_that_is_not_complete(fake_x, instance, entries):
    served = fake_x.serve_entries(entries)

    result = capture(instance, "b-max", max_pages=2)

    assert result.success
    assert kept_pages("b-max") == served[:2]
    assert metadata(result)["complete"] is False
    assert RawStore.from_settings().manifest("b-max").complete is False
    assert RawStore.from_settings().watermark() is None


def test_a_stalled_client_is_a_cut_off_not_the_end(fake_x, instance, entries):
    served = fake_x.serve_entries(entries)
    fake_x.state.stop_after = 2  # the client stops asking; the last page still has a cursor

    result = capture(instance, "b-stall")

    assert not result.success
    assert "bottom cursor" in failure_message(result)
    assert kept_pages("b-stall") == served[:2]
    assert RawStore.from_settings().watermark() is None


def test_no_answer_within_the_timeout_is_a_cut_off(fake_x, instance, entries, monkeypatch):
    monkeypatch.setenv("KB_BROWSER_TIMEOUT_S", "1.5")
    served = fake_x.serve_entries(entries)
    fake_x.state.fail_after, fake_x.state.fail_mode, fake_x.state.hang_s = 1, "hang", 4

    result = capture(instance, "b-hang")

    assert not result.success
    assert "did not answer Bookmarks page 2 within 1.5 s" in failure_message(result)
    assert kept_pages("b-hang") == served[:1]


def test_missing_login_fails_with_kb_login_hint(fake_x, instance):
    get_settings().x_state_path.unlink()

    result = capture(instance, "b-nologin")

    assert not result.success
    assert "Run `kb login`" in failure_message(result)
    assert RawStore.from_settings().manifest("b-nologin").complete is False
    with pytest.raises(XLoginMissing, match="kb login"):
        with Browser.from_settings().x_context():
            pass


def test_files_mode_imports_pages_byte_for_byte(fake_x, instance, entries, tmp_path):
    pages = fake_x.serve_entries(entries[:30])  # 2 pages + end page; no browser runs
    files = []
    for n, body in enumerate([pages[0], pages[1], b"<html>not json</html>"]):
        path = tmp_path / f"saved-{n}.json"
        path.write_bytes(body)
        files.append(str(path))

    result = capture(instance, "b-import", files=files)

    assert result.success
    assert kept_pages("b-import") == [pages[0], pages[1], b"<html>not json</html>"]
    meta = metadata(result)
    assert (meta["pages"], meta["tweets"], meta["bad_pages"]) == (3, 30, 1)
    assert RawStore.from_settings().manifest("b-import").mode == "files"
    assert RawStore.from_settings().watermark() is None  # an import never moves the watermark
    assert not fake_x.state.seen  # no browser

    result = capture(instance, "b-import-missing", files=[files[0], str(tmp_path / "absent.json")])
    assert not result.success
    assert "absent.json" in failure_message(result)
    assert kept_pages("b-import-missing") == []


# --- the two contexts ------------------------------------------------------------------


def test_clean_context_sends_no_x_cookies(fake_x, other_server, entries, loopback_fetches):
    fake_x.serve_entries(entries[:5])
    browser = Browser.from_settings()
    with browser.clean_context() as context:
        page = context.new_page()
        page.goto(other_server.url + "/article")
        page.goto(fake_x.url + "/i/bookmarks")
    assert "/article" in [s.path for s in other_server.seen]
    assert all(SECRET not in s.cookie for s in other_server.seen)
    # Not even X itself gets the login from the clean context.
    assert all(SECRET not in c for c in fake_x.cookies_on("/i/"))

    fake_x.state.seen.clear()
    with browser.x_context() as x:
        x.open("/i/bookmarks")
    assert SECRET in fake_x.cookies_on("/i/bookmarks")[0]  # the control: the X context does send it


def test_x_context_refuses_pages_that_are_not_x(fake_x, other_server, entries):
    fake_x.serve_entries(entries[:5])
    with Browser.from_settings().x_context() as x:
        with pytest.raises(NotAnXPage, match="localhost"):
            x.open(other_server.url + "/")
        assert other_server.seen == []

        # A script on an X page that navigates away is stopped by the route.
        page = x.open("/i/bookmarks")
        page.evaluate(f"location.href = {json.dumps(other_server.url + '/from-script')}")
        for _ in range(50):  # Playwright runs the route handler while the test waits in it
            if x.violations:
                break
            page.wait_for_timeout(100)
        assert other_server.seen == []
        with pytest.raises(NotAnXPage):
            x.raise_if_left_x()

    # A redirect is not seen by routes; the landing check stops it.
    with Browser.from_settings().x_context() as x:
        with pytest.raises(NotAnXPage, match="landed on localhost"):
            x.open(f"/leave?{other_server.url}/landing")
        assert [p.url for p in x.context.pages] == []  # the page that left X is closed
        x.open("/i/bookmarks")  # the next X page opens as usual


def test_readiness_names_what_is_missing_and_never_shows_the_login(fake_x):
    ok, detail = Browser.from_settings().readiness()
    assert ok and "/usr/bin/chromium" in detail and SECRET not in detail

    get_settings().x_state_path.unlink()
    ok, detail = Browser.from_settings().readiness()
    assert not ok and "kb login" in detail


def test_readiness_names_a_chromium_that_is_not_there(fake_x, monkeypatch, tmp_path):
    monkeypatch.setenv("KB_CHROMIUM_PATH", str(tmp_path / "no-chromium"))
    ok, detail = Browser.from_settings().readiness()
    assert not ok and "no-chromium" in detail and "not executable" in detail


# --- folders and threads, after the bookmarks -----------------------------------------

FOCAL = "1649191520250245121"  # @XDevelopers' first post; the real TweetDetail capture holds its thread


def folder_files(batch: str) -> dict[str, bytes]:
    folder = RawStore.from_settings().batch_dir(batch)
    return {p.name: p.read_bytes() for p in sorted(folder.glob("folder*.json"))}


@pytest.fixture
def with_thread(fake_x, entries):
    """The bookmarks with @XDevelopers' post first, and its real TweetDetail answer."""
    from tests.shared_data import x_fixture

    focal = next(e for e in entries if e["entryId"] == f"tweet-{FOCAL}")
    served = [focal] + [e for e in entries if e is not focal][:39]
    fake_x.serve_entries(served)
    detail = x_fixture("raw_tweet_details.json").read_bytes()
    fake_x.state.tweet_details = {FOCAL: detail}
    return served, detail


def test_capture_reads_each_folder_to_its_end_and_a_thread_once(fake_x, instance, with_thread):
    served, detail = with_thread
    fake_x.serve_folders({"1794418757911433313": ("Reading", served[1:26]),  # two pages, then the end
                          "1794004218426319192": ("GitHub", served[30:32])}, page_size=20)

    result = capture(instance, "b-folders")

    assert result.success, failure_message(result)
    files = folder_files("b-folders")
    listed = json.loads(files.pop("folders-0001.json"))
    assert [i["name"] for i in listed["data"]["viewer"]["user_results"]["result"]["bookmark_collections_slice"]["items"]] \
        == ["Reading", "GitHub"]
    # Every page of each folder, as it came, named by the folder's id.
    assert files == {f"folder-1794418757911433313-{n:04d}.json": page for n, page in
                     enumerate(fake_x.state.folder_pages["1794418757911433313"], start=1)} | \
                    {f"folder-1794004218426319192-{n:04d}.json": page for n, page in
                     enumerate(fake_x.state.folder_pages["1794004218426319192"], start=1)}
    store = RawStore.from_settings()
    manifest = store.manifest("b-folders")
    assert manifest.complete and sorted(manifest.folders_done) == sorted(manifest.folders) == \
        ["1794004218426319192", "1794418757911433313"]
    # The thread of the newest post with replies, kept as X answered it.
    assert (store.batch_dir("b-folders") / f"thread-{FOCAL}.json").read_bytes() == detail
    assert manifest.threads == [FOCAL] and fake_x.state.asked_details[0] == FOCAL
    meta = metadata(result)
    assert (meta["folders"], meta["folders_read"], meta["threads_read"]) == (2, 2, 1)

    # The next sync reads the folders again (a change of folder shows), the thread not.
    fake_x.state.asked_details.clear()
    fake_x.state.served_folder_pages.clear()
    again = capture(instance, "b-folders-2")
    assert again.success, failure_message(again)
    assert FOCAL not in fake_x.state.asked_details
    assert {folder for folder, _ in fake_x.state.served_folder_pages} == {"1794418757911433313", "1794004218426319192"}


def test_a_rate_limit_on_a_folder_waits_and_goes_on(fake_x, instance, with_thread):
    served, _ = with_thread
    fake_x.serve_folders({"77": ("Reading", served[1:26])}, page_size=20)
    fake_x.state.folder_limit_count = 1
    fake_x.state.limit_headers = {"retry-after": "0"}

    result = capture(instance, "b-folder-limit")

    assert result.success, failure_message(result)
    assert RawStore.from_settings().manifest("b-folder-limit").folders_done == ["77"]
    assert sorted(folder_files("b-folder-limit")) == ["folder-77-0001.json", "folder-77-0002.json",
                                                      "folder-77-0003.json", "folders-0001.json"]
    assert metadata(result)["rate_limit_waits"] == 1


def test_a_long_limit_on_folders_and_threads_keeps_the_batch_complete(fake_x, instance, with_thread, monkeypatch):
    monkeypatch.setenv("KB_CAPTURE_MAX_WAIT_S", "60")
    served, _ = with_thread
    fake_x.serve_folders({"77": ("Reading", served[1:5])})
    fake_x.state.folder_limit_count = fake_x.state.detail_limit_count = 1
    fake_x.state.limit_headers = {"x-rate-limit-reset": str(int(time.time()) + 900)}

    result = capture(instance, "b-folder-cut")

    assert result.success, failure_message(result)
    store = RawStore.from_settings()
    manifest = store.manifest("b-folder-cut")
    assert manifest.complete and manifest.folders == ["77"] and manifest.folders_done == []
    assert manifest.threads == [] and store.watermark()["batch"] == "b-folder-cut"
    meta = metadata(result)
    assert "KB_CAPTURE_MAX_WAIT_S" in meta["folder_notes"][0] and "reads it first" in meta["folder_notes"][0]
    assert "KB_CAPTURE_MAX_WAIT_S" in meta["thread_notes"][0]


def test_kb_capture_captures_only_and_the_next_sync_indexes_what_it_stored(fake_x, entries, monkeypatch, capsys):
    """`kb capture` (issue 48): the new bookmarks and their tables, no other
    stage. The next sync finds them, as all the work that waits."""
    from kb.index.client import ChunkIndex
    from kb.sample_data import sample_pages
    from tests.test_sync import duck, instance as kb_instance, kb

    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")
    monkeypatch.setenv("KB_CAPTURE_FOLDERS", "0")
    monkeypatch.setenv("KB_CAPTURE_THREADS", "0")
    fake_x.serve_entries(entries[:25])
    assert kb("capture") == 0
    assert "Capture: all stages finished." in capsys.readouterr().out
    assert [run.job_name for run in kb_instance().get_runs()] == ["capture_job"]
    assert duck("SELECT count(*) FROM bookmarks") == [(25,)]
    assert duck("SELECT count(*) FROM chunks") == [(0,)] and not ChunkIndex.from_settings().exists()

    # The next sync (here an import of other bookmarks) indexes them too.
    assert kb("import", "--no-link", str(sample_pages()[0])) == 0
    [(total,)] = duck("SELECT count(*) FROM bookmarks")
    assert total > 25 and ChunkIndex.from_settings().counts()["bookmarks"] == total
